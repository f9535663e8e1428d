"""Prefect flows: the nightly retraining of every business line.

The flow bodies read like a table of contents; the work is in ``composition.line_training``,
``flows.training`` (on a work pool when configured), ``composition.rollout`` and the
packages; the canary watch is ``flows.canary``. A line's nightly run holds the line's lease
in the store (one run per line at a time, whoever starts it), works on a fixed
window of the store (``feedback.watermarks``) and moves the watermark only when
it finishes; a rerun after a crash sees the same window, rebuilds the same
dataset and reuses the registered version by its hash instead of training again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, TypeVar

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.client.schemas.objects import State
from prefect.runtime import flow_run
from prefect.states import Failed
from prefect.task_runners import ThreadPoolTaskRunner

from composition.clients import clients_in_use, open_clients
from composition.line_training import TrainingStatus, TrainResult
from composition.nightly_report import (
    DEPLOY_STATUS,
    LineReport,
    LineStatus,
    describe_datasets,
    describe_line,
    describe_retention,
    describe_training,
)
from feedback.leases import LineBusyError, lease_owner, line_lease
from feedback.watermarks import LineWindow, WatermarkStore
from flywheel.settings import Settings, current_settings

logger = logging.getLogger(__name__)
ReportT = TypeVar("ReportT", dict[str, Any], list[dict[str, Any]])


def _now() -> datetime:
    return datetime.now(UTC)


@task(retries=2, retry_delay_seconds=5)
def open_window(settings: Settings, line: str) -> LineWindow:
    """The store window this run works on (the same one again after a crash)."""
    with open_clients(settings) as clients:
        return WatermarkStore(clients.store.engine).open_window(line, _now())


@task(retries=2, retry_delay_seconds=5)
def enforce_retention(settings: Settings, line: str) -> dict[str, Any]:
    """Replace the line's raw text older than its recipe's retention by its scrubbed text
    (or delete those rows); rows scrubbed on an earlier night are skipped."""
    from composition.recipes import apply_line_retention

    with open_clients(settings) as clients:
        scrub = clients.scrubber.scrub_records
        return apply_line_retention(settings, clients.store.engine, line, scrub).as_dict()


@task(retries=1, retry_delay_seconds=5)
def build_datasets(settings: Settings, line: str, window: LineWindow) -> dict[str, Any]:
    """Scrub, deduplicate (against what earlier windows trained on too) and bucket the
    window's records into SFT/DPO/KTO datasets; record what went in."""
    from composition.satisfaction import silent_labelling
    from feedback.cleaning import clean_window, scrub_with

    with open_clients(settings) as clients:
        result = clean_window(
            clients.store.engine,
            line,
            scrub=scrub_with(clients.scrubber),
            settings=settings.cleaning,
            dataset_root=settings.datasets_dir,
            since=window.since,
            until=window.until,
            labelling=silent_labelling(settings, clients, line),
        )
    return result.summary()


def build_datasets_on_workers(
    settings: Settings, line: str, window: LineWindow, workers: int, address: str | None
) -> dict[str, Any]:
    """The same stage as :func:`build_datasets`, spread over Dask worker processes."""
    from flows.cleaning import run_partitioned

    result = run_partitioned(
        settings,
        line,
        workers=workers,
        since=window.since,
        until=window.until,
        address=address,
        across_windows=True,
    )
    return {
        "dataset": result.dataset,
        "train_examples": result.train_examples,
        "funnel": result.funnel,
        "seconds": result.seconds,
    }


@task
def satisfaction_model(settings: Settings, line: str, dataset: str) -> dict[str, Any]:
    """Train the line's satisfaction model on its labelled answers, judge it on held-out ones
    and record it in MLflow (registered when it beats chance by the recipe's margin)."""
    from composition.satisfaction import train_satisfaction_model

    with open_clients(settings) as clients:
        return train_satisfaction_model(settings, clients, line, dataset, log=_run_logger().info)


@task
def train_and_gate(settings: Settings, line: str, dataset: str | None) -> TrainResult:
    """Train on the window's dataset (and the line's history, as the recipe says), evaluate
    against the champion, gate and register: here, or on the training work pool."""
    from flows.training import train

    if dataset is None:
        return TrainResult.skipped(line, "no new examples in this window")
    return train(settings, line, dataset)


