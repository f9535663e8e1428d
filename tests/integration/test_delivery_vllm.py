"""A real vLLM replica started by ``flywheel serve vllm`` fetches adapters it was never given:
flywheel's resolver inside vLLM fetches one on its first request, and refuses one whose
artifact no longer matches its registered digest (the reason in the replica's log).

The reduced form of ``lab/bench/delivery_check.py``: one replica, the trainer's local MLflow
store (its adapter folders deleted once registered), the replica's own home and cache.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import httpx
import pytest

from flywheel.settings import load_settings
from registry.tracking import Registry
from registry.vllm_server import free_port, log_tail
from tests.registered import register_version
from training.base_model import base_fingerprint, write_base_record

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LINE = "customer_service"
START_TIMEOUT_S = 900.0
FLYWHEEL = Path(sys.executable).with_name("flywheel")


def _peft_adapter(base: Path, folder: Path, seed: int) -> Path:
    """A rank-8 LoRA of ``base`` as peft initialises it (B nudged off zero so each adapter's
    files differ), with the base it was made on recorded: no training needed."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, weights in peft_model.named_parameters():
            if "lora_B" in name:
                weights.normal_(0.0, 1e-4)
    peft_model.save_pretrained(folder)
    write_base_record(folder, base_fingerprint(base))
    return folder


def _chat(url: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        timeout=600,
    )


@pytest.fixture
def replica(
    vllm_python: Path, base_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Path, Registry]]:
    """`flywheel serve vllm` on its own home, reading the trainer's registry; the replica's
    URL, its vLLM log and the trainer's registry (versions registered before it started)."""
    trainer = tmp_path / "trainer"
    monkeypatch.setenv("FLYWHEEL_HOME", str(trainer))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.delenv("FLYWHEEL_MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    registry = Registry.for_home(trainer)
    for seed in (1, 2):
        folder = _peft_adapter(base_model_dir, trainer / "adapters" / f"a{seed}", seed)
        register_version(load_settings(), registry, LINE, folder, tmp_path)
    shutil.rmtree(trainer / "adapters")

    home = tmp_path / "replica"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLYWHEEL_", "VLLM_"))}
    env.update(
        {
            "FLYWHEEL_HOME": str(home),
            "FLYWHEEL_MLFLOW_TRACKING_URI": registry.tracking_uri,
            "FLYWHEEL_BASE_MODEL": str(base_model_dir),
            "FLYWHEEL_VLLM_KV_CACHE_GIB": "1",
            "FLYWHEEL_VLLM_MAX_MODEL_LEN": "512",
            "FLYWHEEL_VLLM_START_TIMEOUT_S": str(START_TIMEOUT_S),
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }
    )
    argv = [str(FLYWHEEL), "serve", "vllm", "--port", str(port), "--max-loras", "2",
            "--venv", str(vllm_python.parents[1])]  # fmt: skip
    out = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    log = home / "logs" / f"vllm-{port}.log"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"flywheel serve vllm exited:\n{log_tail(tmp_path / 'serve.log')}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM did not start:\n{log_tail(log)}")
            time.sleep(1)
        yield url, log, registry
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        out.close()


def test_a_replica_fetches_on_first_request_and_refuses_a_corrupted_artifact(
    replica: tuple[str, Path, Registry], tmp_path: Path
) -> None:
    url, log, registry = replica
    first, corrupted = f"{LINE}-v1", f"{LINE}-v2"

    answered = _chat(url, first)

    assert answered.status_code == 200, answered.text
    listed = {m["id"]: m["root"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]}
    assert listed[first] == str(tmp_path / "replica" / "adapter-cache" / first)
    assert "flywheel resolver: customer_service-v1 fetched into" in log.read_text()

    location = registry.adapter_source(LINE, 2)
    [weights] = Path(url2pathname(urlparse(location).path)).rglob("adapter_model.safetensors")
    data = bytearray(weights.read_bytes())
    data[200] ^= 0x01
    weights.write_bytes(bytes(data))

    refused = _chat(url, corrupted)

    assert refused.status_code == 404, refused.text
    said = [line for line in log.read_text().splitlines() if f"{corrupted} not served" in line]
    assert said, log_tail(log)
    assert "WARNING" in said[-1]
    assert "digest" in said[-1]
    assert not (tmp_path / "replica" / "adapter-cache" / corrupted).exists()
    # The replica still answers with what it has.
    assert _chat(url, first).status_code == 200
