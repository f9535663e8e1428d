"""``bench/gpu_check.py``: the GPU route's script runs end to end (on the CPU here, with a tiny
model of the base model's family), and on CUDA where there is one (skipped otherwise)."""

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


def _run(tmp_path: Path, config: Path, device: str) -> dict:
    out = tmp_path / f"result-{device}.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--out", str(tmp_path / device),
         "--model-config", str(config), "--steps", "2", "--answers", "4",
         "--max-new-tokens", "4", "--device", device, "--json", str(out)],
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


def test_the_gpu_check_runs_on_cuda(tmp_path: Path, base_model_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    result = _run(tmp_path, _tiny_config(base_model_dir, tmp_path / "tiny"), "cuda")
    assert result["train_apology"]["device"] == "cuda"
