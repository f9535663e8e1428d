"""OpenAssistant trees become interactions, thumbs, regenerations and ranks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from feedback.importers.business_rules import BusinessRules, load_business_rules
from feedback.importers.oasst import oasst_items
from feedback.jsonl import MalformedLine, iter_jsonl, iter_jsonl_lines
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from tests.conftest import shared_file

TREE = {
    "message_tree_id": "t1",
    "prompt": {
        "message_id": "p1",
        "role": "prompter",
        "lang": "en",
        "text": "My doctor prescribed something, what is a symptom of flu?",
        "replies": [
            {
                "message_id": "a1",
                "role": "assistant",
                "text": "Fever.",
                "rank": 1,
                "emojis": {"+1": 2, "-1": 1, "_skip_reply": 4},
                "replies": [
                    {
                        "message_id": "p2",
                        "role": "prompter",
                        "text": "Anything else?",
                        "replies": [{"message_id": "a3", "role": "assistant", "text": "Cough."}],
                    }
                ],
            },
            {"message_id": "a2", "role": "assistant", "text": "Fever and aches.", "rank": 0},
            {"message_id": "gone", "role": "assistant", "text": "x", "deleted": True},
        ],
    },
}


def events_of(*trees: object) -> list[dict[str, object]]:
    lines = [orjson.dumps(tree) + b"\n" for tree in trees]
    return [
        e
        for e in oasst_items(iter_jsonl_lines(lines), load_business_rules())
        if isinstance(e, dict)
    ]


def test_tree_to_events() -> None:
    events = events_of(TREE)
    kinds = Counter(e["type"] for e in events)
    assert kinds == {"interaction": 3, "thumbs_up": 2, "thumbs_down": 1, "regenerate": 1, "rank": 2}
    by_id = {e["request_id"]: e for e in events if e["type"] == "interaction"}
    assert by_id["oasst-a3"]["messages"] == [
        {"role": "user", "content": TREE["prompt"]["text"]},
        {"role": "assistant", "content": "Fever."},
        {"role": "user", "content": "Anything else?"},
    ]
    assert {e["business_line"] for e in by_id.values()} == {"medical"}
    regenerate = next(e for e in events if e["type"] == "regenerate")
    assert (regenerate["request_id"], regenerate["replaced_by"]) == ("oasst-a1", "oasst-a2")
    ranks = {e["request_id"]: e["rank"] for e in events if e["type"] == "rank"}
    assert ranks == {"oasst-a1": 1, "oasst-a2": 0}
    # every feedback event follows the interaction it names
    seen: set[object] = set()
    for event in events:
        if event["type"] == "interaction":
            seen.add(event["request_id"])
        else:
            assert event["request_id"] in seen


def test_reimport_produces_identical_events() -> None:
    assert events_of(TREE) == events_of(TREE)


def test_broken_tree_is_reported_with_its_path() -> None:
    broken = {"prompt": {"message_id": "p", "role": "prompter", "text": "hi", "replies": [{}]}}
    items = list(oasst_items(iter_jsonl_lines([orjson.dumps(broken)]), load_business_rules()))
    assert len(items) == 1
    assert isinstance(items[0], MalformedLine)
    assert "prompt.replies.0.message_id" in items[0].reason


def test_rules_are_configurable() -> None:
    rules = BusinessRules.model_validate(
        {"default": "support", "rules": [{"business_line": "health", "keywords": ["flu", "感冒"]}]}
    )
    assert rules.business_line_for("I have the flu") == "health"
    assert rules.business_line_for("我感冒了") == "health"
    assert rules.business_line_for("fluent in French") == "support"


def test_rules_reject_unknown_keys() -> None:
    with pytest.raises(ValueError, match="Extra inputs"):
        BusinessRules.model_validate({"defaults": "x"})


def test_en_100_tree_counts_and_reimport(settings: Settings) -> None:
    path: Path = shared_file("oasst/en_100_tree.jsonl")
    replies = reactions = 0
    for item in iter_jsonl(path):
        stack = [item.data["prompt"]]  # type: ignore[union-attr]
        while stack:
            node = stack.pop()
            stack.extend(node.get("replies") or [])
            if node["role"] == "assistant":
                replies += 1
                emojis = node.get("emojis") or {}
                reactions += emojis.get("+1", 0) + emojis.get("-1", 0)
    store = FeedbackStore.open(settings)
    rules = load_business_rules()
    store.ingest(oasst_items(iter_jsonl(path), rules), source=str(path))
    counts = store.stats()
    assert counts["interactions"] == replies == 687
    assert counts["events"]["thumbs_up"] + counts["events"]["thumbs_down"] == reactions == 1226
    report = store.ingest(oasst_items(iter_jsonl(path), rules), source=str(path))
    assert report.added == 0
    assert store.stats() == counts
