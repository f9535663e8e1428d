"""Preference pairs files (HH-RLHF or trl rows) become ranked interactions, bad rows malformed."""

from __future__ import annotations

import gzip
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from feedback.events import validate_event
from feedback.examples import build_examples
from feedback.importers.pairs import (
    iter_pairs_file,
    pair_from_hh,
    pair_from_trl,
    pairs_items,
    parse_pair,
    read_pairs,
)
from feedback.jsonl import JsonlRecord, MalformedLine, iter_jsonl_lines
from feedback.records import FeedbackRecord
from tests.conftest import shared_file

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
HH = {
    "chosen": "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: How do I boil an egg?"
    "\n\nAssistant: Simmer it for nine minutes.",
    "rejected": "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: How do I boil an egg?"
    "\n\nAssistant: Eggs are overrated.",
}
TRL_TEXT = {"prompt": "What is 2 + 2?", "chosen": "4.", "rejected": "22."}
TRL_CHAT = {
    "prompt": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
    ],
    "chosen": [{"role": "assistant", "content": "Paris."}],
    "rejected": [{"role": "assistant", "content": "Lyon."}],
}


def lines(*rows: Any) -> list[bytes]:
    return [row if isinstance(row, bytes) else orjson.dumps(row) + b"\n" for row in rows]


def items(*rows: Any, pair_format: Any = None, line: str = "general") -> list[Any]:
    return list(
        pairs_items(
            iter_jsonl_lines(lines(*rows)),
            business_line=line,
            source_file="mine.jsonl",
            imported_at=NOW,
            pair_format=pair_format,
        )
    )


def test_an_hh_row_splits_into_the_shared_conversation_and_two_answers() -> None:
    pair = pair_from_hh(HH, 7)

    assert pair.prompt == (
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "How do I boil an egg?"},
    )
    assert (pair.chosen, pair.rejected, pair.source_row) == (
        "Simmer it for nine minutes.",
        "Eggs are overrated.",
        7,
    )


def test_trl_rows_take_strings_or_conversations() -> None:
    text = pair_from_trl(TRL_TEXT, 1)
    chat = pair_from_trl(TRL_CHAT, 2)

    assert text.prompt == ({"role": "user", "content": "What is 2 + 2?"},)
    assert (text.chosen, text.rejected) == ("4.", "22.")
    assert chat.prompt == tuple(TRL_CHAT["prompt"])
    assert (chat.chosen, chat.rejected) == ("Paris.", "Lyon.")


def test_the_format_is_guessed_per_row_unless_given() -> None:
    assert parse_pair(TRL_TEXT, 1).chosen == "4."
    assert parse_pair(HH, 2).chosen == "Simmer it for nine minutes."
    with pytest.raises(ValueError, match="missing 'prompt'"):
        parse_pair(HH, 3, "trl")
    with pytest.raises(ValueError, match="HH-RLHF row: no assistant turn"):
        parse_pair({"chosen": "a", "rejected": "b"}, 4, "hh")


def test_each_pair_is_two_interactions_on_one_prompt_ranked_0_and_1() -> None:
    events = items(TRL_CHAT)

    assert all(isinstance(e, JsonlRecord) and e.line_number == 1 for e in events)
    data = [e.data for e in events]
    assert [(d["type"], d.get("rank")) for d in data] == [
        ("interaction", None),
        ("rank", 0),
        ("interaction", None),
        ("rank", 1),
    ]
    chosen, rejected = data[0], data[2]
    assert chosen["messages"] == rejected["messages"] == TRL_CHAT["prompt"]
    assert (chosen["response"], rejected["response"]) == ("Paris.", "Lyon.")
    assert chosen["business_line"] == "general"
    assert chosen["metadata"] == {
        "source_file": "mine.jsonl",
        "source_line": 1,
        "format": "trl",
        "answer": "chosen",
    }
    assert data[1]["request_id"] == chosen["request_id"]
    assert data[3]["request_id"] == rejected["request_id"]
    for event in data:
        validate_event(event)  # every event is one the store accepts


def test_ids_are_deterministic_and_differ_per_line_and_pair() -> None:
    first, again = items(HH, TRL_TEXT), items(HH, TRL_TEXT)
    other_line = items(HH, TRL_TEXT, line="legal")

    ids = [e.data.get("request_id") for e in first]
    keys = [e.data.get("idempotency_key") for e in first if e.data["type"] == "rank"]
    assert ids == [e.data.get("request_id") for e in again]
    assert len(set(ids)) == 4
    assert len(set(keys)) == 4
    assert not set(ids) & {e.data.get("request_id") for e in other_line}


