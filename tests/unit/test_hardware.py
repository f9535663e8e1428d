"""The CPU's flags, the device's abilities, and the choices made from them: the precision a
model trains and is scored in, gradient checkpointing, 4-bit quantization, vLLM's CPU dtype.

A GPU is stated as an :class:`Accelerator` value; torch is never patched."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.errors import UsageError
from flywheel.hardware import (
    Accelerator,
    NumberFormat,
    bitsandbytes_installed,
    bitsandbytes_usable,
    cpu_flags,
    cpu_has_bf16,
    cpu_serving_dtype,
    cpu_threads_bind,
    detect_accelerator,
    number_format,
    quantization_refusal,
    uses_gradient_checkpointing,
)

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


def test_vllm_serves_float32_on_an_x86_cpu_without_native_bfloat16() -> None:
    assert cpu_serving_dtype(EPYC_AVX2.split(), machine="x86_64") == "float32"
    assert cpu_serving_dtype(XEON_BF16.split(), machine="x86_64") == "auto"
    # AVX-512 without its bfloat16 extension emulates bfloat16 too (1.5x slower, measured).
    assert cpu_serving_dtype([*EPYC_AVX2.split(), "avx512f"], machine="x86_64") == "float32"
    assert cpu_serving_dtype([*EPYC_AVX2.split(), "amx_bf16"], machine="x86_64") == "auto"
    assert cpu_serving_dtype(["fp", "asimd"], machine="aarch64") == "auto"
    # Flags it cannot read change nothing.
    assert cpu_serving_dtype([], machine="x86_64") == "auto"


def test_a_small_machine_binds_the_model_threads_to_every_cpu() -> None:
    assert cpu_threads_bind({0, 1}) == "0,1"
    assert cpu_threads_bind({5, 3, 4}) == "3,4,5"
    assert cpu_threads_bind(set(range(4))) is None, "vLLM's reserved core is a quarter here"
    assert cpu_threads_bind(set()) is None


CPU = Accelerator()
CPU_BF16 = Accelerator(bf16=True)
H200 = Accelerator(device="cuda", bf16=True, bitsandbytes=True, name="NVIDIA H200")
T4 = Accelerator(device="cuda:1", bf16=False, bitsandbytes=True, name="Tesla T4")
H200_WITHOUT_BNB = Accelerator(device="cuda", bf16=True, name="NVIDIA H200")


def test_a_gpu_is_cuda_or_cuda_n() -> None:
    assert H200.is_cuda
    assert T4.is_cuda
    assert not CPU.is_cuda
    assert not Accelerator(device="mps").is_cuda


def test_auto_precision_is_bfloat16_on_a_gpu_that_has_it_and_float16_on_one_without() -> None:
    assert number_format("auto", H200) == NumberFormat("bfloat16", "bf16")
    assert number_format("auto", T4) == NumberFormat("float16", "fp16")
    assert number_format("bf16", T4) == NumberFormat("bfloat16", "bf16")
    assert number_format("fp32", H200) == NumberFormat("float32", "none")
    assert not number_format("auto", H200).autocast_bf16


def test_the_cpu_keeps_float32_weights_and_autocasts_only_where_bfloat16_is_native() -> None:
    assert number_format("auto", CPU) == NumberFormat("float32", "none")
    assert number_format("auto", CPU_BF16) == NumberFormat("float32", "bf16")
    assert number_format("auto", CPU_BF16).autocast_bf16
    assert number_format("bf16", CPU) == NumberFormat("float32", "bf16")
    assert number_format("fp32", CPU_BF16) == NumberFormat("float32", "none")


def test_gradient_checkpointing_auto_is_on_and_a_recipe_can_force_it() -> None:
    assert uses_gradient_checkpointing("auto", H200)
    # On the CPU too: trl's trainers have always checkpointed here; a CPU training is unchanged.
    assert uses_gradient_checkpointing("auto", CPU)
    assert not uses_gradient_checkpointing(False, H200)
    assert uses_gradient_checkpointing(True, CPU)


def test_4bit_needs_cuda_and_bitsandbytes_and_says_which_is_missing() -> None:
    assert quantization_refusal("none", CPU) is None
    assert quantization_refusal("4bit", H200) is None
    on_cpu = quantization_refusal("4bit", CPU)
    assert on_cpu is not None
    assert on_cpu.startswith("quantization: 4bit")
    assert "CUDA GPU (training here runs on cpu)" in on_cpu
    assert "bitsandbytes >= 0.46.1" in on_cpu
    assert "flywheel[gpu]" in on_cpu
    without_bnb = quantization_refusal("4bit", H200_WITHOUT_BNB)
    assert without_bnb is not None
    assert "CUDA" not in without_bnb
    assert "bitsandbytes" in without_bnb


def test_the_device_found_here_is_the_cpu_unless_torch_sees_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    found = detect_accelerator()
    assert found.is_cuda is torch.cuda.is_available()
    assert detect_accelerator("cpu") == Accelerator(device="cpu", bf16=cpu_has_bf16())
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="no CUDA GPU"):
            detect_accelerator("cuda")


def test_bitsandbytes_must_be_one_transformers_loads_4bit_with() -> None:
    from importlib.util import find_spec

    assert not bitsandbytes_usable(None)
    assert not bitsandbytes_usable("0.46.0")
    assert bitsandbytes_usable("0.46.1")
    assert bitsandbytes_usable("0.50.2")
    assert bitsandbytes_usable("0.51.0.dev0")
    assert not bitsandbytes_usable("0.9.9")
    # Not a dependency here (the `gpu` extra's): read from metadata, never imported.
    assert bitsandbytes_installed() is (find_spec("bitsandbytes") is not None)
