"""The cleaning stage for one business line: scrub, filter, dedup, build examples, cap, split.

Every step is a plain function over a list of feedback records (see
:mod:`feedback.signals`); :func:`clean_line` strings them together and counts,
per signal, what survives each step and why the rest was dropped. The
per-record work (:func:`scrub_and_filter`) is pure over a batch, so a flow can
map it over partitions.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine

from feedback.datasets import (
    DatasetBuild,
    DatasetSettings,
    cap_per_user,
    split_by_time,
    write_dataset,
)
from feedback.dedup import DedupSettings
from feedback.dedup.history import (
    SignedRecords,
    TrainingHistory,
    cluster_with_history,
    drop_trained,
    sign_records,
    window_verdicts,
)
from feedback.examples import ExampleKind, TrainingExample, build_examples
from feedback.signals import pull_records

ScrubBatch = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
SCRUBBED_FIELDS = ("messages", "response", "edit")
PLACEHOLDER = re.compile(r"<[A-Z][A-Z_]*_\d+>")
FUNNEL_STEPS = ("pulled", "filtered", "deduplicated", "in_training")


class CleaningSettings(BaseModel):
    """Settings of the cleaning stage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    datasets: DatasetSettings = Field(default_factory=DatasetSettings)
    dedup: DedupSettings = Field(default_factory=DedupSettings)
    scrub_batch_size: int = Field(default=256, ge=1, le=100_000)
    trained_history_days: float = Field(
        default=90.0,
        ge=0,
        le=3_650,
        description="Nights back whose trained records a window is deduplicated against "
        "(feedback.dedup.history); 0: each window alone.",
    )


@dataclass(slots=True)
class Funnel:
    """Per-signal counts after each step, dropped records by reason, PII found by type."""

    steps: dict[str, Counter[str]] = field(default_factory=dict)
    dropped: Counter[str] = field(default_factory=Counter)
    pii: Counter[str] = field(default_factory=Counter)
    examples: dict[str, int] = field(default_factory=dict)

    def count(self, step: str, records: Iterable[dict[str, Any]]) -> None:
        """Record how many records of each signal are left after ``step``."""
        self.steps[step] = Counter(r["signal"] for r in records)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, steps in pipeline order."""
        return {
            "steps": {
                step: dict(sorted(self.steps[step].items()))
                for step in FUNNEL_STEPS
                if step in self.steps
            },
            "dropped": dict(sorted(self.dropped.items())),
            "pii": dict(sorted(self.pii.items())),
            "examples": self.examples,
        }


def last_user_text(record: dict[str, Any]) -> str:
    """The newest user message of the prompt."""
    for message in reversed(record["messages"]):
        if message["role"] == "user":
            return str(message["content"])
    return ""


def drop_reason(record: dict[str, Any], min_prompt_chars: int) -> str | None:
    """Why a scrubbed record cannot be used for training, or ``None`` (pure)."""
    if record["status"] != "ok" or not record["response"].strip():
        return "failed_request"
    prompt = PLACEHOLDER.sub("", last_user_text(record))
    if len(re.sub(r"[\W_]+", "", prompt)) < min_prompt_chars:
        return "pii_only" if PLACEHOLDER.search(last_user_text(record)) else "empty_prompt"
    return None


def scrub_and_filter(
    records: list[dict[str, Any]], scrub: ScrubBatch, settings: CleaningSettings
) -> tuple[list[dict[str, Any]], Counter[str], Counter[str]]:
    """Scrub PII from a batch and drop unusable records (pure over the batch).

    Returns the kept records, dropped counts by reason, and PII counts by type.
    """
    scrubbed = scrub(records)
    kept: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    pii: Counter[str] = Counter()
    for record in scrubbed:
        pii.update(record.get("pii") or {})
        reason = drop_reason(record, settings.datasets.min_prompt_chars)
        if reason is None:
            kept.append(record)
        else:
            dropped[reason] += 1
    return kept, dropped, pii


def dedup_text(record: dict[str, Any]) -> str:
    """What dedup compares: the user's question and the answer it got."""
    return f"{last_user_text(record)}\n{record['response']}"


@dataclass(frozen=True, slots=True)
class DedupOutcome:
    """The records a window keeps after dedup, why the rest went, and the kept ones signed."""

    kept: list[dict[str, Any]]
    dropped: Counter[str]
    signed: SignedRecords


def deduplicate_window(
    records: list[dict[str, Any]], settings: DedupSettings, history: TrainingHistory | None = None
) -> DedupOutcome:
    """Drop what earlier windows trained on, then exact and near duplicates inside each
    business line and signal, earlier nights' records first in their clusters, then the
    earliest records (see :mod:`feedback.dedup.history`)."""
    history = history or TrainingHistory.empty(settings)
    signed = sign_records(
        [{**r, "dedup_text": dedup_text(r)} for r in records], field="dedup_text", settings=settings
    )
    rows, dropped = drop_trained(signed, history.keys())
    signed = signed.take(rows)
    fresh = [records[row] for row in rows.tolist()]
    decisions = cluster_with_history(signed, history.signed, settings)
    keep, duplicates = window_verdicts(decisions, len(fresh))
    dropped.update(duplicates)
    kept_rows = [row for row, flag in enumerate(keep) if flag]
    return DedupOutcome([fresh[row] for row in kept_rows], dropped, signed.take(kept_rows))


