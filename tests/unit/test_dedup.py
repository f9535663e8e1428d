"""Exact and near-duplicate removal: normalisation, signatures, clustering, rules."""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from feedback.dedup import (
    ClusterForest,
    DecisionKind,
    DedupDecision,
    DedupInputError,
    assign_clusters,
    normalise_text,
    sign_text,
    sign_texts,
)
from flywheel.settings.cleaning import DedupSettings

SETTINGS = DedupSettings()


def decide(records: list[dict[str, Any]], **overrides: Any) -> list[DedupDecision]:
    return assign_clusters(records, field="text", settings=SETTINGS.model_copy(update=overrides))


def texts(*values: str) -> list[dict[str, Any]]:
    return [{"text": value} for value in values]


# --- normalisation ---------------------------------------------------------


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ("Hello,   World!", "hello world"),
        ("ＨＥＬＬＯ　ｗｏｒｌｄ", "hello world"),
        ("  I want\tto\ncancel  ", "i want to cancel"),
        ("你好，世界！", "你好 世界"),
        ("ｶﾀｶﾅ", "カタカナ"),
        ("Straße", "STRASSE"),
        ("order #12345", "ORDER 12345"),
    ],
)
def test_normalisation_makes_variants_equal(left: str, right: str) -> None:
    assert normalise_text(left) == normalise_text(right)


def test_punctuation_only_messages_keep_their_punctuation() -> None:
    assert normalise_text("?") != normalise_text("!")
    assert normalise_text("???") == normalise_text("？？？")


def test_numbers_stay_in_the_exact_form() -> None:
    assert normalise_text("order 12345") != normalise_text("order 67890")


def test_exact_duplicates_after_normalisation_cluster() -> None:
    decisions = decide(texts("Hello,   World!", "ＨＥＬＬＯ　ｗｏｒｌｄ", "hello world"))
    assert [d.keep for d in decisions] == [True, False, False]
    assert decisions[1].reason == "exact_duplicate_of:0"
    assert {d.cluster for d in decisions} == {0}


# --- near duplicates -------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("I want to cancel my order 12345", "I want to cancel my order 67890"),
        ("Where is my package? Tracking 1Z999AA101", "where is my package?? tracking 1Z888BB202"),
        (
            "Hi, this is John Smith. I can't log into my account, error code 4412.",
            "Hi, this is Maria Garcia. I can't log into my account, error code 1200.",
        ),
        (
            "The app crashes every time I open the settings page on my phone after the update",
            "The app crashes every time I open the settings page on my tablet after the update",
        ),
        ("我想取消订单12345", "我想取消订单67890"),
        (
            "你好，我是张伟，我的订单12345一直没有发货，请帮我查一下物流",
            "你好，我是王芳，我的订单98765一直没有发货，请帮我查一下物流",
        ),
    ],
)
def test_near_duplicates_in_english_and_chinese_are_found(first: str, second: str) -> None:
    decisions = decide(texts(first, second))
    assert decisions[0].keep
    assert not decisions[1].keep
    assert decisions[1].reason == "near_duplicate_of:0"


DISTINCT = [
    "I want to cancel my order",
    "I want to track my order",
    "How do I reset my password",
    "How do I change my email",
    "thanks!",
    "thanks, that fixed it",
    "the answer was wrong",
    "the answer was great",
    "Translate this sentence into French please",
    "Translate this sentence into German please",
    "Can you recommend a good book about history?",
    "Can you recommend a good movie about space?",
    "我想取消订单",
    "我想查询订单",
    "怎么修改密码",
    "怎么修改邮箱",
    "你好",
    "你好，请问怎么退款",
    "ok",
    "no",
]


def test_distinct_short_messages_are_not_merged() -> None:
    decisions = decide(texts(*DISTINCT))
    assert all(d.kind is DecisionKind.UNIQUE for d in decisions), [
        (DISTINCT[i], d.reason) for i, d in enumerate(decisions) if not d.keep
    ]


def test_template_flood_collapses_to_its_earliest_record() -> None:
    flood = [
        {"text": f"I want to cancel my order {number}", "created_at": 1000 - number}
        for number in range(50)
    ]
    decisions = decide([*flood, {"text": "How do I reset my password", "created_at": 0}])
    kept = [i for i, d in enumerate(decisions) if d.keep]
    assert kept == [49, 50]
    assert all(d.cluster == 49 for d in decisions[:50])


def test_exact_only_ignores_near_duplicates() -> None:
    decisions = decide(
        texts(
            "I want to cancel my order 1",
            "I want to cancel my order 2",
            "i want to CANCEL my order 1",
        ),
        near_duplicates=False,
    )
    assert [d.keep for d in decisions] == [True, True, False]


# --- which record is kept --------------------------------------------------


