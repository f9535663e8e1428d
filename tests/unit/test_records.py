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
from lab.simulation.stored_traffic import SignalRates, SimulationSettings, TrafficSimulator
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


def test_a_reviewers_correction_is_the_records_edit_and_says_so(settings: Settings) -> None:
    """A correction written on the feedback page is the record's edit, marked as the
    reviewer's (its examples count as the reviewers', not the users'); a user's edit is not
    marked, and of both the newer one is the edit."""
    store = FeedbackStore.open(settings)
    simulation = SimulationSettings(requests=20, seed=3, start=START, rates=SignalRates(edit=0.0))
    events = list(TrafficSimulator(simulation).events())
    interactions = [e for e in events if e["type"] == "interaction"]
    line = interactions[0]["business_line"]
    asked = [e for e in interactions if e["business_line"] == line][:2]
    later = datetime(2026, 11, 2, tzinfo=UTC)

    def review(request_id: str, text: str, minute: int) -> dict[str, object]:
        return {
            "type": "review", "request_id": request_id, "outcome": "fail", "edited_text": text,
            "metadata": {"reason": "wrong fix", "reviewer": "r1"},
            "idempotency_key": f"review:{request_id}",
            "created_at": later.replace(minute=minute).isoformat(),
        }  # fmt: skip

    corrected, edited = asked[0]["request_id"], asked[1]["request_id"]
    user_edit = {
        "type": "edit", "request_id": edited, "edited_text": "the user's text",
        "idempotency_key": f"edit:{edited}", "created_at": later.replace(minute=5).isoformat(),
    }  # fmt: skip
    report = store.ingest(
        [
            *events,
            review(corrected, "the reviewer's text", 1),
            review(edited, "older", 1),
            user_edit,
        ],
        source="simulate",
    )
    assert not report.quarantined
    records = {r.request_id: r for r in pull_records(store.engine, line)}
    store.close()
    assert (records[corrected].edit, records[corrected].edit_by_reviewer) == (
        "the reviewer's text",
        True,
    )
    assert (records[edited].edit, records[edited].edit_by_reviewer) == ("the user's text", False)
    plain = records[corrected].as_dict()
    assert plain["edit_by_reviewer"] is True
    assert FeedbackRecord.from_dict(plain) == records[corrected]
    rules = {e.rule for e in build_examples([records[corrected]]).sft}
    assert rules == {"correction"}
