"""The CPU's flags and the precisions chosen from them."""

from __future__ import annotations

from pathlib import Path

from flywheel.hardware import cpu_flags, cpu_has_bf16, cpu_serving_dtype

EPYC_AVX2 = "fpu vme sse sse2 ssse3 fma avx avx2 bmi2"
XEON_BF16 = f"{EPYC_AVX2} avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16"


def test_flags_are_read_from_the_first_flags_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {EPYC_AVX2}\n\n"
        f"processor\t: 1\nflags\t\t: {XEON_BF16}\n",
        encoding="utf-8",
    )
    assert cpu_flags(cpuinfo) == frozenset(EPYC_AVX2.split())
    assert cpu_flags(tmp_path / "absent") == frozenset()
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n", encoding="utf-8")
    assert "asimd" in cpu_flags(arm)


def test_bf16_needs_native_instructions() -> None:
    assert cpu_has_bf16(XEON_BF16.split())
    assert cpu_has_bf16(["amx_bf16"])
    assert not cpu_has_bf16(EPYC_AVX2.split())
    assert not cpu_has_bf16([])


def test_vllm_serves_float32_on_an_x86_cpu_without_avx512() -> None:
    assert cpu_serving_dtype(EPYC_AVX2.split(), machine="x86_64") == "float32"
    assert cpu_serving_dtype(XEON_BF16.split(), machine="x86_64") == "auto"
    # AVX-512 without its bfloat16 extension is what vLLM's CPU kernels were written for.
    assert cpu_serving_dtype([*EPYC_AVX2.split(), "avx512f"], machine="x86_64") == "auto"
    assert cpu_serving_dtype(["fp", "asimd"], machine="aarch64") == "auto"
    # Flags it cannot read change nothing.
    assert cpu_serving_dtype([], machine="x86_64") == "auto"
