"""Training rows turned round: a really worse adapter, for rehearsing a rollback
(``flywheel loop --bad-canary``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from flywheel.errors import FlywheelError
from training.rows import TrainingRow, training_rows


def _inverted(dataset_dir: Path, method: str) -> list[TrainingRow]:
    """The training rows with every preference turned round: chosen and rejected swapped,
    KTO labels flipped, and SFT trained on the answers users rejected (the worse side of
    every pair and every disliked answer) instead of the ones they wanted."""
    if method == "sft":
        return _rejected_answers(dataset_dir)
    rows = training_rows(dataset_dir, method)
    if method == "dpo":
        return [replace(r, chosen=r.rejected, rejected=r.chosen) for r in rows]
    return [replace(r, label=not r.label) for r in rows]


def _rejected_answers(dataset_dir: Path) -> list[TrainingRow]:
    """SFT rows whose completions are the answers users turned down: the worse side of
    every preference pair and every disliked answer, each with its example's weight."""
    rows: list[TrainingRow] = []
    for method in ("dpo", "kto"):
        if not (dataset_dir / f"{method}_train.parquet").exists():
            continue
        for row in training_rows(dataset_dir, method):
            if method == "kto" and row.label:
                continue
            answer = row.rejected if method == "dpo" else row.completion
            rows.append(TrainingRow(prompt=row.prompt, completion=answer, weight=row.weight))
    if not rows:
        raise FlywheelError(
            f"{dataset_dir} holds no answer users turned down (no preference pair, no "
            "disliked answer): an inverted SFT adapter has nothing to learn from"
        )
    return rows