def test_earliest_record_is_kept_whatever_its_position() -> None:
    records = [
        {"text": "refund please", "created_at": "2024-03-02T10:00:00Z"},
        {"text": "Refund, please!", "created_at": "2024-03-01T10:00:00Z"},
        {"text": "refund please", "created_at": "2024-03-03T10:00:00Z"},
    ]
    decisions = decide(records)
    assert [d.keep for d in decisions] == [False, True, False]
    assert decisions[0].reason == "exact_duplicate_of:1"
    assert {d.cluster for d in decisions} == {1}


def test_time_zones_are_compared_as_instants_and_ties_go_to_input_order() -> None:
    records = [
        {"text": "refund please", "created_at": "2024-03-01T11:00:00+01:00"},
        {"text": "refund please", "created_at": "2024-03-01T10:00:00Z"},
        {"text": "refund please", "created_at": "2024-03-01T09:00:00-01:00"},
    ]
    assert [d.keep for d in decide(records)] == [True, False, False]


def test_records_without_a_time_come_after_timed_ones() -> None:
    records = [{"text": "refund please"}, {"text": "refund please", "created_at": 5}]
    assert [d.keep for d in decide(records)] == [False, True]


def test_flood_cap_keeps_the_n_earliest() -> None:
    records = [
        {"text": f"I want to cancel my order {number}", "created_at": number}
        for number in (9, 3, 7, 1, 5, 8)
    ]
    records.append({"text": "I want to cancel my order 3", "created_at": 10})
    decisions = decide(records, max_kept_per_cluster=3)
    assert [d.keep for d in decisions] == [False, True, False, True, True, False, False]
    assert decisions[3].kind is DecisionKind.FIRST_OF_CLUSTER
    assert decisions[1].reason == "within_flood_cap:3"
    assert decisions[0].reason == "flood_cap:3"
    assert decisions[6].reason == "exact_duplicate_of:1"


# --- scopes: business lines, signals, pairs --------------------------------


def test_business_lines_are_deduplicated_separately() -> None:
    records = [
        {"text": "reset my password", "business_line": "bank"},
        {"text": "reset my password", "business_line": "retail"},
        {"text": "reset my password"},
        {"text": "reset my password", "business_line": "default"},
        {"text": "reset my password", "business_line": "bank"},
    ]
    decisions = decide(records)
    assert [d.keep for d in decisions] == [True, True, True, False, False]
    assert decisions[3].cluster == 2
    assert decisions[4].cluster == 0


def test_negatives_survive_next_to_positive_twins() -> None:
    records = [
        {"text": "The answer is 42.", "signal": "thumbs_up", "created_at": 1},
        {"text": "The answer is 42.", "signal": "thumbs_down", "created_at": 2},
        {"text": "the answer is 42", "signal": "thumbs_down", "created_at": 3},
        {"text": "The answer is 42.", "label": False, "created_at": 4},
        {"text": "The answer is 42.", "label": True, "created_at": 5},
    ]
    decisions = decide(records)
    assert [d.keep for d in decisions] == [True, True, False, True, True]
    assert decisions[2].reason == "exact_duplicate_of:1"


def test_chosen_and_rejected_of_one_pair_are_never_merged() -> None:
    answer = "Sure, here is how to reset your password: open settings and choose reset."
    records = [
        {"text": answer, "pair_id": "p1", "role": "chosen"},
        {"text": answer, "pair_id": "p1", "role": "rejected"},
        {"text": answer, "pair_id": "p2", "role": "chosen"},
    ]
    decisions = decide(records)
    assert [d.keep for d in decisions] == [True, True, False]
    assert decisions[0].cluster != decisions[1].cluster


def test_pair_members_without_roles_are_still_kept_apart() -> None:
    answer = "Open settings, choose security and press reset password to get a link."
    records = [
        {"text": answer, "pair_id": 7},
        {"text": answer, "pair_id": 7},
        {"text": answer},
        {"text": answer + " Then check your inbox."},
    ]
    decisions = decide(records)
    assert decisions[0].cluster != decisions[1].cluster
    assert [d.keep for d in decisions[:3]] == [True, True, False]
    assert decisions[2].reason == "exact_duplicate_of:0"


# --- signatures --------------------------------------------------------------


def test_signature_of_a_text_does_not_depend_on_its_batch() -> None:
    batch = sign_texts(["hello world", None, "我想取消订单12345", "x " * 500], SETTINGS)
    for index, text in [(0, "hello world"), (2, "我想取消订单12345"), (3, "x " * 500)]:
        assert batch.row(index) == sign_text(text, SETTINGS)
    assert not batch.has_text[1]


def test_signature_of_a_huge_text_does_not_depend_on_how_it_is_chunked() -> None:
    words = [a + b + c + d + e for a, b, c, d, e in itertools.product("abcdefghij", repeat=5)]
    huge = " ".join(words[:40_000])
    batch = sign_texts(["some text before it " * 300, huge], SETTINGS)
    assert batch.row(1) == sign_text(huge, SETTINGS)


