"""vLLM's CPU thread placement on a small machine: its automatic binding against the others.

Run from the repository root::

    .venv/bin/python lab/bench/vllm_cpu_threads_bench.py [--rounds 3] [--requests 96]

vLLM's CPU backend reserves a core for its scheduler process (EngineCore), which
waits on the model worker by spinning, and binds the worker's OpenMP threads to the
rest: on a 2-core machine the model runs on one core. Each placement below is a
vLLM CPU server of the base model with a rank-16 adapter (random weights) loaded;
each round sends every server in turn the same ``--requests`` chat completions
(16 at a time, 96 tokens, ``ignore_eos``, 5% through the adapter: the loop's canary
share). Printed: seconds per round per placement and the ratio to vLLM's default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Literal

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

ADAPTER = "bench-adapter"
CONCURRENCY = 16
TOKENS = 96
SHARE = 0.05
Dtype = Literal["bfloat16", "float32"]


def placements(cores: int) -> dict[str, tuple[Dtype, dict[str, str]]]:
    """The servers compared: name -> (--dtype, variables added to the server's environment)."""
    every = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}"}
    vllms = {"VLLM_CPU_OMP_THREADS_BIND": "auto"}  # vLLM's own binding, whatever flywheel picks
    return {
        "bfloat16, a core reserved (vLLM)": ("bfloat16", vllms),
        "float32, a core reserved": ("float32", vllms),
        f"bfloat16, worker on all {cores}": ("bfloat16", every),
        f"float32, worker on all {cores}": ("float32", every),
    }


async def _round(url: str, requests: int, concurrency: int = CONCURRENCY) -> float:
    """Seconds to answer ``requests`` completions, ``concurrency`` at a time, SHARE of them
    through the adapter."""
    async with httpx.AsyncClient(base_url=url, timeout=900) as client:
        gate = asyncio.Semaphore(concurrency)

        async def one(index: int) -> None:
            model = ADAPTER if (index * 7919) % 100 < SHARE * 100 else "base"
            body = {
                "model": model,
                "messages": [{"role": "user", "content": f"How do I reset my router? ({index})"}],
                "max_tokens": TOKENS,
                "temperature": 0.7,
                "ignore_eos": True,
            }
            async with gate:
                response = await client.post("/v1/chat/completions", json=body)
                response.raise_for_status()

        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(requests)))
        return time.monotonic() - started


def main() -> None:
    from flywheel.hardware import allowed_cpus
    from lab.bench.cpu_lora_bench import _adapter, base_and_vllm_python
    from registry.vllm_admin import VllmAdminClient
    from registry.vllm_server import VllmServer, VllmServerSettings, free_port

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    base, python = base_and_vllm_python()
    cores = len(allowed_cpus())
    seconds: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="flywheel-threads-") as scratch, ExitStack() as stack:
        work = Path(scratch)
        adapter = _adapter(base, work / ADAPTER)
        urls: dict[str, str] = {}
        for name, (dtype, extra) in placements(cores).items():
            server_settings = VllmServerSettings(
                model=base, served_model_name="base", port=free_port(), dtype=dtype
            )
            server = VllmServer(
                server_settings,
                python=python,
                log_path=work / f"vllm-{len(urls)}.log",
                env={**os.environ, **extra},
                report=print,
            )
            stack.enter_context(server)
            with VllmAdminClient(server.base_url) as admin:
                admin.load_adapter(ADAPTER, adapter)
            urls[name] = server.base_url
            asyncio.run(_round(server.base_url, CONCURRENCY))  # warm up
            seconds[name] = []
        for number in range(args.rounds):
            for name, url in urls.items():
                seconds[name].append(asyncio.run(_round(url, args.requests)))
                print(f"round {number + 1} {name:34}: {seconds[name][-1]:.1f} s", flush=True)
    baseline = statistics.median(next(iter(seconds.values())))
    print(f"\n{cores} cores; {args.requests} answers of {TOKENS} tokens per round")
    print(f"{'placement':34} {'median s':>9} {'speed-up':>9}")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"{name:34} {median:9.1f} {baseline / median:8.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"cores": cores, "seconds": seconds}, indent=2))


if __name__ == "__main__":
    main()
