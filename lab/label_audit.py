"""How right a loop's training labels were: each example of a line's datasets judged by the
simulated users' hidden judgement, which the product never sees.

    .venv/bin/python lab/label_audit.py --home ~/.flywheel --line customer_service [--model]

For each dataset (one per night), the SFT targets, the KTO labels and the DPO pairs are
counted by the rule that made them (edit, thumbs_up, review_pass, model:...) and by whether
the user model is satisfied with the answer. With ``--model``, the satisfaction model the
nightly would fit on the newest dataset's labels is cross-validated as the nightly does, and
its out-of-fold AUC is given against those labels and against the hidden judgement.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_USERS = "lab.simulation.users:BuiltinUsers"


def _question(prompt: Sequence[dict[str, Any]]) -> str:
    asked = [str(m["content"]) for m in prompt if m.get("role") == "user"]
    return asked[-1] if asked else ""


def _answer(value: Any) -> str:
    if isinstance(value, list):
        return str(value[-1]["content"]) if value else ""
    return str(value or "")


def audit_dataset(path: Path, line: str, users: Any) -> Counter[tuple[str, str, str]]:
    """(kind, rule, verdict) counts: an SFT target or a KTO label is "right" when the
    hidden judgement agrees with it; a DPO pair says what its chosen and rejected are."""
    from eval.satisfaction_model import read_dataset_rows

    counts: Counter[tuple[str, str, str]] = Counter()
    for split in ("train", "eval"):
        rows = read_dataset_rows(path, split)
        for row in rows["sft"]:
            liked = users.satisfied(line, _question(row["prompt"]), _answer(row["completion"]))
            counts[("sft", row["rule"], "right" if liked else "wrong")] += 1
        for row in rows["kto"]:
            liked = users.satisfied(line, _question(row["prompt"]), _answer(row["completion"]))
            counts[("kto", row["rule"], "right" if liked == bool(row["label"]) else "wrong")] += 1
        for row in rows["dpo"]:
            question = _question(row["prompt"])
            chosen = users.satisfied(line, question, _answer(row["chosen"]))
            rejected = users.satisfied(line, question, _answer(row["rejected"]))
            verdict = f"chosen {'liked' if chosen else 'not liked'}, rejected " + (
                "liked" if rejected else "not liked"
            )
            counts[("dpo", row["rule"], verdict)] += 1
    return counts


def model_auc(settings: Any, path: Path, line: str, users: Any) -> str:
    """The nightly's cross-validated satisfaction model on ``path``'s labels: out-of-fold AUC
    against the labels and against the hidden judgement."""
    from eval.satisfaction import SatisfactionModelPolicy, roc_auc
    from eval.satisfaction_model import labelled_answers, read_dataset_rows
    from eval.satisfaction_training import out_of_fold_scores, reader_for
    from training.base_model import ensure_base_model

    rows: dict[str, list[dict[str, Any]]] = {"sft": [], "dpo": [], "kto": []}
    for split in ("train", "eval"):
        for kind, found in read_dataset_rows(path, split).items():
            rows[kind].extend(found)
    answers = labelled_answers(rows)
    labels = [a.label for a in answers]
    truth = [int(users.satisfied(line, _question(a.prompt), a.answer)) for a in answers]
    reader = reader_for(ensure_base_model(settings.models_dir, settings.base_model))
    features = reader.features([(a.prompt, a.answer) for a in answers])
    scores = out_of_fold_scores(reader.base_model, features, answers, SatisfactionModelPolicy())
    return (
        f"{len(answers)} labelled answers ({sum(labels)} labelled satisfied, {sum(truth)} "
        f"satisfying): out-of-fold AUC {roc_auc(scores, labels):.3f} against the labels, "
        f"{roc_auc(scores, truth):.3f} against the hidden judgement"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print the audit of every dataset of ``--line`` under ``--home``."""
    from feedback.datasets import line_builds
    from flywheel.settings import load_settings
    from lab.simulation.protocol import load_users

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, required=True, help="the loop's FLYWHEEL_HOME")
    parser.add_argument("--line", required=True)
    parser.add_argument("--users", default=DEFAULT_USERS, help="the loop's --users spec")
    parser.add_argument("--model", action="store_true", help="cross-validate the model too")
    args = parser.parse_args(argv)
    os.environ["FLYWHEEL_HOME"] = str(args.home)
    settings = load_settings()
    users = load_users(args.users)
    builds = sorted(
        line_builds(settings.datasets_dir, args.line), key=lambda b: b.manifest["created_at"]
    )
    if not builds:
        print(f"no dataset of {args.line} under {settings.datasets_dir}", file=sys.stderr)
        return 2
    for build in builds:
        print(f"{build.content_hash[:16]} ({build.manifest['created_at']})")
        audit = audit_dataset(build.path, args.line, users)
        for (kind, rule, verdict), count in sorted(audit.items()):
            print(f"  {kind:4} {rule:40} {verdict:32} {count}")
    if args.model:
        print(model_auc(settings, builds[-1].path, args.line, users))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
