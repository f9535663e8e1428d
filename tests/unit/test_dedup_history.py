"""Dedup across windows: a night does not train again on what an earlier night trained on.

Two windows of one line on the embedded store: the second holds a late thumbs-up on an
interaction the first trained on, a new interaction with the exact text of a trained
one, a near duplicate of a trained template (only its number differs), a late edit on a
trained interaction and a new interaction. The one-process and the partitioned stage
build the same dataset from it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from feedback.cleaning import CleaningResult, clean_line
from feedback.dedup.history import (
    EARLIER_CLUSTER,
    TRAINED_EARLIER,
    TrainedKeys,
    TrainingHistory,
    trained_reason,
)
from feedback.dedup.shuffle import bucket_shard
from feedback.partitions import (
    clean_partition,
    finish_partitions,
    partition_offsets,
    stage_history,
)
from feedback.records import FeedbackRecord
from feedback.signals import id_partitions
from feedback.store import FeedbackStore
from feedback.training_history import load_training_history, record_training
from flywheel.settings import Settings
from flywheel.settings.cleaning import CleaningSettings

LINE = "legal"
DAY1 = datetime(2026, 11, 1, 9, tzinfo=UTC)
UNTIL1 = datetime(2026, 11, 2, tzinfo=UTC)
DAY2 = datetime(2026, 11, 2, 9, tzinfo=UTC)
UNTIL2 = datetime(2026, 11, 3, tzinfo=UTC)
FIRST_NIGHT = {
    "req-late": ("How long does a tenant have to dispute a deposit deduction?", "Thirty days."),
    "req-edited": ("Can my landlord enter without notice?", "Only in an emergency."),
    "req-text": ("Is a verbal contract binding in court?", "Often, if it can be proven."),
    "req-flood-1": ("Status of case file 40417 for my lease dispute please", "It is pending."),
    "req-other-1": ("What does force majeure mean in a contract?", "Unforeseeable events."),
    "req-other-2": ("Who pays the notary fees for a house sale?", "Usually the buyer."),
}
SECOND_NIGHT = {
    "req-same-text": FIRST_NIGHT["req-text"],
    "req-flood-2": ("Status of case file 51822 for my lease dispute please", "It is pending."),
    "req-new": ("How do I register a trademark for my bakery?", "File with the office."),
}


def no_scrub(batch: list[FeedbackRecord]) -> list[FeedbackRecord]:
    return [replace(record, pii={}) for record in batch]


def interaction(request_id: str, prompt: str, answer: str, at: datetime) -> dict[str, Any]:
    return {
        "type": "interaction",
        "request_id": request_id,
        "user_id": f"user-{request_id}",
        "business_line": LINE,
        "base_model": "base",
        "messages": [{"role": "user", "content": prompt}],
        "response": answer,
        "created_at": at.isoformat(),
    }


def feedback(request_id: str, kind: str, at: datetime, **extra: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "request_id": request_id,
        "idempotency_key": f"{kind}:{request_id}",
        "created_at": at.isoformat(),
        **extra,
    }


def ingest(store: FeedbackStore, events: list[dict[str, Any]]) -> None:
    report = store.ingest(events, source="test")
    assert not report.rejections, report.rejections


@pytest.fixture
def store(settings: Settings) -> FeedbackStore:
    """The first night's traffic (the second night's comes after its run)."""
    opened = FeedbackStore.open(settings)
    events: list[dict[str, Any]] = []
    for minute, (request_id, (prompt, answer)) in enumerate(FIRST_NIGHT.items()):
        at = DAY1 + timedelta(minutes=minute)
        events.append(interaction(request_id, prompt, answer, at))
        if request_id != "req-late":
            events.append(feedback(request_id, "thumbs_up", at + timedelta(seconds=5)))
    # The first night trains on req-late through a thumbs-down...
    events.append(feedback("req-late", "thumbs_down", DAY1 + timedelta(hours=1)))
    ingest(opened, events)
    return opened


def second_night(store: FeedbackStore) -> None:
    events: list[dict[str, Any]] = []
    for minute, (request_id, (prompt, answer)) in enumerate(SECOND_NIGHT.items()):
        at = DAY2 + timedelta(minutes=minute)
        events.append(interaction(request_id, prompt, answer, at))
        events.append(feedback(request_id, "thumbs_up", at + timedelta(seconds=5)))
    # ...the second night pulls it back with a late task outcome; req-edited gets an edit.
    events.append(feedback("req-late", "task_outcome", DAY2, outcome="failure"))
    edit = "Only with 24 hours notice, or in an emergency."
    events.append(feedback("req-edited", "edit", DAY2, edited_text=edit))
    ingest(store, events)


def run_night(
    store: FeedbackStore, root: Path, since: datetime | None, until: datetime
) -> tuple[CleaningResult, TrainingHistory]:
    cleaning = CleaningSettings()
    history = load_training_history(
        store.engine,
        LINE,
        before=since,
        horizon_days=cleaning.trained_history_days,
        settings=cleaning.dedup,
    )
    result = clean_line(
        store.engine,
        LINE,
        scrub=no_scrub,
        settings=cleaning,
        dataset_root=root,
        since=since,
        until=until,
        history=history,
    )
    record_training(
        store.engine,
        LINE,
        since=since,
        until=until,
        trained=result.trained,
        settings=cleaning.dedup,
        horizon_days=cleaning.trained_history_days,
    )
    return result, history


def trained_ids(result: CleaningResult) -> set[str]:
    assert result.dataset is not None
    return {
        request_id
        for example in result.dataset.manifest["examples"]
        for request_id in example["source_request_ids"]
    }


def test_the_second_window_drops_what_the_first_trained_on(
    store: FeedbackStore, tmp_path: Path
) -> None:
    first, _ = run_night(store, tmp_path, None, UNTIL1)
    assert trained_ids(first) == set(FIRST_NIGHT)
    second_night(store)
    second, history = run_night(store, tmp_path, UNTIL1, UNTIL2)

    assert history.signals["req-late"] == "thumbs_down"
    kept = trained_ids(second)
    # The late outcome does not bring req-late back, nor does the same text in a new
    # interaction; the template's second case is over its cluster's cap across the nights.
    assert not kept & {"req-late", "req-same-text", "req-flood-2"}
    assert second.funnel.dropped[TRAINED_EARLIER] == 2
    assert second.funnel.dropped[EARLIER_CLUSTER] == 1
    # A new interaction is kept, and so is the edit: new text the user wrote.
    assert kept == {"req-new", "req-edited"}
    assert second.funnel.as_dict()["dropped"][TRAINED_EARLIER] == 2


def test_a_rerun_or_a_released_window_does_not_count_its_own_rows(
    store: FeedbackStore, tmp_path: Path
) -> None:
    run_night(store, tmp_path, None, UNTIL1)
    second_night(store)
    second, _ = run_night(store, tmp_path, UNTIL1, UNTIL2)
    # The same window again (after a crash, or released and widened): its rows from the
    # first try are not history, so it builds the same dataset.
    again, history = run_night(store, tmp_path, UNTIL1, UNTIL2)
    assert set(history.signals) == set(FIRST_NIGHT)
    assert again.dataset is not None
    assert second.dataset is not None
    assert again.dataset.content_hash == second.dataset.content_hash


def test_without_history_the_window_trains_on_everything_it_pulled(
    store: FeedbackStore, tmp_path: Path
) -> None:
    run_night(store, tmp_path, None, UNTIL1)
    second_night(store)
    alone = clean_line(
        store.engine,
        LINE,
        scrub=no_scrub,
        settings=CleaningSettings(),
        dataset_root=tmp_path,
        since=UNTIL1,
        until=UNTIL2,
    )
    assert {"req-late", "req-flood-2", "req-new"} <= trained_ids(alone)


@pytest.mark.parametrize(("parts", "shards"), [(1, 1), (3, 2)])
def test_the_partitioned_stage_agrees_across_windows(
    store: FeedbackStore, tmp_path: Path, parts: int, shards: int
) -> None:
    run_night(store, tmp_path / "first", None, UNTIL1)
    second_night(store)
    whole, history = run_night(store, tmp_path / "whole", UNTIL1, UNTIL2)
    cleaning = CleaningSettings()
    ranges = id_partitions(store.engine, LINE, parts, since=UNTIL1, until=UNTIL2)
    staging = tmp_path / "staging"
    summaries = [
        clean_partition(
            store.engine,
            LINE,
            ids=ids,
            since=UNTIL1,
            until=UNTIL2,
            scrub=no_scrub,
            settings=cleaning,
            staging=staging,
            partition=partition,
            shards=shards,
            trained=history.keys(),
        )
        for partition, ids in enumerate(ranges)
    ]
    staged = stage_history(
        staging, history, partition=len(ranges), shards=shards, settings=cleaning.dedup
    )
    assert staged == len(history.signed) > 0
    offsets = partition_offsets(summaries, history=staged)
    edges = [bucket_shard(staging, shard, offsets, cleaning.dedup) for shard in range(shards)]
    split = finish_partitions(
        staging,
        summaries,
        edges,
        business_line=LINE,
        settings=cleaning,
        dataset_root=tmp_path / "split",
        since=UNTIL1,
        until=UNTIL2,
        history=history,
    )
    assert split.funnel.as_dict() == whole.funnel.as_dict()
    assert split.dataset is not None
    assert whole.dataset is not None
    assert split.dataset.content_hash == whole.dataset.content_hash
    assert split.trained is not None
    assert whole.trained is not None
    assert split.trained.request_ids == whole.trained.request_ids


def test_only_a_new_edit_brings_a_trained_interaction_back() -> None:
    keys = TrainedKeys({"a": "thumbs_up", "b": "edit"}, frozenset({(7, 99)}))
    assert trained_reason("a", "task_failure", 1, 1, keys) == TRAINED_EARLIER
    assert trained_reason("a", "edit", 1, 1, keys) is None
    assert trained_reason("b", "edit", 1, 1, keys) == TRAINED_EARLIER
    assert trained_reason("c", "thumbs_up", 7, 99, keys) == TRAINED_EARLIER
    # The same text under another signal (scope) is not the same example.
    assert trained_reason("c", "thumbs_down", 8, 99, keys) is None
    assert trained_reason("c", "thumbs_up", 7, None, keys) is None


def test_forgetting_a_user_removes_their_rows_from_the_history(
    store: FeedbackStore, tmp_path: Path
) -> None:
    run_night(store, tmp_path, None, UNTIL1)
    store.forget_user("user-req-text")
    cleaning = CleaningSettings()
    history = load_training_history(
        store.engine, LINE, before=UNTIL1, horizon_days=90, settings=cleaning.dedup
    )
    assert set(history.signals) == set(FIRST_NIGHT) - {"req-text"}
