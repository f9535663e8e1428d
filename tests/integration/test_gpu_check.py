"""``lab/bench/gpu_check.py``: the GPU route's script runs end to end (on the CPU here, with a tiny
model of the base model's family), and on CUDA where there is one (skipped otherwise); vLLM
serving is checked only where a CUDA vLLM imports, and the JSON says so plainly elsewhere."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _tiny_config(base_model_dir: Path, target: Path) -> Path:
    target.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(base_model_dir / name, target / name)
    for optional in ("chat_template.jinja", "generation_config.json"):
        if (base_model_dir / optional).exists():
            shutil.copy(base_model_dir / optional, target / optional)
    config = json.loads((target / "config.json").read_text())
    config.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    (target / "config.json").write_text(json.dumps(config))
    return target


def _run(tmp_path: Path, config: Path, device: str, *extra: str) -> dict:
    out = tmp_path / f"result-{device}.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "lab" / "bench" / "gpu_check.py"),
         "--out", str(tmp_path / device),
         "--model-config", str(config), "--steps", "2", "--answers", "4",
         "--max-new-tokens", "4", "--device", device, "--json", str(out), *extra],
        capture_output=True, text=True, timeout=900, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


def test_the_gpu_check_runs_on_the_cpu(tmp_path: Path, base_model_dir: Path) -> None:
    result = _run(tmp_path, _tiny_config(base_model_dir, tmp_path / "tiny"), "cpu")
    assert result["train_apology"]["steps"] == 2
    assert result["train_curt"]["device"] == "cpu"
    assert result["scoring"]["answers"] == 4
    assert set(result["generation"]) == {"base", "apology", "curt"}
    compared = result["gradient_checkpointing"]
    assert compared["on"]["gradient_checkpointing"] is True
    assert compared["off"]["gradient_checkpointing"] is False
    assert compared["on"]["steps"] == compared["off"]["steps"] == 2
    assert compared["step_time_on_over_off"] > 0
    assert compared["peak_memory_on_over_off"] is None  # no GPU memory to measure
    assert result["qlora"]["checked"] is False
    assert "needs a CUDA GPU" in result["qlora"]["reason"]
    assert result["vllm"] == {
        "checked": False,
        "reason": "vLLM serving not checked: this run is on cpu, vLLM's GPU serving needs CUDA",
    }


def test_the_gpu_check_runs_on_cuda(tmp_path: Path, base_model_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    result = _run(tmp_path, _tiny_config(base_model_dir, tmp_path / "tiny"), "cuda")
    assert result["train_apology"]["device"] == "cuda"
    assert result["train_apology"]["weights"] == ("bfloat16" if result["bf16"] else "float16")
    compared = result["gradient_checkpointing"]
    assert compared["on"]["peak_gpu_memory_gb"] > 0
    assert compared["off"]["peak_gpu_memory_gb"] > 0
    assert compared["peak_memory_on_over_off"] is not None
    if result["qlora"]["checked"]:
        assert result["qlora"]["steps"] == 2
    else:
        assert "bitsandbytes" in result["qlora"]["reason"]
    vllm = result["vllm"]
    if vllm["checked"]:
        for model in ("gpu-check-base", "apology", "curt"):
            assert vllm["models"][model]["failed"] == 0
            assert vllm["models"][model]["tokens_per_second"] > 0
        assert vllm["mixed"]["failed"] == 0
    else:
        assert vllm["reason"].startswith("vLLM serving not checked: ")
