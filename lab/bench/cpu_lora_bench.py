"""vLLM on the CPU with flywheel's LoRA ops against vLLM's own, in the same rounds.

Run from the repository root::

    .venv/bin/python lab/bench/cpu_lora_bench.py [--rounds 2] [--requests 96] [--json out.json]

Two vLLM CPU servers of the base model, side by side, each with the same rank-16
adapter on q/k/v/o (random weights: an answer costs what a trained one's does):
one loads only flywheel's resolver plugin (vLLM's own LoRA ops), the other also
``flywheel_cpu_lora`` (:mod:`flywheel_vllm_resolver.cpu_lora`: one product per
adapter instead of one per token). Each round sends both servers, one after the
other, the same ``--requests`` chat completions (16 at a time, 96 tokens each,
``ignore_eos``) three times: none through the adapter (the base model), 5% (a
canary's share) and all (a line served by its champion adapter). Printed per mix:
seconds per round on each server and their ratio, and the answers' agreement at
temperature 0 (the same tokens from both servers).
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
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

ADAPTER = "bench-adapter"
MIXES = {"base only": 0.0, "5% adapter": 0.05, "all adapter": 1.0}
CONCURRENCY = 16
TOKENS = 96


def _adapter(base: Path, folder: Path) -> Path:
    """A rank-16 LoRA of the base model on q/k/v/o with random (non-zero) weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in peft_model.named_parameters():
            if "lora_B" in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.01)
    peft_model.save_pretrained(folder)
    return folder


def base_and_vllm_python() -> tuple[Path, Path]:
    """The base model's folder and the python of the vLLM CPU virtualenv (built if missing)."""
    from flywheel.settings import load_settings
    from registry.vllm_server import VllmEnvironment
    from training.base_model import ensure_base_model

    settings = load_settings()
    base = ensure_base_model(settings.models_dir, settings.base_model)
    python = VllmEnvironment(
        REPO / ".venv-vllm", torch_index=settings.torch_index, report=print
    ).ensure()
    return base, python


async def _round(url: str, requests: int, share: float) -> tuple[float, list[str]]:
    """Seconds to answer ``requests`` completions, ``share`` of them through the adapter
    (the same requests every time), and the answers in order."""
    prompts = [f"Explain briefly how to reset a home router, case {i}." for i in range(requests)]
    answers = [""] * requests
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(index: int) -> None:
            model = ADAPTER if (index * 7919) % 100 < share * 100 else "base"
            body = {
                "model": model,
                "messages": [{"role": "user", "content": prompts[index]}],
                "max_tokens": TOKENS,
                "temperature": 0.0,
                "ignore_eos": True,
            }
            async with gate:
                response = await client.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                answers[index] = response.json()["choices"][0]["message"]["content"]

        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(requests)))
        return time.monotonic() - started, answers


def main() -> None:
    from registry.vllm_admin import VllmAdminClient
    from registry.vllm_server import (
        CPU_LORA_PLUGIN,
        RESOLVER_PLUGIN,
        VllmServer,
        VllmServerSettings,
        free_port,
    )

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    base, python = base_and_vllm_python()
    plugins = {
        "vLLM's ops": RESOLVER_PLUGIN,
        "flywheel's ops": f"{RESOLVER_PLUGIN},{CPU_LORA_PLUGIN}",
    }
    with tempfile.TemporaryDirectory(prefix="flywheel-cpu-lora-") as scratch, ExitStack() as stack:
        work = Path(scratch)
        adapter = _adapter(base, work / ADAPTER)
        urls: dict[str, str] = {}
        for name, allowed in plugins.items():
            server_settings = VllmServerSettings(
                model=base, served_model_name="base", port=free_port(), max_loras=4
            )
            server = VllmServer(
                server_settings,
                python=python,
                log_path=work / f"vllm-{len(urls)}.log",
                env={**os.environ, "VLLM_PLUGINS": allowed},
                report=print,
            )
            stack.enter_context(server)
            with VllmAdminClient(server.base_url) as admin:
                admin.load_adapter(ADAPTER, adapter)
            urls[name] = server.base_url
            asyncio.run(_round(server.base_url, CONCURRENCY, 0.5))  # warm both paths
        seconds: dict[str, dict[str, list[float]]] = {m: {n: [] for n in urls} for m in MIXES}
        same: dict[str, list[float]] = {m: [] for m in MIXES}
        for number in range(args.rounds):
            for mix, share in MIXES.items():
                answers = {}
                for name, url in urls.items():
                    took, answers[name] = asyncio.run(_round(url, args.requests, share))
                    seconds[mix][name].append(took)
                ours, theirs = answers["flywheel's ops"], answers["vLLM's ops"]
                same[mix].append(sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(ours))
                print(
                    f"round {number + 1} {mix:12}: "
                    + ", ".join(f"{n} {seconds[mix][n][-1]:.1f} s" for n in urls)
                )
    results: dict[str, Any] = {"requests": args.requests, "rounds": args.rounds, "mixes": {}}
    print(f"\n{'mix':12} {'vLLM ops s':>11} {'ours s':>8} {'speed-up':>9} {'same answers':>13}")
    for mix in MIXES:
        theirs = statistics.median(seconds[mix]["vLLM's ops"])
        ours = statistics.median(seconds[mix]["flywheel's ops"])
        agree = statistics.mean(same[mix])
        results["mixes"][mix] = {"vllm_s": seconds[mix]["vLLM's ops"],
                                 "flywheel_s": seconds[mix]["flywheel's ops"],
                                 "speedup": theirs / ours, "same_answers": agree}  # fmt: skip
        print(f"{mix:12} {theirs:11.1f} {ours:8.1f} {theirs / ours:8.2f}x {agree:13.0%}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
