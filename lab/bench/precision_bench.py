"""float32 against bfloat16 autocast on this CPU: training steps and scoring passes.

One command, both precisions in the same run on the same rows:

    .venv/bin/python lab/bench/precision_bench.py [--steps 12] [--rounds 2] [--json PATH]

Trains the default base model's LoRA adapter (SFT, the demo recipe's shape,
batch 4) for ``--steps`` steps in each precision and scores 64 answers with
the offline evaluator's forward pass in each, alternating the order over
``--rounds`` rounds so a busy neighbour hurts both. Prints seconds per step,
tokens per second and the ratio bf16 / fp32 (above 1: bfloat16 is slower). The
first step of a training is left out (oneDNN builds its kernels then).

The rows are made here (no data download): short customer-service exchanges of
the lengths the loop trains on (~130 tokens).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def rows(n: int) -> list[dict[str, Any]]:
    """SFT rows in trl's conversational format, ~130 tokens each."""
    topics = ["a late parcel", "a broken kettle", "a double charge", "a lost password"]
    out = []
    for i in range(n):
        topic = topics[i % len(topics)]
        prompt = f"Hello, I have a problem with {topic} (order {1000 + i}). What should I do?"
        answer = (
            f"I'm sorry for the trouble with {topic}. Please open your orders page, choose the "
            f"order, and pick 'report a problem'. We will reply within two days, and if the "
            f"item cannot be fixed we refund it in full. Keep the receipt until then."
        )
        out.append(
            {
                "prompt": [{"role": "user", "content": prompt}],
                "completion": [{"role": "assistant", "content": answer}],
            }
        )
    return out


def time_training(base: Path, precision: str, steps: int, folder: Path) -> dict[str, float]:
    """Seconds per step (first step left out) and tokens per second of one short training."""
    from composition.recipes import Recipe
    from training.config import LoraShape
    from training.train import train_adapter

    recipe = Recipe(
        business_line="bench",
        method="sft",
        lora=LoraShape(rank=16, alpha=32, dropout=0.0),
        learning_rate=4e-4,
        max_steps=steps + 1,
        batch_size=4,
        max_length=256,
        precision=precision,  # type: ignore[arg-type]
    )
    stamps: list[float] = []
    result = train_adapter(
        recipe,
        base_model_dir=base,
        rows=rows(64),
        output_dir=folder / precision,
        on_log=lambda logs: stamps.append(time.perf_counter()) if "loss" in logs else None,
    )
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "seconds_per_step": statistics.median(gaps) if gaps else float("nan"),
        "tokens_per_second": result.tokens_per_second,
    }


def time_scoring(base: Path, mixed: bool, n: int) -> float:
    """Seconds to score ``n`` answers with the offline evaluator's forward pass."""
    import torch

    from eval.offline import answer_logprobs, load_for_eval

    model, tokenizer = load_for_eval(base, None)
    data = rows(n)
    prompts = [r["prompt"] for r in data]
    answers = [r["completion"][0]["content"] for r in data]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
        answer_logprobs(model, tokenizer, prompts[:4], answers[:4], max_length=512)  # warm up
        started = time.perf_counter()
        answer_logprobs(model, tokenizer, prompts, answers, max_length=512)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="Timed training steps each.")
    parser.add_argument("--rounds", type=int, default=2, help="Alternating rounds.")
    parser.add_argument("--models", type=Path, default=Path.home() / ".flywheel" / "models")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from flywheel.hardware import cpu_has_bf16
    from training.base_model import ensure_base_model

    base = ensure_base_model(args.models)
    print(f"CPU has native bfloat16 (AVX512-BF16 or AMX): {cpu_has_bf16()}")
    runs: dict[str, list[dict[str, float]]] = {"fp32": [], "bf16": []}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            order = ["fp32", "bf16"] if round_ % 2 == 0 else ["bf16", "fp32"]
            for precision in order:
                train = time_training(base, precision, args.steps, Path(folder) / str(round_))
                scoring = time_scoring(base, precision == "bf16", 64)
                runs[precision].append({**train, "scoring_seconds": scoring})
                print(
                    f"round {round_ + 1} {precision}: {train['seconds_per_step']:.2f} s/step, "
                    f"{train['tokens_per_second']:.0f} tokens/s; scoring 64 answers "
                    f"{scoring:.2f} s"
                )
    summary: dict[str, Any] = {"runs": runs}
    for key in ("seconds_per_step", "scoring_seconds"):
        fp32 = statistics.median(r[key] for r in runs["fp32"])
        bf16 = statistics.median(r[key] for r in runs["bf16"])
        summary[key] = {"fp32": fp32, "bf16": bf16, "ratio_bf16_over_fp32": bf16 / fp32}
        print(f"{key}: fp32 {fp32:.3f}, bf16 {bf16:.3f}, bf16 / fp32 = {bf16 / fp32:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