def deduplicate(
    records: list[dict[str, Any]], settings: DedupSettings
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Drop exact and near duplicates inside each business line and signal; earliest kept."""
    outcome = deduplicate_window(records, settings)
    return outcome.kept, outcome.dropped


def build_splits(
    records: list[dict[str, Any]], settings: DatasetSettings, funnel: Funnel
) -> dict[ExampleKind, dict[str, list[TrainingExample]]]:
    """Examples by kind, capped per user and split by time."""
    examples = build_examples(records, max_pairs_per_prompt=settings.max_pairs_per_prompt)
    splits: dict[ExampleKind, dict[str, list[TrainingExample]]] = {}
    used: set[str] = set()
    for kind, items in examples.by_kind().items():
        capped, removed = cap_per_user(items, settings.max_user_share)
        if removed:
            funnel.dropped[f"user_cap:{kind}"] += removed
        splits[kind] = split_by_time(capped, settings.eval_fraction)
        funnel.examples[kind] = len(capped)
        for example in capped:
            used.update(example.lineage.request_ids)
    funnel.count("in_training", (r for r in records if r["request_id"] in used))
    return splits


@dataclass(frozen=True, slots=True)
class CleaningResult:
    """What the cleaning stage produced for one line."""

    business_line: str
    funnel: Funnel
    dataset: DatasetBuild | None
    # The dataset's source records, signed: what the training history records for the night.
    trained: SignedRecords | None = None


def clean_records(
    records: list[dict[str, Any]],
    business_line: str,
    *,
    scrub: ScrubBatch,
    settings: CleaningSettings,
    dataset_root: Path,
    source: dict[str, Any],
    on_progress: Callable[[int], None] | None = None,
    history: TrainingHistory | None = None,
) -> CleaningResult:
    """Run every cleaning step on one line's records and write the dataset.

    With ``history`` (earlier nights' trained records), records already trained on and
    near duplicates past their cluster's cap over the nights are dropped too.
    """
    funnel = Funnel()
    funnel.count("pulled", records)
    kept: list[dict[str, Any]] = []
    size = settings.scrub_batch_size
    for start in range(0, len(records), size):
        chunk = records[start : start + size]
        batch, dropped, pii = scrub_and_filter(chunk, scrub, settings)
        kept.extend(batch)
        funnel.dropped.update(dropped)
        funnel.pii.update(pii)
        if on_progress is not None:
            on_progress(len(chunk))
    funnel.count("filtered", kept)
    outcome = deduplicate_window(kept, settings.dedup, history)
    funnel.dropped.update(outcome.dropped)
    return finish_dataset(
        outcome.kept, business_line, funnel, settings, dataset_root, source, outcome.signed
    )


def finish_dataset(
    unique: list[dict[str, Any]],
    business_line: str,
    funnel: Funnel,
    settings: CleaningSettings,
    dataset_root: Path,
    source: dict[str, Any],
    signed: SignedRecords | None = None,
) -> CleaningResult:
    """From deduplicated records to the written dataset (none when no example is left).

    ``signed`` holds the same records signed, in order; the result's ``trained`` keeps
    those that went into an example.
    """
    funnel.count("deduplicated", unique)
    splits = build_splits(unique, settings.datasets, funnel)
    if not any(split for by_split in splits.values() for split in by_split.values()):
        return CleaningResult(business_line, funnel, None)
    used = {
        request_id
        for by_split in splits.values()
        for examples in by_split.values()
        for example in examples
        for request_id in example.lineage.request_ids
    }
    trained = (
        signed.take([row for row, rid in enumerate(signed.request_ids) if rid in used])
        if signed is not None
        else None
    )
    build = write_dataset(
        dataset_root,
        business_line,
        splits,
        funnel=funnel.as_dict(),
        source=source,
        settings=settings.datasets,
    )
    return CleaningResult(business_line, funnel, build, trained)


def window_source(since: datetime | None, until: datetime | None, records: int) -> dict[str, Any]:
    """The ``source`` block of a manifest: the time window and how many records it held."""

    def iso(value: datetime | None) -> str | None:
        return None if value is None else value.isoformat().replace("+00:00", "Z")

    return {"since": iso(since), "until": iso(until), "records": records}


def scrub_with(scrubber: Any) -> ScrubBatch:
    """A batch scrubber over the record fields that hold user or model text."""
    from feedback.pii import scrub_records

    def scrub(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return scrub_records(batch, SCRUBBED_FIELDS, scrubber)

    return scrub


def clean_line(
    engine: Engine,
    business_line: str,
    *,
    scrub: ScrubBatch,
    settings: CleaningSettings,
    dataset_root: Path,
    since: datetime | None = None,
    until: datetime | None = None,
    on_progress: Callable[[int], None] | None = None,
    history: TrainingHistory | None = None,
) -> CleaningResult:
    """Pull one line's records from the store and run the cleaning stage on them."""
    records = list(pull_records(engine, business_line, since=since, until=until))
    return clean_records(
        records,
        business_line,
        scrub=scrub,
        settings=settings,
        dataset_root=dataset_root,
        source=window_source(since, until, len(records)),
        on_progress=on_progress,
        history=history,
    )