def test_signature_has_one_key_per_band_and_none_without_shingles() -> None:
    signature = sign_text("I want to cancel my order", SETTINGS)
    assert len(signature.band_keys) == SETTINGS.bands
    assert len(signature.fingerprint) == SETTINGS.num_perm
    assert sign_text("???", SETTINGS).band_keys == ()
    assert (
        sign_text("ＨＥＬＬＯ world", SETTINGS).exact_hash
        == sign_text("hello, world", SETTINGS).exact_hash
    )


def test_digits_are_masked_for_band_keys_only() -> None:
    first = sign_text("order 12345 is late", SETTINGS)
    second = sign_text("order 777 is late", SETTINGS)
    assert first.band_keys == second.band_keys
    assert first.exact_hash != second.exact_hash


def test_other_seed_gives_other_keys() -> None:
    other = SETTINGS.model_copy(update={"seed": 1})
    assert sign_text("hello world", SETTINGS).band_keys != sign_text("hello world", other).band_keys


# --- settings and input errors ----------------------------------------------


@pytest.mark.parametrize(
    "update",
    [
        {"bands": 64, "rows": 4},
        {"threshold": 0.2},
        {"threshold": 0},
        {"num_perm": 8},
        {"max_kept_per_cluster": 0},
        {"shingle_sizes": (0,)},
        {"unknown": 1},
    ],
)
def test_settings_reject_values_out_of_bounds(update: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        DedupSettings(**update)


def test_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        SETTINGS.threshold = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"text": 5}, "record 1: field 'text' is a number, expected a string"),
        ({"text": "a", "created_at": "yesterday"}, "not an ISO-8601 time"),
        ({"text": "a", "created_at": True}, "expected an ISO-8601 time or a number"),
    ],
)
def test_unreadable_records_are_named(record: dict[str, Any], message: str) -> None:
    with pytest.raises(DedupInputError, match=message):
        decide([{"text": "fine"}, record])


def test_missing_text_is_kept_on_its_own() -> None:
    decisions = decide([{"text": None}, {}, {"text": ""}, {"text": "  "}])
    assert [d.reason for d in decisions] == [
        "no_text",
        "no_text",
        "first_of_cluster",
        "exact_duplicate_of:2",
    ]


def test_empty_batch() -> None:
    assert decide([]) == []


# --- union-find --------------------------------------------------------------


def test_cluster_forest_roots_are_smallest_members_whatever_the_edge_order() -> None:
    edges = [(5, 4), (4, 3), (9, 8), (1, 3), (8, 0)]
    for order in (edges, edges[::-1]):
        forest = ClusterForest(10)
        for left, right in order:
            forest.join(np.array([left]), np.array([right]))
        assert forest.parent.tolist() == [0, 1, 2, 1, 1, 1, 6, 7, 0, 0]


# --- properties --------------------------------------------------------------

MESSAGES = [
    "cancel my order 1",
    "Cancel my order 2!",
    "reset password",
    "你好 世界",
    "好",
    "",
    "track my order",
]
record_strategy = st.fixed_dictionaries(
    {"text": st.sampled_from(MESSAGES)},
    optional={
        "business_line": st.sampled_from(["bank", "retail"]),
        "signal": st.sampled_from(["thumbs_up", "thumbs_down"]),
        "pair_id": st.sampled_from(["p1", "p2"]),
        "role": st.sampled_from(["chosen", "rejected"]),
        "created_at": st.integers(0, 5),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(record_strategy, max_size=25), cap=st.integers(1, 3))
def test_decisions_respect_the_rules(records: list[dict[str, Any]], cap: int) -> None:
    decisions = decide(records, max_kept_per_cluster=cap)
    assert len(decisions) == len(records)

    members: dict[int, list[int]] = defaultdict(list)
    for index, decision in enumerate(decisions):
        members[decision.cluster].append(index)

    def scope(record: dict[str, Any]) -> tuple[Any, ...]:
        return (
            record.get("business_line", "default"),
            record.get("signal"),
            record.get("role"),
        )

    def when(index: int) -> tuple[float, int]:
        return (records[index].get("created_at", float("inf")), index)

    for cluster, indices in members.items():
        kept = [i for i in indices if decisions[i].keep]
        assert len(kept) == min(cap, len(indices))
        assert cluster in indices
        assert decisions[cluster].keep
        assert len({scope(records[i]) for i in indices}) == 1
        pair_ids = [records[i]["pair_id"] for i in indices if "pair_id" in records[i]]
        assert len(pair_ids) == len(set(pair_ids))
        assert sorted(kept, key=when) == sorted(indices, key=when)[: len(kept)]
        for index in indices:
            if decisions[index].ref is not None:
                assert decisions[index].ref in indices

    exact_twins: dict[tuple[Any, ...], set[int]] = defaultdict(set)
    for index, record in enumerate(records):
        if "pair_id" not in record:
            key = (*scope(record), normalise_text(record["text"]))
            exact_twins[key].add(decisions[index].cluster)
    assert all(len(clusters) == 1 for clusters in exact_twins.values())
