"""What a night's noisy positives cost: the same night's SFT set trained whole and with only
its users' edits as targets, each adapter judged on fresh prompts by the simulated users.

    FLYWHEEL_HOME=<a loop's home> .venv/bin/python lab/bench/positive_noise_bench.py \\
        --line customer_service [--dataset HASH] [--prompts 100] [--seeds 0]

Reads the line's dataset (the oldest: a first night's, unless ``--dataset``) and its recipe
(the demo recipes, as ``flywheel loop`` uses them), trains the recipe's adapter from the base
model on (a) every SFT target and (b) the targets of the ``edit`` rule only, then answers the
fresh prompts of ``flywheel loop``'s final comparison (seed 0) with the base model and each
adapter (greedy, the same for every arm) and prints each arm's satisfied share against the
base's, measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# Written answers: users' edits and reviewers' corrections.
EDIT_RULES = frozenset({"edit", "correction"})


def night_dataset(datasets_dir: Path, line: str, prefix: str | None) -> Path | None:
    """The line's dataset whose hash starts with ``prefix``, else its oldest (a first
    night's); ``None`` when there is none."""
    from feedback.datasets import line_builds

    builds = sorted(line_builds(datasets_dir, line), key=lambda b: b.manifest["created_at"])
    if prefix:
        builds = [b for b in builds if b.content_hash.startswith(prefix)]
    return builds[0].path if builds else None


def add_night_arguments(parser: argparse.ArgumentParser, line: str) -> None:
    """The options every bench of one night's set takes (``line`` the default line)."""
    parser.add_argument("--line", default=line)
    parser.add_argument("--dataset", help="a dataset hash (prefix); the oldest by default")
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--seeds", default="0", help="training seeds, comma-separated")
    parser.add_argument("--users", default="lab.simulation.users:BuiltinUsers")


@dataclass(frozen=True)
class NightSet:
    """One night's dataset with what a bench trains and judges it with."""

    dataset: Path
    recipe: Any
    base_dir: Path
    users: Any
    prompts: list[str]


def load_night_set(args: argparse.Namespace) -> NightSet | None:
    """The dataset, demo recipe, base model, users and fresh prompts ``args`` name (the
    prompts of ``flywheel loop``'s final comparison); ``None`` when the line has no
    dataset, said on stderr."""
    from composition.recipes import load_recipe, packaged_recipes_dir
    from flywheel.settings import load_settings
    from lab.simulation.protocol import load_users
    from training.base_model import ensure_base_model

    settings = load_settings()
    dataset = night_dataset(settings.datasets_dir, args.line, args.dataset)
    if dataset is None:
        print(f"no dataset of {args.line} under {settings.datasets_dir}", file=sys.stderr)
        return None
    users = load_users(args.users)
    return NightSet(
        dataset=dataset,
        recipe=load_recipe(args.line, packaged_recipes_dir() / "demo"),
        base_dir=ensure_base_model(settings.models_dir, settings.base_model),
        users=users,
        prompts=users.prompts(args.line, args.prompts, 999_983),
    )


def sft_rows(dataset: Path, keep: frozenset[str] | None) -> list[Any]:
    """The dataset's SFT training rows, only those whose rule is in ``keep`` when given."""
    import pyarrow.parquet as pq

    from training.rows import TrainingRow

    rows = pq.read_table(dataset / "sft_train.parquet").to_pylist()
    return [
        TrainingRow.from_dict({k: row[k] for k in ("prompt", "completion", "weight") if k in row})
        for row in rows
        if keep is None or row["rule"] in keep
    ]


def answers(base_dir: Path, adapter: Path | None, prompts: Sequence[str], tokens: int) -> list[str]:
    """Greedy answers of the base model (with ``adapter`` when given) to ``prompts``."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    tokenizer.padding_side = "left"
    model: Any = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    out: list[str] = []
    for start in range(0, len(prompts), 16):
        batch = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
            for p in prompts[start : start + 16]
        ]
        encoded = tokenizer(batch, return_tensors="pt", padding=True)
        with torch.no_grad():
            generated = model.generate(
                **encoded, max_new_tokens=tokens, do_sample=False,
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )  # fmt: skip
        width = encoded["input_ids"].shape[1]
        out += tokenizer.batch_decode(generated[:, width:], skip_special_tokens=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Train both adapters per seed, answer, judge, print."""
    from training.train import train_adapter

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_night_arguments(parser, "customer_service")
    parser.add_argument("--show", type=int, default=3, help="answers printed per arm")
    args = parser.parse_args(argv)
    night = load_night_set(args)
    if night is None:
        return 2
    dataset, recipe, base_dir, users, prompts = (
        night.dataset, night.recipe, night.base_dir, night.users, night.prompts,
    )  # fmt: skip

    def judged(texts: list[str]) -> float:
        met = [users.satisfied(args.line, p, a) for p, a in zip(prompts, texts, strict=True)]
        for prompt, answer, liked in list(zip(prompts, texts, met, strict=True))[: args.show]:
            print(f"  Q: {prompt}\n  A: {answer!r} -> {liked}")
        return sum(met) / len(met)

    base = judged(answers(base_dir, None, prompts, args.tokens))
    print(f"dataset {dataset.name}; base model: {base:.3f} of {len(prompts)} fresh prompts")
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, keep in (("every SFT target", None), ("edits only", EDIT_RULES)):
            rows = sft_rows(dataset, keep)
            with tempfile.TemporaryDirectory() as out:
                result = train_adapter(
                    recipe.model_copy(update={"seed": seed}), base_model_dir=base_dir,
                    rows=rows, output_dir=Path(out),
                )  # fmt: skip
                share = judged(answers(base_dir, result.adapter_dir, prompts, args.tokens))
            print(
                f"seed {seed}, {name} ({len(rows)} targets): {share:.3f} "
                f"({share - base:+.3f} over the base)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
