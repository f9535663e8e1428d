"""The cleaning stage over partitions builds the dataset the one-process stage builds."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from feedback.cleaning import clean_line
from feedback.dedup.shuffle import bucket_shard
from feedback.partitions import clean_partition, finish_partitions, partition_offsets
from feedback.records import FeedbackRecord
from feedback.signals import id_partitions
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from flywheel.settings.cleaning import CleaningSettings
from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator

START = datetime(2026, 11, 1, tzinfo=UTC)


def no_scrub(batch: list[FeedbackRecord]) -> list[FeedbackRecord]:
    return [replace(record, pii={}) for record in batch]


@pytest.fixture
def store(settings: Settings) -> FeedbackStore:
    opened = FeedbackStore.open(settings)
    simulation = SimulationSettings(requests=1_500, seed=5, start=START, pii_share=0.0)
    opened.ingest(TrafficSimulator(simulation).events(), source="simulate")
    return opened


@pytest.mark.parametrize(("parts", "shards"), [(1, 1), (3, 2), (7, 3)])
def test_partitioned_cleaning_builds_the_same_dataset(
    store: FeedbackStore, tmp_path: Path, parts: int, shards: int
) -> None:
    cleaning = CleaningSettings()
    until = datetime(2026, 11, 1, 18, tzinfo=UTC)
    whole = clean_line(
        store.engine,
        "legal",
        scrub=no_scrub,
        settings=cleaning,
        dataset_root=tmp_path / "whole",
        until=until,
    )
    ranges = id_partitions(store.engine, "legal", parts, until=until)
    assert len(ranges) == parts
    assert all(low < high for low, high in ranges)
    staging = tmp_path / "staging"
    summaries = [
        clean_partition(
            store.engine,
            "legal",
            ids=ids,
            since=None,
            until=until,
            scrub=no_scrub,
            settings=cleaning,
            staging=staging,
            partition=partition,
            shards=shards,
        )
        for partition, ids in enumerate(ranges)
    ]
    offsets = partition_offsets(summaries)
    edges = [bucket_shard(staging, shard, offsets, cleaning.dedup) for shard in range(shards)]
    split = finish_partitions(
        staging,
        summaries,
        edges,
        business_line="legal",
        settings=cleaning,
        dataset_root=tmp_path / "split",
        since=None,
        until=until,
    )
    assert whole.dataset is not None
    assert split.dataset is not None
    assert split.funnel.as_dict() == whole.funnel.as_dict()
    assert split.funnel.dropped["near_duplicate"] > 0
    assert split.dataset.content_hash == whole.dataset.content_hash


def test_an_empty_window_has_no_partitions(store: FeedbackStore) -> None:
    assert id_partitions(store.engine, "legal", 4, until=START) == []
    assert id_partitions(store.engine, "nobody", 4) == []
