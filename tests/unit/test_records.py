"""The typed records between stages: what the store returns for a window, and their plain
forms at the edges (staging files, the scrubber, dedup, manifests, trl)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from feedback.cleaning import scrub_with
from feedback.datasets import ManifestExample, write_dataset
from feedback.events import Signal
from feedback.examples import build_examples
from feedback.records import FeedbackNote, FeedbackRecord
from feedback.signals import pull_records
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from flywheel.settings.cleaning import DatasetSettings
from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator
from training.rows import TrainingRow, training_rows, weighted_rows

START = datetime(2026, 11, 1, tzinfo=UTC)
RECORD_KEYS = [
    "request_id", "session_id", "user_id", "key_name", "business_line", "adapter_name",
    "adapter_version", "base_model", "messages", "response", "prompt_hash", "status",
    "source", "created_at", "feedback", "edit", "signal",
]  # fmt: skip


@pytest.fixture
def pulled(settings: Settings) -> list[FeedbackRecord]:
    store = FeedbackStore.open(settings)
    simulation = SimulationSettings(requests=300, seed=11, start=START, pii_share=0.3)
    store.ingest(TrafficSimulator(simulation).events(), source="simulate")
    records = [r for line in store.business_lines() for r in pull_records(store.engine, line)]
    store.close()
    return records


def test_the_store_returns_typed_records_whose_plain_form_round_trips(
    pulled: list[FeedbackRecord],
) -> None:
    assert pulled
    assert {type(r) for r in pulled} == {FeedbackRecord}
    assert all(isinstance(note, FeedbackNote) for r in pulled for note in r.feedback)
    assert {r.signal for r in pulled} > {Signal.NONE}
    for record in pulled:
        plain = record.as_dict()
        assert list(plain) == RECORD_KEYS
        assert plain["created_at"].endswith("Z")
        assert isinstance(plain["signal"], str)
        assert FeedbackRecord.from_dict(plain) == record


def test_scrubbing_returns_the_same_records_with_their_pii(
    pulled: list[FeedbackRecord],
) -> None:
    from feedback.pii import ScrubberSettings, build_scrubber

    batch = pulled[:40]
    scrubbed = scrub_with(build_scrubber(ScrubberSettings()), cache_texts=0)(batch)
    assert [r.request_id for r in scrubbed] == [r.request_id for r in batch]
    assert all(r.pii is not None for r in scrubbed)
    assert any(r.pii for r in scrubbed)
    assert all(r.pii is None for r in batch)  # the pulled records are left as they were
    for raw, clean in zip(batch, scrubbed, strict=True):
        assert (clean.feedback, clean.signal, clean.created_at) == (
            raw.feedback,
            raw.signal,
            raw.created_at,
        )
        assert FeedbackRecord.from_dict(clean.as_dict()) == clean


def test_manifest_entries_and_training_rows_read_back_as_written(
    pulled: list[FeedbackRecord], tmp_path: Path
) -> None:
    examples = build_examples(pulled)
    splits = {kind: {"train": items, "eval": []} for kind, items in examples.by_kind().items()}
    build = write_dataset(
        tmp_path, "customer_service", splits, funnel={}, source={}, settings=DatasetSettings()
    )
    entries = build.examples
    assert [e.as_dict() for e in entries] == build.manifest["examples"]
    assert [ManifestExample.from_dict(e.as_dict()) for e in entries] == entries
    for kind, items in examples.by_kind().items():
        if not items:
            continue
        rows = training_rows(build.path, kind)
        assert {type(r) for r in rows} == {TrainingRow}
        assert sorted(r.weight for r in rows) == sorted(e.weight for e in items)
        trl = weighted_rows(rows, copies_per_weight=1.0, seed=0)
        assert all("weight" not in row and "prompt" in row for row in trl)
