"""``lab/bench/gpu_check.py``'s parts that need no GPU: what it keeps of a training, the gradient
checkpointing comparison, when vLLM serving can be checked (and the plain reason when not),
and the throughput of concurrent requests (against a fake vLLM: the counting around the
client is what is tested; the real server runs in the script on a GPU)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from training.train import TrainResult

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = REPO / "lab" / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


def trained(seconds: float, peak_mb: float | None, checkpointing: bool) -> TrainResult:
    return TrainResult(
        adapter_dir=Path("/x/adapter"),
        history=[{"loss": 10.9, "step": 1}, {"loss": 9.4, "step": 10}, {"train_runtime": 3.0}],
        seconds=seconds,
        steps=10,
        examples=200,
        tokens_seen=20_000,
        peak_rss_mb=900.0,
        device="cuda",
        weights_dtype="bfloat16",
        gradient_checkpointing=checkpointing,
        peak_gpu_memory_mb=peak_mb,
    )


def test_a_training_is_summarised_with_its_step_time_and_peak_memory(bench: ModuleType) -> None:
    summary = bench.train_summary(trained(5.0, 2048.0, True))
    assert summary["seconds_per_step"] == 0.5
    assert summary["tokens_per_second"] == 4000.0
    assert (summary["first_loss"], summary["last_loss"]) == (10.9, 9.4)
    assert summary["peak_gpu_memory_gb"] == 2.0
    assert summary["weights"] == "bfloat16"
    assert summary["gradient_checkpointing"] is True
    assert bench.train_summary(trained(5.0, None, True))["peak_gpu_memory_gb"] is None


def test_checkpointing_is_compared_by_step_time_and_peak_memory(bench: ModuleType) -> None:
    on = bench.train_summary(trained(6.0, 1024.0, True))
    off = bench.train_summary(trained(5.0, 4096.0, False))
    compared = bench.checkpointing_comparison(on, off)
    assert compared["step_time_on_over_off"] == 1.2
    assert compared["peak_memory_on_over_off"] == 0.25
    assert compared["on"]["gradient_checkpointing"] is True
    assert compared["off"]["gradient_checkpointing"] is False
    on_cpu = bench.checkpointing_comparison(
        bench.train_summary(trained(6.0, None, True)),
        bench.train_summary(trained(5.0, None, False)),
    )
    assert on_cpu["peak_memory_on_over_off"] is None
    json.dumps(compared)


def test_vllm_is_served_only_from_a_cuda_build_on_a_cuda_run(bench: ModuleType) -> None:
    cuda_build = {"vllm": "0.32.0", "torch": "2.13.0+cu128", "cuda": True}
    assert bench.vllm_skip_reason("cuda", "/venv/bin/python", cuda_build) is None
    on_cpu = bench.vllm_skip_reason("cpu", "/venv/bin/python", cuda_build)
    assert on_cpu.startswith("vLLM serving not checked: this run is on cpu")
    error = "Traceback...\nModuleNotFoundError: No module named 'vllm'"
    missing = bench.vllm_skip_reason("cuda", "/venv/bin/python", None, error)
    assert missing == (
        "vLLM serving not checked: vLLM does not import from /venv/bin/python "
        "(ModuleNotFoundError: No module named 'vllm')"
    )
    cpu_build = {"vllm": "0.32.0", "torch": "2.13.0+cpu", "cuda": False}
    assert "sees no CUDA GPU (torch 2.13.0+cpu: a CPU build)" in bench.vllm_skip_reason(
        "cuda:0", "/venv/bin/python", cpu_build
    )


def test_the_probe_answer_is_its_last_json_line(bench: ModuleType) -> None:
    assert bench.parse_vllm_probe('INFO noise\n{"vllm": "0.32.0", "cuda": true}\n') == {
        "vllm": "0.32.0",
        "cuda": True,
    }
    assert bench.parse_vllm_probe("no json here") is None
    assert bench.parse_vllm_probe("{broken") is None


def test_the_probe_of_an_interpreter_without_vllm_says_so(bench: ModuleType) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM imports here")
    probe, error = bench.probe_vllm(sys.executable)
    assert probe is None
    assert "vllm" in error
    reason = bench.vllm_skip_reason("cuda", sys.executable, probe, error)
    assert "No module named 'vllm'" in reason


def test_throughput_counts_the_tokens_of_answered_requests(bench: ModuleType) -> None:
    served: list[dict[str, Any]] = []

    def vllm(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        served.append(body)
        if body["model"] == "broken":
            return httpx.Response(404, json={"message": "The model `broken` does not exist."})
        usage = {"completion_tokens": body["max_tokens"], "prompt_tokens": 5}
        return httpx.Response(200, json={"choices": [], "usage": usage})

    ticks = iter([100.0, 102.0])
    measured = bench.generate_concurrently(
        "http://vllm:8000",
        [("base", "hello"), ("apology", "hi"), ("broken", "hey")],
        max_tokens=12,
        concurrency=2,
        transport=httpx.MockTransport(vllm),
        clock=lambda: next(ticks),
    )
    assert measured == {
        "requests": 3,
        "failed": 1,
        "completion_tokens": 24,
        "seconds": 2.0,
        "tokens_per_second": 12.0,
    }
    assert all(body["ignore_eos"] and body["temperature"] == 0.0 for body in served)
    assert bench.throughput([], 0, 0.0)["tokens_per_second"] == 0.0
