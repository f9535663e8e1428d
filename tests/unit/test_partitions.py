"""The cleaning stage over partitions builds the dataset the one-process stage builds."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from feedback.cleaning import SilentLabelling, clean_line
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


def _score(records: list[FeedbackRecord]) -> list[float]:
    """A stand-in satisfaction model: a fixed score per answer text."""
    return [int(hashlib.sha256(r.response.encode()).hexdigest()[:4], 16) / 65535 for r in records]


def _sample(records: list[FeedbackRecord]) -> list[list[str]]:
    return [[f"{r.response} (take {i})" for i in range(3)] for r in records]


LABELLING = SilentLabelling(
    model="legal-satisfaction-v1", score=_score, confidence=0.8, max_share=0.5, weight=0.5,
    positives=True, sample=_sample, best_of_prompts=20, min_gap=0.3,
)  # fmt: skip


@pytest.mark.parametrize(
    ("parts", "shards", "labelling"),
    [(1, 1, None), (3, 2, None), (7, 3, None), (3, 2, LABELLING)],
)
def test_partitioned_cleaning_builds_the_same_dataset(
    store: FeedbackStore,
    tmp_path: Path,
    parts: int,
    shards: int,
    labelling: SilentLabelling | None,
) -> None:
    """The same dataset either way; with a satisfaction model, the same model labels and
    best-of-n examples too (the nightly's ``--workers`` learns from silence as well)."""
    cleaning = CleaningSettings()
    until = datetime(2026, 11, 1, 18, tzinfo=UTC)
    whole = clean_line(
        store.engine,
        "legal",
        scrub=no_scrub,
        settings=cleaning,
        dataset_root=tmp_path / "whole",
        until=until,
        labelling=labelling,
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
        labelling=labelling,
        scrub=no_scrub,
    )
    assert whole.dataset is not None
    assert split.dataset is not None
    assert split.funnel.as_dict() == whole.funnel.as_dict()
    assert split.funnel.dropped["near_duplicate"] > 0
    assert split.dataset.content_hash == whole.dataset.content_hash
    if labelling is not None:
        assert split.funnel.examples["model_labelled"] > 0
        assert split.funnel.examples["best_of_n"] > 0


def test_an_empty_window_has_no_partitions(store: FeedbackStore) -> None:
    assert id_partitions(store.engine, "legal", 4, until=START) == []
    assert id_partitions(store.engine, "nobody", 4) == []
