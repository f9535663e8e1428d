"""The cleaning stage over partitions of a line's window, for a task runner to spread out.

:func:`clean_partition` pulls one range of interaction ids, scrubs and filters
it, writes the kept (scrubbed) records and their dedup signatures to a staging
folder; :func:`feedback.dedup.shuffle.bucket_shard` joins the buckets of one
shard; :func:`finish_partitions` joins the shards, keeps the survivors and
builds the dataset exactly as :func:`feedback.cleaning.clean_records` does.
Earlier nights' trained records (:mod:`feedback.dedup.history`) take part as
one more partition after the window's, staged by :func:`stage_history`.
Every function takes plain values and paths, so each can run in another
process; the staging folder must be shared by all of them.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from sqlalchemy import Engine

from feedback.cleaning import (
    CleaningResult,
    Funnel,
    ScrubBatch,
    SilentLabelling,
    finish_dataset,
    scrub_and_filter_records,
    sign_feedback_records,
    window_source,
)
from feedback.dedup.history import (
    SignedRecords,
    TrainedKeys,
    TrainingHistory,
    drop_trained,
    history_times,
    window_verdicts,
)
from feedback.dedup.shuffle import (
    join_shards,
    partition_dir,
    read_meta,
    read_signatures,
    stage_signatures,
)
from feedback.records import FeedbackRecord
from feedback.signals import pull_records
from flywheel.settings.cleaning import CleaningSettings, DedupSettings

_RECORDS = "records.jsonl"

# A staging folder older than this is a killed run's: no run can still use it.
STALE_STAGING_S = 24 * 3600


@dataclass(slots=True)
class PartitionSummary:
    """What one partition held, kept and dropped (before dedup)."""

    partition: int
    pulled: Counter[str] = field(default_factory=Counter)
    filtered: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    pii: Counter[str] = field(default_factory=Counter)
    # Records written to the staging folder: filtered, less those trained on earlier.
    kept: int = 0
    # CPU seconds of this process spent on the partition: unlike wall time, barely moved
    # by other jobs on a shared machine.
    cpu_seconds: float = 0.0


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
    trained: TrainedKeys | None = None,
) -> PartitionSummary:
    """Pull, scrub, filter and sign one partition; write its records and signatures.

    Scrubbing and filtering are :func:`feedback.cleaning.scrub_and_filter_records`, as
    in the one-process stage (``settings.scrub_order`` included).

    With ``trained`` (the history's keys), records already trained on in an earlier
    window are dropped after the filter count, as in the one-process stage.
    """
    cpu_started = time.process_time()
    filtered = scrub_and_filter_records(
        pull_records(engine, business_line, since=since, until=until, ids=ids), scrub, settings
    )
    summary = PartitionSummary(
        partition, filtered.pulled, filtered.filtered, filtered.dropped, filtered.pii
    )
    kept = filtered.kept
    signed = sign_feedback_records(kept, settings.dedup)
    if trained is not None:
        rows, dropped = drop_trained(signed, trained)
        summary.dropped.update(dropped)
        signed = signed.take(rows)
        kept = [kept[row] for row in rows.tolist()]
    summary.kept = len(kept)
    folder = partition_dir(staging, partition)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / _RECORDS).open("wb") as out:
        for record in kept:
            out.write(orjson.dumps(record.as_dict()) + b"\n")
    stage_signatures(
        staging,
        partition,
        shards,
        times=signed.times,
        scopes=signed.scopes,
        signatures=signed.signatures,
        settings=settings.dedup,
    )
    summary.cpu_seconds = time.process_time() - cpu_started
    return summary


def stage_history(
    staging: Path, history: TrainingHistory, *, partition: int, shards: int, settings: DedupSettings
) -> int:
    """Stage the history's signatures as the partition after the window's (numbered
    ``partition``), placed before every new record; returns how many (none staged for 0)."""
    signed = history.signed
    if len(signed):
        stage_signatures(
            staging,
            partition,
            shards,
            times=history_times(len(signed)),
            scopes=signed.scopes,
            signatures=signed.signatures,
            settings=settings,
        )
    return len(signed)


def partition_offsets(summaries: list[PartitionSummary], history: int = 0) -> list[int]:
    """The global number of each partition's first kept record, then the total; with
    ``history`` staged records, their partition's first number comes before the total."""
    offsets = [0]
    for summary in sorted(summaries, key=lambda s: s.partition):
        offsets.append(offsets[-1] + summary.kept)
    if history:
        offsets.append(offsets[-1] + history)
    return offsets


def _staged_records(staging: Path, partitions: int) -> Iterator[FeedbackRecord]:
    for partition in range(partitions):
        with (partition_dir(staging, partition) / _RECORDS).open("rb") as lines:
            for line in lines:
                yield FeedbackRecord.from_dict(orjson.loads(line))


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
    history: TrainingHistory | None = None,
    labelling: SilentLabelling | None = None,
    scrub: ScrubBatch | None = None,
) -> CleaningResult:
    """Join the shards' edges, keep each cluster's survivors and write the dataset; with
    ``labelling``, the silent answers it is confident about join the training split, as in
    the one-process stage (:func:`feedback.cleaning.finish_dataset`).

    ``history`` must be the one staged by :func:`stage_history`, if any.
    """
    funnel = Funnel()
    summaries = sorted(summaries, key=lambda s: s.partition)
    for summary in summaries:
        funnel.steps.setdefault("pulled", Counter()).update(summary.pulled)
        funnel.steps.setdefault("filtered", Counter()).update(summary.filtered)
        funnel.dropped.update(summary.dropped)
        funnel.pii.update(summary.pii)
    funnel.steps.setdefault("pulled", Counter())
    funnel.steps.setdefault("filtered", Counter())
    staged = len(summaries) + (1 if history is not None and len(history.signed) else 0)
    decisions = join_shards(read_meta(staging, staged), edges, settings.dedup)
    new_count = sum(summary.kept for summary in summaries)
    keep, dropped = window_verdicts(decisions, new_count)
    funnel.dropped.update(dropped)
    unique: list[FeedbackRecord] = []
    request_ids: list[str] = []
    signals: list[str] = []
    for record, flag in zip(_staged_records(staging, len(summaries)), keep, strict=True):
        if flag:
            unique.append(record)
            request_ids.append(record.request_id)
            signals.append(record.signal.value)
    rows = np.flatnonzero(np.array(keep, dtype=np.bool_))
    signed = SignedRecords.empty(settings.dedup)
    if rows.size:
        scopes, signatures = read_signatures(staging, len(summaries), rows)
        times = read_meta(staging, len(summaries)).times[rows]
        signed = SignedRecords(tuple(request_ids), tuple(signals), scopes, times, signatures)
    pulled = sum(funnel.steps["pulled"].values())
    return finish_dataset(
        unique,
        business_line,
        funnel,
        settings,
        dataset_root,
        window_source(since, until, pulled),
        signed,
        labelling,
        scrub,
    )


@contextmanager
def staging_folder(root: Path, line: str) -> Iterator[Path]:
    """A fresh folder under ``root`` for one partitioned run of ``line``, removed when the
    block ends; the folders of runs killed outright over a day ago are removed first."""
    for stale in root.glob(f"{line}-*"):
        if time.time() - stale.stat().st_mtime > STALE_STAGING_S:
            shutil.rmtree(stale, ignore_errors=True)
    folder = root / f"{line}-{uuid.uuid4().hex[:12]}"
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
