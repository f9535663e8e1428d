"""What training reads: a dataset's train split as typed rows, and the rows trl gets.

A dataset folder's ``{method}_train.parquet`` holds trl's columns of the method
beside lineage columns (:meth:`feedback.examples.TrainingExample.as_row`);
:func:`training_rows` reads the method's columns and the example's weight into
:class:`TrainingRow`. trl's trainers take no per-example weight, so
:func:`weighted_rows` repeats each row by its weight and hands the trainer
plain rows (``datasets.Dataset.from_list``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError

# trl's columns of each method: conversational (lists of role/content messages) or plain text.
TRAIN_COLUMNS = {
    "sft": ("prompt", "completion"),
    "dpo": ("prompt", "chosen", "rejected"),
    "kto": ("prompt", "completion", "label"),
}
Turns = str | list[dict[str, str]]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingRow:
    """One training example as a trainer reads it: the prompt, the method's answer columns
    (SFT ``completion``; DPO ``chosen`` and ``rejected``; KTO ``completion`` and ``label``)
    and how much it counts (its signal weight, times its recency in an accumulated set)."""

    prompt: Turns
    completion: Turns | None = None
    chosen: Turns | None = None
    rejected: Turns | None = None
    label: bool | None = None
    weight: float = 1.0

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> TrainingRow:
        """A row from a parquet row or a hand-made trl row; without a ``weight`` it counts 1,
        with an empty one 0."""
        if "prompt" not in row:
            raise FlywheelError(f"a training row needs a 'prompt' (got {', '.join(row)})")
        return cls(
            prompt=row["prompt"],
            completion=row.get("completion"),
            chosen=row.get("chosen"),
            rejected=row.get("rejected"),
            label=row.get("label"),
            weight=float(row.get("weight", 1.0) or 0.0),
        )

    def trl_row(self) -> dict[str, Any]:
        """The row as trl's trainers read it: the prompt and the answer columns it has."""
        row: dict[str, Any] = {"prompt": self.prompt}
        for name, value in (
            ("completion", self.completion),
            ("chosen", self.chosen),
            ("rejected", self.rejected),
            ("label", self.label),
        ):
            if value is not None:
                row[name] = value
        return row


def training_rows(dataset_dir: Path, method: str) -> list[TrainingRow]:
    """The train split of a dataset folder, only the columns trl needs and the weight."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    path = dataset_dir / f"{method}_train.parquet"
    if not path.exists():
        raise FlywheelError(
            f"{dataset_dir} has no {method.upper()} training examples ({path.name})"
        )
    columns = list(TRAIN_COLUMNS[method])
    table = pq.read_table(path)
    if "weight" in table.column_names:
        columns.append("weight")
    return [TrainingRow.from_dict(row) for row in table.select(columns).to_pylist()]


def weighted_rows(
    rows: Sequence[TrainingRow], copies_per_weight: float, seed: int
) -> list[dict[str, Any]]:
    """trl rows, each repeated by its weight: ``weight * copies_per_weight`` copies in
    expectation (stochastic rounding, seeded), at least one row overall; the weight is
    left out, since trl's trainers take no per-example weights."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for row in rows:
        expected = row.weight * copies_per_weight
        copies = int(expected) + (rng.random() < expected - int(expected))
        out += [row.trl_row()] * copies
    if not out and rows:
        out.append(rows[0].trl_row())
    rng.shuffle(out)
    return out
