"""Training rows turned round: a really worse adapter, for rehearsing a rollback
(``flywheel loop --bad-canary``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError
from training.train import training_rows


def _inverted(dataset_dir: Path, method: str) -> list[dict[str, Any]]:
    """The training rows with every preference turned round: chosen and rejected swapped,
    KTO labels flipped, and SFT trained on the answers users rejected (the worse side of
    every pair and every disliked answer) instead of the ones they wanted."""
    if method == "sft":
        return _rejected_answers(dataset_dir)
    rows = training_rows(dataset_dir, method)
    if method == "dpo":
        return [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in rows]
    return [{**r, "label": not r["label"]} for r in rows]


def _rejected_answers(dataset_dir: Path) -> list[dict[str, Any]]:
    """SFT rows whose completions are the answers users turned down: the worse side of
    every preference pair and every disliked answer, each with its example's weight."""
    rows: list[dict[str, Any]] = []
    for method in ("dpo", "kto"):
        if not (dataset_dir / f"{method}_train.parquet").exists():
            continue
        for row in training_rows(dataset_dir, method):
            if method == "kto" and row["label"]:
                continue
            answer = row["rejected"] if method == "dpo" else row["completion"]
            rows.append(
                {"prompt": row["prompt"], "completion": answer, "weight": row.get("weight", 1.0)}
            )
    if not rows:
        raise FlywheelError(
            f"{dataset_dir} holds no answer users turned down (no preference pair, no "
            "disliked answer): an inverted SFT adapter has nothing to learn from"
        )
    return rows
