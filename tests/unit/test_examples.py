"""Signal → example rules, per-user caps, time splits and dataset manifests."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from feedback.cleaning import Funnel, build_splits
from feedback.datasets import (
    cap_per_key,
    cap_per_user,
    iter_manifests,
    manifests_with_user,
    split_by_time,
    user_cap,
    write_dataset,
)
from feedback.examples import build_examples, user_digest
from feedback.importers.hh_rlhf import pair_from_row, pairs_from_rows, read_hh_rlhf
from feedback.records import FeedbackRecord
from flywheel.settings.cleaning import DatasetSettings
from tests.conftest import shared_file

PROMPT = [{"role": "user", "content": "How do I return shoes?"}]


def record(rid: str, response: str, *feedback: dict[str, Any], **extra: Any) -> FeedbackRecord:
    events = [{"id": i + 1000 * len(rid), "rank": None, **f} for i, f in enumerate(feedback)]
    return FeedbackRecord.from_dict(
        {
            "request_id": rid,
            "user_id": extra.pop("user_id", "u1"),
            "business_line": "customer_service",
            "adapter_name": "customer_service-v3",
            "base_model": "base",
            "messages": extra.pop("messages", PROMPT),
            "response": response,
            "prompt_hash": extra.pop("prompt_hash", "p1"),
            "created_at": extra.pop("created_at", f"2026-11-01T00:00:{len(rid):02d}Z"),
            "feedback": events,
            "edit": extra.pop("edit", None),
            **extra,
        }
    )


def test_edit_gives_sft_and_a_pair() -> None:
    examples = build_examples(
        [record("a", "No.", {"type": "edit"}, edit="Open Orders, choose Return.")]
    )
    assert [e.rule for e in examples.sft] == ["edit"]
    assert examples.sft[0].completion == "Open Orders, choose Return."
    pair = examples.dpo[0]
    assert (pair.rule, pair.chosen, pair.rejected) == (
        "edit>original",
        "Open Orders, choose Return.",
        "No.",
    )
    assert pair.lineage.request_ids == ("a",)
    assert pair.lineage.model_versions == ("customer_service-v3",)
    assert examples.kto == []


def test_thumbs_up_beats_thumbs_down_and_regenerated_answers_to_the_same_prompt() -> None:
    records = [
        record("good", "Open Orders and choose Return.", {"type": "thumbs_up"}),
        record("bad", "Check the FAQ.", {"type": "thumbs_down"}, user_id="u2"),
        record("gone", "No idea.", {"type": "regenerate", "replaced_by": "good"}),
        record("other", "Unrelated.", {"type": "thumbs_down"}, prompt_hash="p2"),
    ]
    examples = build_examples(records)
    rules = sorted((e.rule, e.chosen, e.rejected) for e in examples.dpo)
    assert rules == [
        ("thumbs_up>regenerated", "Open Orders and choose Return.", "No idea."),
        ("thumbs_up>thumbs_down", "Open Orders and choose Return.", "Check the FAQ."),
    ]
    assert [e.rule for e in examples.sft] == ["thumbs_up"]
    # only the unpaired thumbs becomes a KTO label, and it stays a negative
    assert [(e.lineage.request_ids, e.label) for e in examples.kto] == [(("other",), False)]
    pair = next(e for e in examples.dpo if e.rule == "thumbs_up>thumbs_down")
    assert set(pair.lineage.users) == {user_digest("u1"), user_digest("u2")}
    assert set(pair.lineage.event_ids) == {4000, 3000}


def test_ranks_order_siblings() -> None:
    records = [
        record(f"r{rank}", f"answer {rank}", {"type": "rank", "rank": rank}) for rank in (2, 0, 1)
    ]
    pairs = build_examples(records).dpo
    assert sorted((p.chosen, p.rejected) for p in pairs) == [
        ("answer 0", "answer 1"),
        ("answer 0", "answer 2"),
        ("answer 1", "answer 2"),
    ]


def test_flood_of_one_prompt_is_capped() -> None:
    records = [record(f"u{i}", f"good {i}", {"type": "thumbs_up"}) for i in range(10)]
    records += [record(f"d{i}", f"bad {i}", {"type": "thumbs_down"}) for i in range(10)]
    assert len(build_examples(records, max_pairs_per_prompt=3).dpo) == 3


@pytest.mark.parametrize(
    ("counts", "share", "cap"),
    [
        ([1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 0.1, 1),
        ([50, 5, 5, 5, 5, 5, 5, 5, 5, 5], 0.2, 11),
        ([7], 0.1, 1),
    ],
)
def test_user_cap(counts: list[int], share: float, cap: int) -> None:
    assert user_cap(counts, share) == cap
    total = sum(min(n, cap) for n in counts)
    assert cap == 1 or cap <= share * total


def test_one_user_cannot_steer_a_bucket() -> None:
    records = [
        record(f"a{i}", f"answer {i}", {"type": "thumbs_up"}, prompt_hash=f"h{i}")
        for i in range(40)
    ]
    records += [
        record(f"b{i}", f"other {i}", {"type": "thumbs_up"}, prompt_hash=f"k{i}", user_id=f"v{i}")
        for i in range(10)
    ]
    kept, removed = cap_per_user(build_examples(records).sft, 0.2)
    owners = Counter(e.lineage.owner for e in kept)
    assert removed > 0
    assert max(owners.values()) <= 0.2 * len(kept)


def _thumbs_up(rid: str, user: str | None, key: str | None, second: int) -> FeedbackRecord:
    when = f"2026-11-01T00:{second // 60:02d}:{second % 60:02d}Z"
    return record(
        rid, f"answer {rid}", {"type": "thumbs_up"}, prompt_hash=f"h-{rid}", user_id=user,
        key_name=key, created_at=when, signal="thumbs_up",
    )  # fmt: skip


def test_a_keys_anonymous_examples_are_capped_as_one_user() -> None:
    anonymous = [_thumbs_up(f"anon{i}", None, "app", i) for i in range(40)]
    named = [_thumbs_up(f"named{i}", f"v{i}", "app", i) for i in range(10)]
    imported = [_thumbs_up(f"import{i}", None, None, i) for i in range(5)]
    funnel = Funnel()
    settings = DatasetSettings(max_user_share=0.2, eval_fraction=0)
    kept = build_splits(anonymous + named + imported, settings, funnel)["sft"]["train"]
    sources = Counter(e.lineage.request_ids[0].rstrip("0123456789") for e in kept)
    # The key's anonymous examples are one owner, within the share like any user.
    assert sources["anon"] <= 0.2 * (len(kept) - sources["import"])
    assert funnel.dropped["user_cap:sft"] >= 30
    # The named users keep theirs; an operator's import without users or keys is not capped.
    assert (sources["named"], sources["import"]) == (10, 5)


def test_a_key_posting_as_invented_users_holds_at_most_its_share() -> None:
    real = [_thumbs_up(f"real{i}", f"user-{i}", "app", i) for i in range(20)]
    sybils = [_thumbs_up(f"sybil{i}", f"sybil-{i}", "mallory", i) for i in range(30)]
    funnel = Funnel()
    splits = build_splits(real + sybils, DatasetSettings(eval_fraction=0), funnel)
    for kind in ("sft", "kto"):
        kept = splits[kind]["train"]
        held = sum(e.lineage.request_ids[0].startswith("sybil") for e in kept) / len(kept)
        assert held <= DatasetSettings().max_key_share
        assert sum(e.lineage.request_ids[0].startswith("real") for e in kept) == 20
        assert funnel.dropped[f"key_cap:{kind}"] == 10
    assert {e.lineage.keys for e in splits["sft"]["train"]} == {("app",), ("mallory",)}


def test_a_key_alone_on_a_line_is_not_capped_and_keeps_each_users_newest() -> None:
    alone = [_thumbs_up(f"a{i}", f"u{i % 5}", "app", i) for i in range(20)]
    assert cap_per_key(build_examples(alone).sft, 0.5) == (build_examples(alone).sft, 0)
    other = [_thumbs_up(f"b{i}", f"w{i}", "other", i) for i in range(5)]
    kept, removed = cap_per_key(build_examples(alone + other).sft, 0.5)
    assert removed == 15
    # What "app" keeps is spread over its five users, each user's newest example.
    mine = sorted(e.lineage.request_ids[0] for e in kept if e.lineage.keys == ("app",))
    assert mine == ["a15", "a16", "a17", "a18", "a19"]


def test_split_keeps_the_newest_for_eval() -> None:
    records = [
        record(
            f"x{i}",
            f"a{i}",
            {"type": "thumbs_up"},
            created_at=f"2026-11-{i + 1:02d}T00:00:00Z",
            prompt_hash=f"h{i}",
        )
        for i in range(20)
    ]
    split = split_by_time(build_examples(records).sft, 0.1)
    assert len(split["eval"]) == 2
    assert min(e.lineage.time for e in split["eval"]) > max(e.lineage.time for e in split["train"])


def test_dataset_files_manifest_and_forget_lookup(tmp_path: Path) -> None:
    records = [
        record("a", "No.", {"type": "edit"}, edit="Open Orders, choose Return.", user_id="alice"),
        record("b", "Fine answer", {"type": "thumbs_up"}, user_id="bob", prompt_hash="p9"),
    ]
    examples = build_examples(records)
    splits = {kind: split_by_time(items, 0.0) for kind, items in examples.by_kind().items()}
    build = write_dataset(
        tmp_path, "customer_service", splits, funnel={}, source={}, settings=DatasetSettings()
    )
    manifest = build.manifest
    assert manifest["counts"]["sft"] == {"train": 2, "eval": 0}
    assert set(manifest["files"]) == {"sft_train.parquet", "dpo_train.parquet", "kto_train.parquet"}
    table = pq.read_table(build.path / "dpo_train.parquet").to_pylist()
    assert table[0]["chosen"] == [{"role": "assistant", "content": "Open Orders, choose Return."}]
    assert table[0]["source_request_ids"] == ["a"]
    assert "alice" not in (build.path / "manifest.json").read_text()
    again = write_dataset(
        tmp_path, "customer_service", splits, funnel={}, source={}, settings=DatasetSettings()
    )
    assert again.path == build.path
    assert len(list(iter_manifests(tmp_path))) == 1
    assert manifests_with_user(tmp_path, "alice") == [build.path / "manifest.json"]
    assert manifests_with_user(tmp_path, "carol") == []


def test_hh_rlhf_pairs() -> None:
    good = {
        "chosen": "\n\nHuman: hi\n\nAssistant: hello",
        "rejected": "\n\nHuman: hi\n\nAssistant: go away",
    }
    pair = pair_from_row(good, 0)
    assert pair.as_row()["prompt"] == [{"role": "user", "content": "hi"}]  # type: ignore[union-attr]
    differs = {
        "chosen": "\n\nHuman: hi\n\nAssistant: a",
        "rejected": "\n\nHuman: yo\n\nAssistant: b",
    }
    assert "differ before the last answer" in pair_from_row(differs, 1).reason  # type: ignore[union-attr]


def test_hh_rlhf_file_keeps_2307_pairs_and_reports_5() -> None:
    pairs, malformed = pairs_from_rows(
        read_hh_rlhf(shared_file("hh-rlhf/harmless-base-test.jsonl.gz"))
    )
    assert len(pairs) == 2_307
    assert len(malformed) == 5
    assert {m.reason for m in malformed} == {
        "chosen and rejected conversations differ before the last answer"
    }


def test_task_outcomes_and_abandons_are_weighted_signals() -> None:
    examples = build_examples(
        [
            record(
                "s", "Open Orders and pick Return.", {"type": "task_outcome", "outcome": "success"}
            ),
            record(
                "f", "Try later.", {"type": "task_outcome", "outcome": "failure"}, prompt_hash="p2"
            ),
            record("ab", "Please hold.", {"type": "abandon"}, prompt_hash="p3"),
            record("up", "Choose Return in Orders.", {"type": "thumbs_up"}, prompt_hash="p4"),
            record("rg", "No idea.", {"type": "regenerate"}, prompt_hash="p4"),
        ]
    )
    assert [(e.rule, e.weight) for e in examples.sft] == [("task_success", 1.0), ("thumbs_up", 1.0)]
    (pair,) = examples.dpo
    assert (pair.rule, pair.chosen, pair.weight) == (
        "thumbs_up>regenerated",
        "Choose Return in Orders.",
        0.5,
    )
    kto = {e.lineage.request_ids[0]: (e.label, e.rule, e.weight) for e in examples.kto}
    assert kto == {
        "s": (True, "task_success", 1.0),
        "f": (False, "task_failure", 1.0),
        "ab": (False, "abandon", 0.25),
    }
    # A stronger signal wins over a weaker contrary one; equal ones cancel.
    mixed = build_examples(
        [
            record("m", "Maybe.", {"type": "thumbs_up"}, {"type": "abandon"}),
            record("t", "Hm.", {"type": "thumbs_up"}, {"type": "thumbs_down"}, prompt_hash="p9"),
        ]
    )
    assert [(e.label, e.rule) for e in mixed.kto] == [(True, "thumbs_up")]


def test_weighted_rows_repeat_strong_signals_more_often() -> None:
    from training.rows import TrainingRow, weighted_rows

    rows = [TrainingRow(prompt=str(i), weight=w) for i, w in enumerate([1.0] * 200 + [0.25] * 200)]
    out = weighted_rows(rows, copies_per_weight=2.0, seed=0)
    counts = Counter(int(r["prompt"]) < 200 for r in out)
    assert counts[True] == 400
    assert 60 < counts[False] < 140  # 0.5 copies each in expectation
    assert all("weight" not in r for r in out)
    assert weighted_rows(rows, 2.0, 0) == out


def test_accumulated_training_sets_never_train_on_held_out_examples(tmp_path: Path) -> None:
    from feedback.datasets import ACCUMULATED, accumulate, latest_dataset, line_builds

    def build(records: list[dict[str, Any]], day: int) -> Any:
        examples = build_examples(records)
        splits = {kind: split_by_time(items, 0.5) for kind, items in examples.by_kind().items()}
        for items in splits.values():
            for split in items.values():
                for i, e in enumerate(split):
                    lineage = e.lineage.__class__(
                        **{**_fields(e.lineage), "time": f"2026-11-{day:02d}T00:00:0{i}Z"}
                    )
                    split[i] = e.__class__(**{**_fields(e), "lineage": lineage})
        return write_dataset(
            tmp_path, "customer_service", splits, funnel={}, source={}, settings=DatasetSettings()
        )

    edits = [
        record(f"e{i}", f"No {i}.", {"type": "edit"}, edit=f"Open Orders {i}.", prompt_hash=f"h{i}")
        for i in range(4)
    ]
    first = build(edits, 1)
    second = build(
        [*edits[2:], record("z", "Zzz.", {"type": "edit"}, edit="Fixed.", prompt_hash="z")], 8
    )
    assert [b.content_hash for b in line_builds(tmp_path, "customer_service")] == [
        first.content_hash,
        second.content_hash,
    ]
    merged = accumulate(
        tmp_path, "customer_service", [first, second], horizon_days=30, half_life_days=7
    )
    assert merged.manifest[ACCUMULATED] == [first.content_hash, second.content_hash]
    train = pq.read_table(merged.path / "dpo_train.parquet").to_pylist()
    held = pq.read_table(merged.path / "dpo_eval.parquet").to_pylist()
    assert not {r["example_id"] for r in train} & {r["example_id"] for r in held}
    weights = {r["time"][:10]: r["weight"] for r in train}
    assert weights["2026-11-01"] == pytest.approx(0.5, abs=0.01)  # a week older: half
    assert latest_dataset(tmp_path, "customer_service").content_hash == second.content_hash
    short = accumulate(
        tmp_path, "customer_service", [first, second], horizon_days=3, half_life_days=7
    )
    assert short.manifest[ACCUMULATED] == [second.content_hash]


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}


def test_an_answer_that_invents_a_placeholder_gets_neutral_words_back() -> None:
    # Scrubbed answers where the model named someone ("Thanks, <PERSON_1>!") would teach
    # adapters to print the placeholder; a placeholder the prompt holds may be copied, one it
    # lacks gets a neutral word back, and the example is kept rather than dropped.
    named = [{"role": "user", "content": "I am <PERSON_1>, where is my parcel?"}]
    records = [
        record("a", "Thanks, <PERSON_1>! Your parcel ships today.", {"type": "thumbs_up"}),
        record("bb", "Sorry <PERSON_1>, it ships today.", {"type": "thumbs_up"}, messages=named),
        record("ccc", "No.", {"type": "edit"}, edit="Write to <EMAIL_ADDRESS_1> for returns."),
        record("dddd", "Ask <PERSON_2> at the desk.", {"type": "thumbs_down"}, prompt_hash="p2"),
    ]
    examples = build_examples(records)
    assert sorted(e.completion or "" for e in examples.sft) == [
        "Sorry <PERSON_1>, it ships today.",
        "Thanks! Your parcel ships today.",
        "Write to the email address for returns.",
    ]
    assert [(e.chosen, e.rejected) for e in examples.dpo] == [
        ("Write to the email address for returns.", "No.")
    ]
    assert sorted((e.completion or "", e.label) for e in examples.kto) == [
        ("Ask the customer at the desk.", False),
        ("Sorry <PERSON_1>, it ships today.", True),
        ("Thanks! Your parcel ships today.", True),
    ]
    assert examples.restored == Counter({"sft": 2, "dpo": 1, "kto": 2})
    assert not any(key.startswith("placeholder") for key in examples.dropped)


def _review(verdict: str, reviewer: str) -> dict[str, Any]:
    return {"type": "review", "outcome": verdict, "user_id": reviewer}


def test_reviewers_verdicts_label_the_answers_users_left_silent() -> None:
    """Where users gave no signal, the reviewers' majority verdict labels the answer: a pass
    is an SFT target and a KTO positive, a fail a KTO negative, each traced to the review
    events; a tie labels nothing, and a user's own signal wins over the reviewers'."""
    examples = build_examples(
        [
            record("passed", "Open Orders, choose Return.", _review("pass", "r1")),
            record(
                "failed",
                "No.",
                _review("fail", "r1"),
                _review("fail", "r2"),
                _review("pass", "r3"),
                prompt_hash="p2",
            ),
            record(
                "tied", "Maybe.", _review("pass", "r1"), _review("fail", "r2"), prompt_hash="p3"
            ),
            record(
                "user-wins",
                "Call us.",
                {"type": "thumbs_down"},
                _review("pass", "r1"),
                prompt_hash="p4",
            ),
        ]
    )

    assert [(e.rule, e.completion, e.weight) for e in examples.sft] == [
        ("review_pass", "Open Orders, choose Return.", 1.0)
    ]
    assert examples.sft[0].lineage.event_ids == (1000 * len("passed"),)
    labels = {e.lineage.request_ids[0]: (e.label, e.rule) for e in examples.kto}
    assert labels == {
        "passed": (True, "review_pass"),
        "failed": (False, "review_fail"),
        "user-wins": (False, "thumbs_down"),
    }
    assert examples.dpo == []
