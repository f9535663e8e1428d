"""The cleaning stage over partitions of a line's window, for a task runner to spread out.

:func:`clean_partition` pulls one range of interaction ids, scrubs and filters
it, writes the kept (scrubbed) records and their dedup signatures to a staging
folder; :func:`feedback.dedup.shuffle.bucket_shard` joins the buckets of one
shard; :func:`finish_partitions` joins the shards, keeps the survivors and
builds the dataset exactly as :func:`feedback.cleaning.clean_records` does.
Every function takes plain values and paths, so each can run in another
process; the staging folder must be shared by all of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine

from feedback.cleaning import (
    CleaningResult,
    CleaningSettings,
    Funnel,
    ScrubBatch,
    dedup_text,
    finish_dataset,
    scrub_and_filter,
    window_source,
)
from feedback.dedup.shuffle import join_shards, partition_dir, read_meta, sign_partition
from feedback.signals import pull_records

_RECORDS = "records.jsonl"


@dataclass(slots=True)
class PartitionSummary:
    """What one partition held, kept and dropped (before dedup)."""

    partition: int
    pulled: Counter[str] = field(default_factory=Counter)
    filtered: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    pii: Counter[str] = field(default_factory=Counter)

    @property
    def kept(self) -> int:
        """Records written to the staging folder."""
        return sum(self.filtered.values())


def clean_partition(
    engine: Engine,
    business_line: str,
    *,
    ids: tuple[int, int],
    since: datetime | None,
    until: datetime | None,
    scrub: ScrubBatch,
    settings: CleaningSettings,
    staging: Path,
    partition: int,
    shards: int,
) -> PartitionSummary:
    """Pull, scrub, filter and sign one partition; write its records and signatures."""
    summary = PartitionSummary(partition)
    kept: list[dict[str, Any]] = []
    batch: list[dict[str, Any]] = []

    def flush() -> None:
        records, dropped, pii = scrub_and_filter(batch, scrub, settings)
        kept.extend(records)
        summary.dropped.update(dropped)
        summary.pii.update(pii)
        batch.clear()

    for record in pull_records(engine, business_line, since=since, until=until, ids=ids):
        summary.pulled[record["signal"]] += 1
        batch.append(record)
        if len(batch) >= settings.scrub_batch_size:
            flush()
    if batch:
        flush()
    summary.filtered.update(r["signal"] for r in kept)
    folder = partition_dir(staging, partition)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / _RECORDS).open("wb") as out:
        for record in kept:
            out.write(orjson.dumps(record) + b"\n")
    sign_partition(
        [{**r, "dedup_text": dedup_text(r)} for r in kept],
        field="dedup_text",
        settings=settings.dedup,
        staging=staging,
        partition=partition,
        shards=shards,
    )
    return summary


def partition_offsets(summaries: list[PartitionSummary]) -> list[int]:
    """The global number of each partition's first kept record, then the total."""
    offsets = [0]
    for summary in sorted(summaries, key=lambda s: s.partition):
        offsets.append(offsets[-1] + summary.kept)
    return offsets


def _staged_records(staging: Path, partitions: int) -> Iterator[dict[str, Any]]:
    for partition in range(partitions):
        with (partition_dir(staging, partition) / _RECORDS).open("rb") as lines:
            for line in lines:
                yield orjson.loads(line)


def finish_partitions(
    staging: Path,
    summaries: list[PartitionSummary],
    edges: list[Any],
    *,
    business_line: str,
    settings: CleaningSettings,
    dataset_root: Path,
    since: datetime | None,
    until: datetime | None,
) -> CleaningResult:
    """Join the shards' edges, keep each cluster's survivors and write the dataset."""
    funnel = Funnel()
    summaries = sorted(summaries, key=lambda s: s.partition)
    for summary in summaries:
        funnel.steps.setdefault("pulled", Counter()).update(summary.pulled)
        funnel.steps.setdefault("filtered", Counter()).update(summary.filtered)
        funnel.dropped.update(summary.dropped)
        funnel.pii.update(summary.pii)
    funnel.steps.setdefault("pulled", Counter())
    funnel.steps.setdefault("filtered", Counter())
    decisions = join_shards(read_meta(staging, len(summaries)), edges, settings.dedup)
    funnel.dropped.update(d.kind.value.removesuffix("_of") for d in decisions if not d.keep)
    unique = [
        record
        for record, decision in zip(
            _staged_records(staging, len(summaries)), decisions, strict=True
        )
        if decision.keep
    ]
    pulled = sum(funnel.steps["pulled"].values())
    return finish_dataset(
        unique, business_line, funnel, settings, dataset_root, window_source(since, until, pulled)
    )