@task(retries=2, retry_delay_seconds=10)
def hot_load_and_canary(settings: Settings, line: str, version: int) -> dict[str, Any]:
    """Load the version into every vLLM replica, probe it, start its canary."""
    from composition.rollout import deploy_canary

    with open_clients(settings) as clients:
        outcome = deploy_canary(settings, clients, line, version, settings.gateway.upstreams)
    return asdict(outcome)


@task(retries=2, retry_delay_seconds=5)
def close_window(settings: Settings, window: LineWindow, outcome: str, *, consumed: bool) -> None:
    """Move the watermark (or leave it, when the window was too small to use)."""
    with open_clients(settings) as clients:
        watermarks = WatermarkStore(clients.store.engine)
        if consumed:
            run = str(flow_run.get_id() or "")
            watermarks.close_window(window, run_id=run or None, outcome=outcome, now=_now())
        else:
            watermarks.release_window(window, outcome=outcome, now=_now())


@flow(name="flywheel-line-nightly", flow_run_name="nightly-{line}")
def line_nightly(
    line: str, workers: int | None = None, dask_address: str | None = None
) -> dict[str, Any] | State[Any]:
    """One business line: window → datasets → train/eval/gate/register → hot-load → canary.

    With more than one cleaning worker (``workers``, else the setting), the
    datasets stage runs on Dask: on ``dask_address``, else on a local cluster. The line's
    clients are built once, here, and are the ones its tasks use.
    """
    settings = current_settings()
    report = LineReport(line)
    owner = lease_owner()
    with open_clients(settings) as clients, clients_in_use(clients):
        try:
            with line_lease(WatermarkStore(clients.store.engine), line, owner):
                _run_line(
                    settings,
                    line,
                    report,
                    workers or settings.cleaning_workers,
                    dask_address or settings.dask_address,
                )
                # After the window's datasets are built: whatever the night's outcome, old
                # raw text goes (a failure here fails the flow run and is retried the next
                # night).
                started = time.monotonic()
                report.retention = enforce_retention(settings, line)
                report.seconds["retention"] = round(time.monotonic() - started, 2)
                _run_logger().info("%s", describe_retention(line, report.retention))
        except LineBusyError as exc:
            report.status, report.reason = LineStatus.BUSY, str(exc)
    _run_logger().info("%s", describe_line(report))
    _line_artifact(report)
    return _final_state(asdict(report), f"{line}: {report.reason}", report.status)


