"""Does training on feedback help? DPO on HH-RLHF and SFT on OASST, measured on this machine.

One command, base model and adapter measured in the same run on the same held-out data:

    .venv/bin/python lab/bench/train_bench.py [--dpo-minutes 15] [--sft-minutes 3] [--json PATH]

- DPO: HH-RLHF harmless-base pairs, split by first prompt into train and a held-out
  set (30% of first prompts, at least 400 pairs by default); held-out preference
  accuracy (share of pairs whose chosen answer has the higher per-token
  log-probability) of base and adapter, each with its 95% Wilson interval, and
  the paired comparison of the two on the same pairs (Newcombe interval of the
  difference, exact McNemar p-value for "the adapter is better"); mean margin;
  training time, tokens per second.
- SFT: OpenAssistant best-ranked (rank 0) answers, split by conversation tree;
  held-out loss (mean NLL per answer token), base vs adapter.
- Peak resident memory of the process (training the default model included).

Reads ../shared/data and skips a part with a clear message when it is absent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
DATA = REPO.parent / "shared" / "data"


def _bucket(key: str) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 10


def hh_split(
    max_chars: int, eval_pairs: int, held_out_buckets: int = 3
) -> tuple[list[dict[str, Any]], list[Any]]:
    """Train rows (trl format) and held-out pairs; split by the first prompt, short pairs only.

    A first prompt in one of the first ``held_out_buckets`` of ten hash buckets is held
    out, so no conversation opening is seen in training and scored afterwards."""
    from eval.offline import HeldOutPair
    from feedback.importers.hh_rlhf import pairs_from_rows, read_hh_rlhf

    pairs, _ = pairs_from_rows(read_hh_rlhf(DATA / "hh-rlhf" / "harmless-base-test.jsonl.gz"))
    train: list[dict[str, Any]] = []
    held: list[Any] = []
    for pair in pairs:
        size = sum(len(m["content"]) for m in pair.prompt) + len(pair.chosen) + len(pair.rejected)
        if size > max_chars:
            continue
        if _bucket(pair.prompt[0]["content"]) < held_out_buckets:
            held.append(HeldOutPair(tuple(pair.prompt), pair.chosen, pair.rejected))
        else:
            train.append(pair.as_row())
    return train, held[:eval_pairs]


def oasst_split() -> tuple[list[dict[str, Any]], list[tuple[list[dict[str, str]], str]]]:
    """SFT rows from rank-0 answers of OASST trees, and held-out (prompt, answer) by tree."""
    train: list[dict[str, Any]] = []
    held: list[tuple[list[dict[str, str]], str]] = []
    with (DATA / "oasst" / "en_100_tree.jsonl").open() as stream:
        for line in stream:
            tree = json.loads(line)
            stack = [(tree["prompt"], [])]
            while stack:
                node, history = stack.pop()
                role = "user" if node["role"] == "prompter" else "assistant"
                conversation = [*history, {"role": role, "content": node["text"]}]
                for reply in node.get("replies") or []:
                    stack.append((reply, conversation))
                    if reply["role"] == "assistant" and reply.get("rank") == 0:
                        if _bucket(tree["message_tree_id"]) < 2:
                            held.append((conversation, reply["text"]))
                        else:
                            train.append(
                                {
                                    "prompt": conversation,
                                    "completion": [{"role": "assistant", "content": reply["text"]}],
                                }
                            )
    return train, held


def score(
    model_dir: Path,
    adapter: Path | None,
    prompts: list[list[dict[str, str]]],
    answer_sets: list[list[str]],
    mixed: bool,
) -> list[list[tuple[float, int]]]:
    """Answer log-probabilities of one model for each list of answers (loaded once)."""
    import torch

    from eval.offline import answer_logprobs, load_for_eval

    model, tokenizer = load_for_eval(model_dir, adapter)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
        return [
            answer_logprobs(model, tokenizer, prompts, answers, max_length=512)
            for answers in answer_sets
        ]


def preference(
    model_dir: Path, adapter: Path | None, held: list[Any], mixed: bool
) -> dict[str, Any]:
    """Held-out preference accuracy with its Wilson interval, mean margin, per-pair wins."""
    from eval.offline import pair_wins, preference_metrics
    from flywheel.intervals import wilson_interval

    prompts = [list(p.prompt) for p in held]
    chosen, rejected = score(
        model_dir, adapter, prompts, [[p.chosen for p in held], [p.rejected for p in held]], mixed
    )
    accuracy, margin = preference_metrics(chosen, rejected)
    wins = pair_wins(chosen, rejected)
    low, high = wilson_interval(sum(wins), len(wins))
    return {
        "preference_accuracy": float(accuracy or 0.0),
        "accuracy_low": low,
        "accuracy_high": high,
        "mean_margin": float(margin or 0.0),
        "pair_wins": list(wins),
    }


def answer_loss(model_dir: Path, adapter: Path | None, held: list[Any], mixed: bool) -> float:
    from eval.offline import mean_token_loss

    (scores,) = score(model_dir, adapter, [p for p, _ in held], [[a for _, a in held]], mixed)
    return float(mean_token_loss(scores) or 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dpo-minutes", type=float, default=15.0)
    parser.add_argument("--sft-minutes", type=float, default=3.0, help="0 skips the SFT part.")
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=8e-4,
        help="DPO peak learning rate (decays over the time budget).",
    )
    parser.add_argument("--beta", type=float, default=0.1, help="DPO beta.")
    parser.add_argument(
        "--sft-weight", type=float, default=1.0, help="Weight of an SFT term on the chosen answers."
    )
    parser.add_argument(
        "--dpo-loss",
        choices=("sigmoid", "sigmoid_norm"),
        default="sigmoid",
        help="DPO loss: log-ratios summed per answer (sigmoid) or averaged per token "
        "(sigmoid_norm, which matches the per-token accuracy scored here; use a beta of a few).",
    )
    parser.add_argument("--eval-pairs", type=int, default=500, help="Held-out pairs scored.")
    parser.add_argument(
        "--held-out-buckets",
        type=int,
        default=3,
        help="First-prompt hash buckets (of 10) held out; 3 gives about 570 short pairs.",
    )
    parser.add_argument(
        "--max-chars", type=int, default=1200, help="Longest pair used (characters)."
    )
    parser.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="Training and scoring precision (auto: the product's choice for this machine).",
    )
    parser.add_argument("--models", type=Path, default=Path.home() / ".flywheel" / "models")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    from composition.recipes import Recipe
    from eval.paired import compare_paired
    from training.base_model import ensure_base_model
    from training.config import LoraShape
    from training.train import train_adapter, trains_in_bf16

    console = Console()
    if not DATA.exists():
        console.print(f"skipped: {DATA} is absent (public data lives beside the repo)")
        return
    base = ensure_base_model(args.models)
    mixed = trains_in_bf16(args.precision, on_gpu=False)
    results: dict[str, Any] = {"base_model": base.name, "bf16": mixed}
    table = Table(title="training on feedback: base model vs adapter, same held-out data")
    for column in ("task", "metric", "base", "adapter", "change"):
        table.add_column(column, justify="right")

    with tempfile.TemporaryDirectory() as folder:
        train_rows, held = hh_split(args.max_chars, args.eval_pairs, args.held_out_buckets)
        console.print(f"DPO: {len(train_rows)} train pairs, {len(held)} held-out pairs")
        before = preference(base, None, held, mixed)
        recipe = Recipe(
            business_line="bench",
            method="dpo",
            lora=LoraShape(rank=16, alpha=32, dropout=0.0),
            learning_rate=args.learning_rate,
            epochs=1,
            batch_size=4,
            max_length=384,
            beta=args.beta,
            sft_weight=args.sft_weight,
            dpo_loss=args.dpo_loss,
            precision=args.precision,
        )
        dpo = train_adapter(
            recipe,
            base_model_dir=base,
            rows=train_rows,
            output_dir=Path(folder) / "dpo",
            max_seconds=args.dpo_minutes * 60,
        )
        after = preference(base, dpo.adapter_dir, held, mixed)
        paired = compare_paired(after["pair_wins"], before["pair_wins"])
        results["dpo"] = {
            "train_pairs_seen": dpo.steps * recipe.batch_size,
            "steps": dpo.steps,
            "seconds": dpo.seconds,
            "tokens_per_second": dpo.tokens_per_second,
            "held_out_pairs": len(held),
            "scoring": "mean log-probability per answer token, chosen > rejected",
            "recipe": {
                "learning_rate": args.learning_rate,
                "beta": args.beta,
                "dpo_loss": args.dpo_loss,
                "sft_weight": args.sft_weight,
            },
            "base": before,
            "adapter": after,
            "paired": paired.as_dict(),
        }
        table.add_row(
            "DPO hh-rlhf",
            "preference accuracy (95% CI)",
            _with_interval(before),
            _with_interval(after),
            f"{paired.difference:+.3f} ({paired.low:+.3f} to {paired.high:+.3f})",
        )
        table.add_row(
            "DPO hh-rlhf",
            "mean margin (nats/token)",
            f"{before['mean_margin']:.3f}",
            f"{after['mean_margin']:.3f}",
            f"{after['mean_margin'] - before['mean_margin']:+.3f}",
        )
        if args.sft_minutes <= 0:
            results["sft"] = None
        else:
            results["sft"] = _sft_part(args, recipe, base, mixed, table, Path(folder))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results["peak_rss_mb"] = peak
    console.print(table)
    console.print(f"DPO held-out, adapter vs base, paired: {paired.describe('adapter', 'base')}")
    dpo_r, sft_r = results["dpo"], results["sft"]
    sft_line = f"SFT: {sft_r['steps']} steps in {sft_r['seconds'] / 60:.1f} min; " if sft_r else ""
    console.print(
        f"DPO: {dpo_r['steps']} steps in {dpo_r['seconds'] / 60:.1f} min "
        f"({dpo_r['tokens_per_second']:.0f} tokens/s, lr {args.learning_rate:g}, beta "
        f"{args.beta:g}, loss {args.dpo_loss}, SFT term {args.sft_weight:g}); {sft_line}"
        f"peak RSS {peak:.0f} MB; "
        f"bf16 autocast: {'on' if mixed else 'off'}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def _sft_part(
    args: argparse.Namespace, recipe: Any, base: Path, mixed: bool, table: Any, folder: Path
) -> dict[str, Any]:
    """SFT on OASST rank-0 answers: held-out loss, base vs adapter (a row of the table)."""
    from rich.console import Console

    from training.train import train_adapter

    sft_rows, sft_held = oasst_split()
    Console().print(f"SFT: {len(sft_rows)} train answers, {len(sft_held)} held-out answers")
    loss_before = answer_loss(base, None, sft_held, mixed)
    sft_recipe = recipe.model_copy(
        update={"method": "sft", "learning_rate": 2e-4, "max_length": 512, "sft_weight": 0.0}
    )
    sft = train_adapter(
        sft_recipe,
        base_model_dir=base,
        rows=sft_rows,
        output_dir=folder / "sft",
        max_seconds=args.sft_minutes * 60,
    )
    loss_after = answer_loss(base, sft.adapter_dir, sft_held, mixed)
    table.add_row(
        "SFT oasst",
        "held-out loss",
        f"{loss_before:.3f}",
        f"{loss_after:.3f}",
        f"{loss_after - loss_before:+.3f}",
    )
    return {
        "steps": sft.steps,
        "seconds": sft.seconds,
        "tokens_per_second": sft.tokens_per_second,
        "held_out_answers": len(sft_held),
        "base_loss": loss_before,
        "adapter_loss": loss_after,
    }


def _with_interval(result: dict[str, Any]) -> str:
    return (
        f"{result['preference_accuracy']:.3f} "
        f"({result['accuracy_low']:.3f} to {result['accuracy_high']:.3f})"
    )


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"bench wall time {time.perf_counter() - start:.0f} s")
