"""The --bad-canary adapter learns the opposite of what users asked for, for every method."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flywheel.errors import FlywheelError
from training.inverted import _inverted
from training.rows import TrainingRow

PROMPT = [{"role": "user", "content": "Where is my order?"}]


def _write(folder: Path, method: str, rows: list[dict[str, object]]) -> None:
    pq.write_table(pa.Table.from_pylist(rows), folder / f"{method}_train.parquet")


def test_sft_inverted_trains_on_the_answers_users_turned_down(tmp_path: Path) -> None:
    _write(
        tmp_path, "sft", [{"prompt": PROMPT, "completion": "Sorry, it ships today.", "weight": 1.0}]
    )
    _write(
        tmp_path,
        "dpo",
        [
            {
                "prompt": PROMPT,
                "chosen": "Sorry, it ships today.",
                "rejected": "No idea.",
                "weight": 0.5,
            }
        ],
    )
    _write(
        tmp_path,
        "kto",
        [
            {"prompt": PROMPT, "completion": "Ask someone else.", "label": False, "weight": 1.0},
            {
                "prompt": PROMPT,
                "completion": "Sorry, tracking is here.",
                "label": True,
                "weight": 1.0,
            },
        ],
    )
    rows = _inverted(tmp_path, "sft")
    assert {r.completion for r in rows} == {"No idea.", "Ask someone else."}
    assert all(r.prompt == PROMPT for r in rows)
    assert sorted(r.weight for r in rows) == [0.5, 1.0]


def test_dpo_and_kto_inverted_swap_the_preference(tmp_path: Path) -> None:
    _write(tmp_path, "dpo", [{"prompt": PROMPT, "chosen": "good", "rejected": "bad"}])
    _write(tmp_path, "kto", [{"prompt": PROMPT, "completion": "good", "label": True}])
    assert _inverted(tmp_path, "dpo") == [TrainingRow(prompt=PROMPT, chosen="bad", rejected="good")]
    assert _inverted(tmp_path, "kto")[0].label is False


def test_sft_inverted_without_any_rejected_answer_says_so(tmp_path: Path) -> None:
    _write(tmp_path, "sft", [{"prompt": PROMPT, "completion": "fine"}])
    with pytest.raises(FlywheelError, match="turned down"):
        _inverted(tmp_path, "sft")
