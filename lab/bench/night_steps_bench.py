"""How many steps a quiet night's set takes: one night's SFT set trained from the base model for
several step counts, each adapter judged on what the gate bounds (its general-set loss against
the base model's) and on what users want (fresh prompts judged by the simulated users).

    FLYWHEEL_HOME=<a loop's home> .venv/bin/python lab/bench/night_steps_bench.py \\
        --line medical [--dataset HASH] [--steps 10,24,48] [--prompts 100] [--seeds 0]

Reads the line's dataset (the oldest: a first night's, unless ``--dataset``) and its demo
recipe, trains the recipe's adapter once per step count (the recipe's learning rate and
schedule, the step count fixed), then answers the fresh prompts of ``flywheel loop``'s final
comparison with the base model and each adapter (greedy) and prints, per step count, the passes
over the weighted rows, the general-set loss against the base's (the gate's drift) and the
satisfied share against the base's, all measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def general_loss(base_dir: Path, adapter: Path | None) -> float:
    """The base model's (with ``adapter`` when given) loss on the gate's general set."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eval.offline import general_set_loss

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    return general_set_loss(model, tokenizer, name="adapter" if adapter else "base")


def main(argv: Sequence[str] | None = None) -> int:
    """Train one adapter per step count and seed, score, answer, judge, print."""
    from lab.bench.positive_noise_bench import (
        add_night_arguments,
        answers,
        load_night_set,
        sft_rows,
    )
    from training.rows import weighted_rows
    from training.train import train_adapter

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_night_arguments(parser, "medical")
    parser.add_argument("--steps", default="10,24,48", help="step counts, comma-separated")
    args = parser.parse_args(argv)
    night = load_night_set(args)
    if night is None:
        return 2
    dataset, recipe, base_dir, users, prompts = (
        night.dataset, night.recipe, night.base_dir, night.users, night.prompts,
    )  # fmt: skip

    def satisfied(texts: list[str]) -> float:
        met = [users.satisfied(args.line, p, a) for p, a in zip(prompts, texts, strict=True)]
        return sum(met) / len(met)

    rows = sft_rows(dataset, None)
    weighted = len(weighted_rows(rows, recipe.copies_per_weight, recipe.seed))
    per_pass = weighted / (recipe.batch_size * recipe.gradient_accumulation)
    base_loss = general_loss(base_dir, None)
    base = satisfied(answers(base_dir, None, prompts, args.tokens))
    print(
        f"dataset {dataset.name}: {len(rows)} SFT targets, {weighted} weighted rows "
        f"({per_pass:.1f} steps a pass); base model: general-set loss {base_loss:.3f}, "
        f"satisfied {base:.3f} of {len(prompts)} fresh prompts"
    )
    for seed in (int(s) for s in args.seeds.split(",")):
        for steps in (int(s) for s in args.steps.split(",")):
            fixed = recipe.model_copy(update={"seed": seed, "epochs": None, "max_steps": steps})
            with tempfile.TemporaryDirectory() as out:
                result = train_adapter(
                    fixed, base_model_dir=base_dir, rows=rows, output_dir=Path(out)
                )
                loss = general_loss(base_dir, result.adapter_dir)
                share = satisfied(answers(base_dir, result.adapter_dir, prompts, args.tokens))
            print(
                f"seed {seed}, {steps} steps ({steps / per_pass:.1f} passes, "
                f"{result.seconds:.0f} s): general-set loss {loss:.3f} "
                f"({loss / base_loss - 1:+.1%} over the base), satisfied {share:.3f} "
                f"({share - base:+.3f} over the base)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
