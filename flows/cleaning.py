"""The cleaning stage of one line spread over partitions (``--workers N``).

Partitions of the line's window are scrubbed and signed in parallel tasks, the
dedup band keys are joined shard by shard in parallel tasks, and the flow
joins the shards and writes the dataset (see :mod:`feedback.partitions` and
:mod:`feedback.dedup.shuffle`). With a Dask task runner the tasks run in
worker processes, so the Presidio scrubbing, the bulk of the work, uses every
core; the result is the same dataset as the one-process stage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from prefect import flow, task

from composition.clients import Clients, build_clients, open_clients
from feedback.cleaning import CleaningResult, ScrubBatch, SilentLabelling
from feedback.dedup.history import TrainedKeys, TrainingHistory
from feedback.partitions import PartitionSummary, staging_folder
from feedback.store import FeedbackStore
from flywheel.settings import Settings, current_settings, settings_in_use
from flywheel.settings.cleaning import CleaningSettings, DedupSettings

PARTITIONS_PER_WORKER = 2


@cache
def _worker_clients(settings: Settings) -> Clients:
    # A worker process gets no client from the flow: it builds its own set, once per
    # process (and settings). Loading spaCy and the recognizers takes seconds.
    return build_clients(settings, migrate=False)


@cache
def _worker_scrub(settings: Settings, cache_texts: int) -> ScrubBatch:
    # The detection cache pays off across partitions and lines (system prompts, templated
    # answers): once per worker process. The cache keeps digests and offsets, never text.
    from feedback.cleaning import scrub_with

    return scrub_with(_worker_clients(settings).scrubber, cache_texts=cache_texts)


@task(retries=1, retry_delay_seconds=5)
def clean_partition_task(
    settings: Settings,
    line: str,
    ids: tuple[int, int],
    since: datetime | None,
    until: datetime | None,
    staging: Path,
    partition: int,
    shards: int,
    cleaning: CleaningSettings,
    trained: TrainedKeys | None = None,
) -> PartitionSummary:
    """Pull, scrub, filter and sign one partition of the line's window."""
    from feedback.partitions import clean_partition

    clients = _worker_clients(settings)
    try:
        return clean_partition(
            clients.store.engine,
            line,
            ids=ids,
            since=since,
            until=until,
            scrub=_worker_scrub(settings, cleaning.scrub_cache_texts),
            settings=cleaning,
            staging=staging,
            partition=partition,
            shards=shards,
            trained=trained,
        )
    finally:
        clients.close()  # the store's connections, after each partition; the scrubber stays


@task
def bucket_shard_task(
    staging: Path, shard: int, offsets: list[int], dedup: DedupSettings
) -> tuple[Any, Any]:
    """Join the dedup buckets of one shard; a spanning forest of what it joined."""
    from feedback.dedup.shuffle import bucket_shard

    return bucket_shard(staging, shard, offsets, dedup)


@dataclass(slots=True)
class PartitionedCleaning:
    """What the partitioned stage produced, with seconds per step."""

    dataset: str | None
    path: str | None
    train_examples: dict[str, int]
    funnel: dict[str, Any]
    partitions: int
    seconds: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(
        cls, result: CleaningResult, partitions: int, seconds: dict[str, float]
    ) -> PartitionedCleaning:
        """The stage's result as the nightly reads it."""
        summary = result.summary()
        path = str(result.dataset.path) if result.dataset else None
        return cls(
            summary["dataset"],
            path,
            summary["train_examples"],
            summary["funnel"],
            partitions,
            seconds,
        )


@flow(name="flywheel-clean-line", flow_run_name="clean-{line}")
def clean_line_partitioned(
    line: str,
    since: datetime | None = None,
    until: datetime | None = None,
    workers: int = 2,
    cleaning: CleaningSettings | None = None,
    across_windows: bool = False,
) -> PartitionedCleaning:
    """Partitions → scrub/filter/sign (parallel) → bucket shards (parallel) → join → dataset.

    ``across_windows`` (the nightly run, whose ``since`` is the watermark): dedup against
    what earlier windows trained on, and record what this one trains on. The settings are
    :func:`run_partitioned`'s (or, run as a deployment, the worker's environment): no
    parameter of this flow holds a secret; its clients are built here, once.
    """
    # Never a parameter: Prefect stores a flow run's parameters in its database and shows
    # them in its UI, and the settings hold the store's URL with its password.
    from composition.satisfaction import silent_labelling
    from feedback.cleaning import scrub_with

    settings = current_settings()
    with open_clients(settings) as clients:
        # The nightly's window learns from silence here as in one process (model labels,
        # best-of-n); the join runs in this process, where the model can load.
        labelling = silent_labelling(settings, clients, line) if across_windows else None
        return _clean_partitioned(
            settings,
            clients.store,
            line,
            since,
            until,
            workers,
            cleaning or settings.cleaning,
            across_windows=across_windows,
            labelling=labelling,
            scrub=scrub_with(clients.scrubber) if labelling is not None else None,
        )