def _run_logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The logger of the run this code belongs to (its lines on that run's page in
    Prefect's UI), or this module's outside a run.

    A line's run is a subflow started inside the ``run_line`` task, where Prefect's
    ``get_run_logger`` answers the enclosing task's logger: the line's lines would land on
    the nightly's run. ``get_run_context`` tells the two apart.
    """
    from prefect.context import FlowRunContext, get_run_context
    from prefect.exceptions import MissingContextError
    from prefect.logging.loggers import flow_run_logger

    try:
        context = get_run_context()
    except MissingContextError:
        return logger
    if isinstance(context, FlowRunContext) and context.flow_run is not None:
        return flow_run_logger(context.flow_run, context.flow)
    return get_run_logger()


def _transient(exc: BaseException) -> bool:
    """A failure that may pass by itself (a replica or the store briefly away): the window
    stays open for a retry. Anything else would fail the same way again and closes it."""
    from sqlalchemy.exc import OperationalError

    from flywheel.errors import StoreUnavailableError
    from registry.vllm_admin import VllmUnavailableError

    return isinstance(
        exc,
        VllmUnavailableError
        | StoreUnavailableError
        | OperationalError
        | ConnectionError
        | TimeoutError,
    )


def _run_line(
    settings: Settings, line: str, report: LineReport, workers: int, dask_address: str | None
) -> None:
    from composition.rollout import live_canary_wait

    def timed(stage: str, started: float) -> None:
        report.seconds[stage] = round(time.monotonic() - started, 2)

    started = time.monotonic()
    window = open_window(settings, line)
    report.window_since = window.since.isoformat() if window.since else None
    report.window_until = window.until.isoformat()
    report.resumed = window.resumed
    timed("window", started)
    log = _run_logger()
    log.info(
        "%s: window %s → %s%s",
        line,
        report.window_since or "the beginning",
        report.window_until,
        " (resumed after an unfinished run)" if window.resumed else "",
    )
    live = live_canary_wait(settings, line)
    if live is not None:
        report.status, report.reason = LineStatus.CANARY_LIVE, live
        log.info("%s: skipped tonight: %s", line, live)
        close_window(settings, window, f"skipped: {live}", consumed=False)
        return
    try:
        _train_and_deploy(settings, line, window, report, workers, dask_address, timed)
    except Exception as exc:
        if _transient(exc):
            report.status = LineStatus.FAILED
            report.reason = f"{type(exc).__name__}: {exc} (will retry)"
            log.error("%s: failed: %s; its window stays open for the retry", line, report.reason)
            close_window(settings, window, f"failed, kept open: {report.reason}", consumed=False)
            raise
        # Deterministic: the same window would fail the same way every night. Close it as
        # failed so the next night starts clean (its data stays in the line's datasets).
        report.status, report.reason = LineStatus.FAILED, f"{type(exc).__name__}: {exc}"
        log.exception(
            "%s: failed: %s; its window is closed as failed (the same data would fail again)",
            line,
            report.reason,
        )
        close_window(settings, window, f"failed: {report.reason}", consumed=True)


def _train_and_deploy(
    settings: Settings,
    line: str,
    window: LineWindow,
    report: LineReport,
    workers: int,
    dask_address: str | None,
    timed: Callable[[str, float], None],
) -> None:
    """The line's stages in its window: datasets, satisfaction model, training and gate,
    hot-load and canary; the window closed with the outcome."""
    datasets = _datasets_stage(settings, line, window, report, workers, dask_address, timed)
    if datasets["dataset"] is not None:
        _satisfaction_stage(settings, line, datasets["dataset"], report, timed)
    started = time.monotonic()
    trained = train_and_gate(settings, line, datasets["dataset"])
    report.version, report.reason = trained.version, trained.reason
    timed("train_eval_gate_register", started)
    seconds = report.seconds["train_eval_gate_register"]
    _run_logger().info("%s", describe_training(line, trained, seconds))
    if trained.status is TrainingStatus.SKIPPED or trained.version is None:
        report.status = LineStatus.SKIPPED
        close_window(settings, window, f"skipped: {trained.reason}", consumed=False)
        return
    if not trained.promote:
        report.status = LineStatus.GATED_OUT
        close_window(settings, window, f"gated out: {trained.reason}", consumed=True)
        return
    _deploy_stage(settings, line, trained.version, report, timed)
    close_window(settings, window, f"{report.status}: {report.reason}", consumed=True)


def _datasets_stage(
    settings: Settings,
    line: str,
    window: LineWindow,
    report: LineReport,
    workers: int,
    dask_address: str | None,
    timed: Callable[[str, float], None],
) -> dict[str, Any]:
    """The window's datasets: in this process, or on Dask workers."""
    started = time.monotonic()
    if workers > 1 or dask_address:
        datasets = build_datasets_on_workers(settings, line, window, workers, dask_address)
    else:
        datasets = build_datasets(settings, line, window)
    report.examples = datasets["train_examples"]
    timed("datasets", started)
    _run_logger().info("%s", describe_datasets(line, datasets, report.seconds["datasets"]))
    for step, seconds in datasets.get("seconds", {}).items():
        report.seconds[f"datasets.{step}"] = seconds
    return datasets


def _satisfaction_stage(
    settings: Settings,
    line: str,
    dataset: str,
    report: LineReport,
    timed: Callable[[str, float], None],
) -> None:
    """The line's satisfaction model on the night's dataset; the night goes on without it."""
    started = time.monotonic()
    try:
        report.satisfaction_model = satisfaction_model(settings, line, dataset)
    except Exception as exc:  # the night goes on without it
        _run_logger().exception("%s: satisfaction model failed (the night goes on): %s", line, exc)
        report.satisfaction_model = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
    timed("satisfaction_model", started)


def _deploy_stage(
    settings: Settings,
    line: str,
    version: int,
    report: LineReport,
    timed: Callable[[str, float], None],
) -> None:
    """The gated version hot-loaded and on its canary (or why not), logged."""
    started = time.monotonic()
    deployed = hot_load_and_canary(settings, line, version)
    report.adapter = deployed["adapter"]
    report.status = DEPLOY_STATUS.get(deployed["status"], LineStatus.FAILED)
    report.reason = deployed["reason"]
    timed("hot_load_probe_canary", started)
    _run_logger().log(
        logging.ERROR if report.status is LineStatus.FAILED else logging.INFO,
        "%s: hot-load and canary of %s: %s: %s",
        line,
        report.adapter or f"v{version}",
        deployed["status"],
        report.reason,
    )


def _line_artifact(report: LineReport) -> None:
    lines = [
        f"# Nightly run of {report.business_line}: **{report.status}**",
        "",
        f"- window: {report.window_since or 'beginning'} → {report.window_until}"
        + (" (resumed after an unfinished run)" if report.resumed else ""),
        f"- training examples: {report.examples or 'none'}",
        f"- version: {report.version or '-'}; adapter: {report.adapter or '-'}",
        f"- why: {report.reason or '-'}",
        "- seconds by stage: "
        + (", ".join(f"{k} {v:g}" for k, v in report.seconds.items()) or "-"),
    ]
    create_markdown_artifact(
        key=f"nightly-{report.business_line.replace('_', '-')}",
        markdown="\n".join(lines),
        description=f"nightly run of {report.business_line}",
    )


@task
def run_line(line: str, workers: int | None, dask_address: str | None) -> dict[str, Any]:
    """A line's nightly run as a subflow (lines run in parallel threads); its report, also
    when the subflow ended Failed (one line failing must not stop the others)."""
    try:
        state = line_nightly(line, workers, dask_address, return_state=True)
        result = state.result(raise_on_failure=False)
        if isinstance(result, BaseException):
            raise result
    except Exception as exc:
        _run_logger().exception("%s: failed: %s: %s", line, type(exc).__name__, exc)
        failed = LineReport(line, status=LineStatus.FAILED, reason=f"{type(exc).__name__}: {exc}")
        return asdict(failed)
    return dict(result)


@flow(name="flywheel-nightly", task_runner=ThreadPoolTaskRunner(max_workers=4))
def nightly(
    lines: list[str] | None = None, workers: int | None = None
) -> list[dict[str, Any]] | State[Any]:
    """Every business line's nightly run, in parallel; a summary table as an artifact.

    With ``workers`` > 1 (else the ``cleaning_workers`` setting) and no Dask
    scheduler configured, one local cluster of that many worker processes
    serves the cleaning stage of every line.
    """
    settings = current_settings()
    chosen = lines or list(settings.business_lines)
    workers = workers or settings.cleaning_workers
    from flows.cleaning import dask_cluster

    with dask_cluster(workers, settings.dask_address) as address:
        futures = [run_line.submit(line, workers, address) for line in chosen]
        reports = [future.result() for future in futures]
    _run_logger().info(
        "nightly: %s", "; ".join(f"{r['business_line']} {r['status']}" for r in reports)
    )
    create_table_artifact(
        key="nightly-summary",
        table=[
            {k: r[k] for k in ("business_line", "status", "version", "adapter", "reason")}
            for r in reports
        ],
        description="what each line's nightly run did",
    )
    failed = [f"{r['business_line']}: {r['reason']}" for r in reports if r["status"] == "failed"]
    return _final_state(reports, "; ".join(failed), "failed" if failed else "done")


def _final_state(result: ReportT, reason: str, status: str) -> ReportT | State[Any]:
    """The flow run's result, as a Failed state when ``status`` says the night failed, so
    Prefect's UI and a deployment's run history show it red, not "Completed"; the result
    (the reports) stays readable from the state."""
    if status == LineStatus.FAILED:
        return Failed(message=f"failed: {reason}", data=result)
    return result


def run_nightly(lines: list[str] | None = None, workers: int | None = None) -> list[dict[str, Any]]:
    """The nightly flow's reports, whether its run ended Completed or Failed (a failed line
    fails the run in Prefect; its callers still read every line's report)."""
    state = nightly(lines=lines, workers=workers, return_state=True)
    reports: Any = state.result(raise_on_failure=False)
    if isinstance(reports, BaseException):
        raise reports
    return list(reports)
