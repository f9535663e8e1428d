"""How many answers in flight a vLLM CPU server answers fastest, at flywheel's settings.

Run from the repository root::

    .venv/bin/python lab/bench/vllm_batch_bench.py --rounds 2 --requests 48 --in-flight 8,16,32,64

One vLLM CPU server of the base model as flywheel starts it (its dtype and thread binding
for this machine) with a rank-16 adapter (random weights) loaded. Each round sends it the
same ``--requests`` chat completions (96 tokens, ``ignore_eos``, 5% through the adapter)
at each number in flight, in turn. Printed: seconds per round, answers a second, and the
ratio to 16 in flight (``flywheel loop --concurrency``'s default).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

BASELINE = 16


def main() -> None:
    from lab.bench.cpu_lora_bench import _adapter, base_and_vllm_python
    from lab.bench.vllm_cpu_threads_bench import ADAPTER, _round
    from registry.vllm_admin import VllmAdminClient
    from registry.vllm_server import VllmServer, VllmServerSettings, free_port

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--in-flight", default="8,16,32,64")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    in_flight = sorted({int(n) for n in args.in_flight.split(",")} | {BASELINE})
    base, python = base_and_vllm_python()
    seconds: dict[int, list[float]] = {n: [] for n in in_flight}
    with tempfile.TemporaryDirectory(prefix="flywheel-batch-") as scratch:
        work = Path(scratch)
        adapter = _adapter(base, work / ADAPTER)
        server_settings = VllmServerSettings(model=base, served_model_name="base", port=free_port())
        with VllmServer(server_settings, python=python, log_path=work / "vllm.log", report=print):
            url = server_settings.base_url
            with VllmAdminClient(url) as admin:
                admin.load_adapter(ADAPTER, adapter)
            asyncio.run(_round(url, BASELINE))  # warm up
            for number in range(args.rounds):
                for n in in_flight:
                    seconds[n].append(asyncio.run(_round(url, args.requests, n)))
                    took = seconds[n][-1]
                    print(f"round {number + 1}, {n:3} in flight: {took:.1f} s", flush=True)
    baseline = statistics.median(seconds[BASELINE])
    print(f"\n{args.requests} answers of 96 tokens per round")
    print(f"{'in flight':>9} {'median s':>9} {'answers/s':>10} {'vs 16':>7}")
    for n in in_flight:
        median = statistics.median(seconds[n])
        print(f"{n:9} {median:9.1f} {args.requests / median:10.2f} {baseline / median:6.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"requests": args.requests, "seconds": seconds}, indent=2))


if __name__ == "__main__":
    main()