def test_the_pairs_become_dpo_pairs_by_the_rank_rule() -> None:
    records = []
    events = [e.data for e in items(HH, TRL_CHAT)]
    for interaction in (e for e in events if e["type"] == "interaction"):
        ranks = [
            e
            for e in events
            if e["type"] == "rank" and e["request_id"] == interaction["request_id"]
        ]
        records.append(
            FeedbackRecord.from_dict(
                interaction
                | {
                    "feedback": [
                        {"id": i, "type": "rank", "rank": r["rank"]} for i, r in enumerate(ranks)
                    ]
                }
            )
        )

    pairs = build_examples(records).dpo

    assert sorted((p.chosen, p.rejected, p.rule) for p in pairs) == [
        ("Paris.", "Lyon.", "rank"),
        ("Simmer it for nine minutes.", "Eggs are overrated.", "rank"),
    ]


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (b"{not json\n", "not valid JSON"),
        (b"[1, 2]\n", "expected a JSON object"),
        ({"chosen": "x"}, "HH-RLHF row: missing 'chosen' or 'rejected' text"),
        (
            {"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "\n\nHuman: z\n\nAssistant: c"},
            "HH-RLHF row: chosen and rejected conversations differ before the last answer",
        ),
        (
            {"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "\n\nHuman: a\n\nAssistant: b"},
            "HH-RLHF row: chosen and rejected answers are identical",
        ),
        (
            {"chosen": "\n\nHuman: a\n\nAssistant:", "rejected": "\n\nHuman: a\n\nAssistant: b"},
            "the chosen answer is empty",
        ),
        ({"prompt": "q", "chosen": "same", "rejected": "same"}, "answers are identical"),
        ({"prompt": "q", "chosen": "a"}, "trl row: missing 'rejected'"),
        ({"prompt": "", "chosen": "a", "rejected": "b"}, "'prompt' is empty"),
        (
            {"prompt": [{"role": "user", "content": 3}], "chosen": "a", "rejected": "b"},
            "prompt.0.content is missing or not a string",
        ),
        (
            {"prompt": [{"role": "robot", "content": "q"}], "chosen": "a", "rejected": "b"},
            "prompt.0.role 'robot'",
        ),
        (
            {"prompt": [{"role": "assistant", "content": "q"}], "chosen": "a", "rejected": "b"},
            "does not end with a user message",
        ),
        (
            {"prompt": "q", "chosen": [{"role": "user", "content": "a"}], "rejected": "b"},
            "chosen.0 has role 'user'",
        ),
        (
            {"prompt": "q", "chosen": "a", "rejected": [{"role": "assistant", "content": "b"}] * 2},
            "'rejected' must be a string or a list of one assistant message",
        ),
    ],
)
def test_a_bad_row_is_malformed_with_its_line_and_reason(row: Any, reason: str) -> None:
    found = items(TRL_TEXT, row, HH)

    malformed = [e for e in found if isinstance(e, MalformedLine)]
    assert len(malformed) == 1
    assert malformed[0].line_number == 2
    assert reason in malformed[0].reason
    assert malformed[0].raw == lines(row)[0]
    assert Counter(e.line_number for e in found if isinstance(e, JsonlRecord)) == {1: 4, 3: 4}


def test_plain_and_gzipped_files_read_the_same(tmp_path: Path) -> None:
    body = b"".join(lines(HH, b"\n", TRL_TEXT, b"oops\n"))
    plain, packed = tmp_path / "p.jsonl", tmp_path / "p.jsonl.gz"
    plain.write_bytes(body)
    packed.write_bytes(gzip.compress(body))

    def summary(path: Path) -> list[Any]:
        return [
            ("bad", p.line_number)
            if isinstance(p, MalformedLine)
            else (p[1].chosen, p[1].source_row)
            for p in read_pairs(iter_pairs_file(path))
        ]

    assert (
        summary(plain)
        == summary(packed)
        == [
            ("Simmer it for nine minutes.", 1),
            ("4.", 3),
            ("bad", 4),
        ]
    )


def test_the_shared_hh_file_yields_2303_pairs_and_9_bad_rows() -> None:
    path = shared_file("hh-rlhf/harmless-base-test.jsonl.gz")

    parsed = list(read_pairs(iter_pairs_file(path), "hh"))

    bad = [p for p in parsed if isinstance(p, MalformedLine)]
    assert len(parsed) - len(bad) == 2303
    assert Counter(p.reason for p in bad) == {
        "HH-RLHF row: chosen and rejected conversations differ before the last answer": 5,
        "the chosen answer is empty": 4,
    }