def _clean_partitioned(
    settings: Settings,
    store: FeedbackStore,
    line: str,
    since: datetime | None,
    until: datetime | None,
    workers: int,
    cleaning: CleaningSettings,
    *,
    across_windows: bool,
    labelling: SilentLabelling | None = None,
    scrub: ScrubBatch | None = None,
) -> PartitionedCleaning:
    """The partitioned flow's stages (:func:`clean_line_partitioned`) on ``store``;
    ``labelling`` and ``scrub`` as :func:`feedback.partitions.finish_partitions` takes them."""
    from feedback.partitions import finish_partitions
    from feedback.signals import id_partitions

    seconds: dict[str, float] = {}
    started = time.monotonic()
    ranges = id_partitions(
        store.engine, line, workers * PARTITIONS_PER_WORKER, since=since, until=until
    )
    window = _Window(line, since, until, workers, cleaning)
    history = _history(store, window) if across_windows else None
    with staging_folder(settings.home / "staging", line) as staging:
        trained = history.keys() if history is not None else None
        summaries = _clean_partitions(settings, window, ranges, staging, trained)
        seconds["pull_scrub_sign"] = round(time.monotonic() - started, 2)
        seconds["pull_scrub_sign_cpu"] = round(sum(s.cpu_seconds for s in summaries), 2)
        started = time.monotonic()
        edges, staged = _join_shards(window, staging, summaries, history, bool(ranges))
        seconds["dedup_shards"] = round(time.monotonic() - started, 2)
        started = time.monotonic()
        result = finish_partitions(
            staging,
            summaries,
            edges,
            business_line=line,
            settings=cleaning,
            dataset_root=settings.datasets_dir,
            since=since,
            until=until,
            history=history if staged else None,
            labelling=labelling,
            scrub=scrub,
        )
        seconds["join_build_write"] = round(time.monotonic() - started, 2)
    if across_windows and until is not None:
        _record(store, window, result)
    return PartitionedCleaning.of(result, len(ranges), seconds)


@dataclass(frozen=True, slots=True)
class _Window:
    """The line's window the partitioned stage cleans, over ``workers`` shards."""

    line: str
    since: datetime | None
    until: datetime | None
    workers: int
    cleaning: CleaningSettings


def _history(store: FeedbackStore, window: _Window) -> TrainingHistory:
    """What earlier windows of the line trained on, within the history horizon."""
    from feedback.training_history import load_training_history

    return load_training_history(
        store.engine,
        window.line,
        before=window.since,
        horizon_days=window.cleaning.trained_history_days,
        settings=window.cleaning.dedup,
    )


def _record(store: FeedbackStore, window: _Window, result: CleaningResult) -> None:
    """What this window trains on, for the later windows' dedup."""
    from feedback.training_history import record_training

    assert window.until is not None
    record_training(
        store.engine,
        window.line,
        since=window.since,
        until=window.until,
        trained=result.trained,
        settings=window.cleaning.dedup,
        horizon_days=window.cleaning.trained_history_days,
    )


def _clean_partitions(
    settings: Settings,
    window: _Window,
    ranges: list[tuple[int, int]],
    staging: Path,
    trained: TrainedKeys | None,
) -> list[PartitionSummary]:
    """Every partition pulled, scrubbed, filtered and signed in parallel tasks."""
    futures = [
        clean_partition_task.submit(
            settings,
            window.line,
            ids,
            window.since,
            window.until,
            staging,
            partition,
            window.workers,
            window.cleaning,
            trained,
        )
        for partition, ids in enumerate(ranges)
    ]
    return [future.result() for future in futures]


def _join_shards(
    window: _Window,
    staging: Path,
    summaries: list[PartitionSummary],
    history: TrainingHistory | None,
    any_partition: bool,
) -> tuple[list[tuple[Any, Any]], int]:
    """The dedup buckets joined shard by shard in parallel tasks (with the earlier windows'
    training history staged beside them): each shard's edges, and the history staged."""
    from feedback.partitions import partition_offsets, stage_history

    staged = (
        stage_history(
            staging,
            history,
            partition=len(summaries),
            shards=window.workers,
            settings=window.cleaning.dedup,
        )
        if history is not None and any_partition
        else 0
    )
    offsets = partition_offsets(summaries, history=staged)
    futures = [
        bucket_shard_task.submit(staging, shard, offsets, window.cleaning.dedup)
        for shard in range(window.workers if any_partition else 0)
    ]
    return [future.result() for future in futures], staged


@contextmanager
def dask_cluster(workers: int, address: str | None = None) -> Iterator[str | None]:
    """A Dask scheduler address for the block: ``address`` as given, none for one worker,
    else a local cluster of ``workers`` processes that lives as long as the block."""
    if address or workers <= 1:
        yield address
        return
    with local_cluster(workers) as local:
        yield local


@contextmanager
def local_cluster(workers: int) -> Iterator[str]:
    """A local Dask cluster of ``workers`` single-threaded processes; its scheduler address."""
    from distributed import LocalCluster

    # No dashboard: its port may be taken and nothing here serves it. Worker processes hold
    # Prefect's client threads, so at close the nanny warns that it kills them after 4 s,
    # once all work is done: only errors are worth showing.
    with LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.ERROR,
    ) as cluster:
        yield cluster.scheduler_address


def run_partitioned(
    settings: Settings,
    line: str,
    *,
    workers: int,
    since: datetime | None = None,
    until: datetime | None = None,
    address: str | None = None,
    cleaning: CleaningSettings | None = None,
    across_windows: bool = False,
) -> PartitionedCleaning:
    """Run the partitioned cleaning flow on Dask workers: on the scheduler at ``address``,
    else on a local cluster of ``workers`` processes that lives as long as the run."""
    from prefect_dask import DaskTaskRunner

    with ExitStack() as stack:
        scheduler = address or stack.enter_context(local_cluster(workers))
        runner = DaskTaskRunner(address=scheduler)
        with settings_in_use(settings):
            return clean_line_partitioned.with_options(task_runner=runner)(
                line, since, until, workers, cleaning, across_windows
            )
