"""The ``flywheel`` command line: thin wrappers over the packages, errors turned into exit codes."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import orjson
import typer
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from cli.commands.buckets import buckets as buckets_command
from cli.commands.common import (
    clients,
    err,
    open_store,
    out,
    safe_url,
    with_clients,
)
from cli.commands.dedup import dedup as dedup_command
from cli.commands.delivery import adapters_app
from cli.commands.evaluate import evaluate as evaluate_command
from cli.commands.experiments import experiment_app
from cli.commands.placement import placement_app
from cli.commands.privacy import forget as forget_command
from cli.commands.privacy import retention_app
from cli.commands.reports import (
    build_datasets,
    cleaning_with,
    finish_ingest,
    parse_start,
    print_buckets,
    print_funnel,
    print_ingest_report,
    require_file,
)
from cli.commands.scrub import scrub as scrub_command
from cli.commands.serving import (
    canary_app,
    gateway_app,
    lifecycle_app,
    routes_app,
    serve_dashboard,
    serve_gateway,
)
from cli.commands.vllm import serve_vllm
from flows.deployments import CANARY_EVERY_S, NIGHTLY_CRON, SCHEDULE_TIMEZONE, TRAIN_LINE
from flywheel.errors import FlywheelError, StoreUnavailableError, UsageError
from flywheel.file_modes import private_home
from flywheel.settings import Settings, load_settings

if TYPE_CHECKING:
    from feedback.store import FeedbackStore

# The lab's commands (lab/commands), imported only when one of them runs or help lists them:
# the product never loads the lab on its own.
LAB_COMMANDS = ("demo", "loop", "simulate")


class _CommandsWithLab(TyperGroup):
    """flywheel's commands, then the lab's, each of those loaded when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *LAB_COMMANDS]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in LAB_COMMANDS:
            return super().get_command(ctx, cmd_name)
        from lab.commands import lab_app

        group = typer.main.get_command(lab_app)
        assert isinstance(group, click.Group | TyperGroup)
        return group.get_command(ctx, cmd_name)


app = typer.Typer(
    cls=_CommandsWithLab,
    name="flywheel",
    help="Turn user feedback on an LLM service into better LoRA adapters, safely.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_app = typer.Typer(help="The feedback store's schema.", no_args_is_help=True)
import_app = typer.Typer(help="Import feedback from files.", no_args_is_help=True)
datasets_app = typer.Typer(
    help="Training datasets built from cleaned feedback.", no_args_is_help=True
)
app.add_typer(datasets_app, name="datasets")
app.callback()(with_clients)
serve_app = typer.Typer(help="Run flywheel's services locally.", no_args_is_help=True)
app.add_typer(serve_app, name="serve")
app.add_typer(db_app, name="db")
app.add_typer(import_app, name="import")
app.command("dedup")(dedup_command)
app.command("scrub")(scrub_command)
app.add_typer(canary_app, name="canary")
app.add_typer(routes_app, name="routes")
app.add_typer(lifecycle_app, name="lifecycle")
app.add_typer(gateway_app, name="gateway")
app.add_typer(placement_app, name="placement")
app.add_typer(experiment_app, name="experiment")
app.add_typer(adapters_app, name="adapters")
serve_app.command("gateway")(serve_gateway)
serve_app.command("dashboard")(serve_dashboard)
serve_app.command("vllm")(serve_vllm)
app.command("buckets")(buckets_command)
app.command("eval")(evaluate_command)
app.command("forget")(forget_command)
app.add_typer(retention_app, name="retention")


def _settings() -> Settings:
    return load_settings()


def _open_store(settings: Settings) -> FeedbackStore:
    return open_store(settings)


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Option(help="Target revision.")] = "head") -> None:
    """Apply the store's migrations (every other command also does this on first use)."""
    from feedback.store import create_store_engine, current_revision, upgrade_schema

    settings = _settings()
    private_home(settings.home)
    engine = create_store_engine(
        settings.resolved_database_url, connect_timeout_s=settings.store.connect_timeout_s
    )
    try:
        upgrade_schema(engine, revision)
        out.print(f"store at revision {current_revision(engine)}")
    finally:
        engine.dispose()


@db_app.command("current")
def db_current() -> None:
    """Print the store's migration revision."""
    from feedback.store import create_store_engine, current_revision, head_revision

    settings = _settings()
    private_home(settings.home)
    engine = create_store_engine(
        settings.resolved_database_url, connect_timeout_s=settings.store.connect_timeout_s
    )
    try:
        out.print(f"current: {current_revision(engine) or '(empty)'}  head: {head_revision()}")
    finally:
        engine.dispose()


@db_app.command("rebuild-rollup")
def db_rebuild_rollup() -> None:
    """Recount the feedback page's hourly signal counts from the raw tables.

    Needed only after a write transaction stayed open longer than the rollup's grace
    period (2 minutes), whose rows the incremental fold may have passed over.
    """
    from feedback.rollup import SignalRollup, rebuild_rollup

    store = _open_store(_settings())
    rebuild_rollup(store.engine)
    with out.status("recounting every interaction and feedback event"):
        folded = SignalRollup(store.engine).refresh(force=True)
    out.print(
        f"rollup rebuilt: {folded:,} rows folded (rows of the last 2 minutes are counted live "
        "until a later fold)"
    )


@import_app.command("jsonl")
def import_jsonl(
    path: Annotated[
        Path, typer.Argument(help="JSONL file in flywheel's event format (.jsonl or .jsonl.gz).")
    ],
) -> None:
    """Import flywheel JSONL events; bad lines are quarantined with their reason."""
    from feedback.jsonl import iter_jsonl
    from flywheel.progress import progress_bar

    require_file(path)
    store = _open_store(_settings())
    with progress_bar(f"importing {path.name}") as advance:
        report = store.ingest(iter_jsonl(path), source=str(path), on_progress=advance)
    finish_ingest(report)


@import_app.command("oasst")
def import_oasst(
    path: Annotated[
        Path,
        typer.Argument(help="OpenAssistant trees, one JSON tree a line (.jsonl or .jsonl.gz)."),
    ],
    rules: Annotated[
        Path | None, typer.Option(help="YAML rules mapping a tree to a business line.")
    ] = None,
) -> None:
    """Import OpenAssistant conversation trees as interactions, thumbs, regenerations, ranks."""
    from feedback.importers.business_rules import load_business_rules
    from feedback.importers.oasst import oasst_items
    from feedback.jsonl import iter_jsonl
    from flywheel.progress import progress_bar

    require_file(path)
    if rules is not None:
        require_file(rules)
    business_rules = load_business_rules(rules)
    store = _open_store(_settings())
    with progress_bar(f"importing {path.name}") as advance:
        report = store.ingest(
            oasst_items(iter_jsonl(path), business_rules), source=str(path), on_progress=advance
        )
    finish_ingest(report)


@import_app.command("pairs")
def import_pairs(
    path: Annotated[
        Path, typer.Argument(help="Preference pairs, one JSON row a line (.jsonl or .jsonl.gz).")
    ],
    line: Annotated[str, typer.Option(help="Business line the pairs belong to.")] = "general",
    pair_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="hh (HH-RLHF transcripts) or trl (prompt, chosen, rejected); "
            "default: trl for rows with a prompt, else hh.",
        ),
    ] = None,
) -> None:
    """Import preference pairs as ranked answers (two interactions, rank 0 and 1, per pair);
    malformed rows are quarantined with their line number, the rest imported."""
    import re

    from feedback.events import BUSINESS_LINE
    from feedback.importers.pairs import PAIR_FORMATS, iter_pairs_file, pairs_items
    from flywheel.progress import progress_bar

    require_file(path)
    if pair_format is not None and pair_format not in PAIR_FORMATS:
        raise UsageError(f"unknown --format {pair_format!r}: use {' or '.join(PAIR_FORMATS)}")
    if not re.fullmatch(BUSINESS_LINE, line):
        raise UsageError(f"--line {line!r} is not a business line name")
    store = _open_store(_settings())
    items = pairs_items(
        iter_pairs_file(path),
        business_line=line,
        source_file=path.name,
        imported_at=datetime.now(UTC),
        pair_format=pair_format,  # type: ignore[arg-type]
    )
    # A file that cannot be read to the end stops the import with exit 2 (InputFileError),
    # the batches before it stored.
    with progress_bar(f"importing {path.name}") as advance:
        report = store.ingest(items, source=str(path), on_progress=advance)
    # Unlike a feedback log, a pairs file with a few bad rows is still worth importing.
    print_ingest_report(report)


@app.command()
def stats(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Counts of interactions and feedback signals, overall and per business line."""
    counts = _open_store(_settings()).stats()
    if as_json:
        sys.stdout.write(orjson.dumps(counts, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    print_buckets(counts)


@app.command()
def quarantine(
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """List quarantined records, newest first, with the reason each was refused."""
    rows = _open_store(_settings()).quarantined(limit=limit, offset=offset)
    if as_json:
        for row in rows:
            row["raw"] = row["raw"].decode("utf-8", "backslashreplace")
            row["created_at"] = row["created_at"].isoformat()
            sys.stdout.write(orjson.dumps(row).decode() + "\n")
        return
    table = Table(title=f"quarantine ({len(rows)} shown)")
    for column in ("id", "source", "line", "record", "field", "reason", "raw"):
        table.add_column(column, overflow="fold")
    for row in rows:
        raw = row["raw"].decode("utf-8", "backslashreplace")
        table.add_row(
            str(row["id"]),
            row["source"],
            str(row["line_number"] or ""),
            row["record_key"] or "",
            row["field"] or "",
            row["reason"],
            raw[:120] + ("..." if len(raw) > 120 else ""),
        )
    out.print(table)


@datasets_app.command("build")
def datasets_build(
    line: Annotated[
        list[str] | None, typer.Option("--line", help="Business line (repeatable; default: all).")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Only signals at or after this ISO time.")
    ] = None,
    eval_fraction: Annotated[float, typer.Option(min=0, max=0.9)] = 0.1,
    max_user_share: Annotated[float, typer.Option(min=0.001, max=1.0)] = 0.1,
    workers: Annotated[
        int,
        typer.Option(
            min=1, max=256, help="Dask worker processes (partitioned cleaning); 1: in-process."
        ),
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Scrub, filter, dedup and turn each line's feedback into SFT, DPO and KTO datasets."""
    settings = _settings()
    store = _open_store(settings)
    known = store.business_lines()
    lines = line or known
    unknown = sorted(set(lines) - set(known))
    if unknown:
        raise UsageError(f"no interactions for business line(s): {', '.join(unknown)}")
    start = parse_start(since) if since else None
    if workers > 1:
        rows = _build_datasets_on_workers(
            settings,
            lines,
            workers=workers,
            eval_fraction=eval_fraction,
            max_user_share=max_user_share,
            since=start,
        )
    else:
        rows = _build_datasets_here(settings, store, lines, eval_fraction, max_user_share, start)
    if as_json:
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    for row in rows:
        print_funnel(row["business_line"], row["funnel"])
        out.print(f"  dataset: {row['dataset'] or 'no examples, nothing written'}")


def _build_datasets_here(
    settings: Settings,
    store: FeedbackStore,
    lines: list[str],
    eval_fraction: float,
    max_user_share: float,
    since: datetime | None,
) -> list[dict[str, Any]]:
    """Each line's datasets built in this process: its funnel and the dataset written."""
    return [
        {
            "business_line": r.business_line,
            "funnel": r.funnel.as_dict(),
            "dataset": str(r.dataset.path) if r.dataset else None,
            "content_hash": r.dataset.content_hash if r.dataset else None,
        }
        for r in build_datasets(
            settings,
            store,
            lines,
            eval_fraction=eval_fraction,
            max_user_share=max_user_share,
            since=since,
        )
    ]


def _build_datasets_on_workers(
    settings: Settings,
    lines: list[str],
    *,
    workers: int,
    eval_fraction: float,
    max_user_share: float,
    since: datetime | None,
) -> list[dict[str, Any]]:
    from flows.prefect_env import configure_prefect

    configure_prefect(settings)
    from flows.cleaning import dask_cluster, run_partitioned

    cleaning = cleaning_with(settings, eval_fraction, max_user_share)
    rows = []
    with dask_cluster(workers, settings.dask_address) as address:
        for name in lines:
            with out.status(Text(f"cleaning {name} on {workers} Dask workers")):
                result = run_partitioned(
                    settings, name, workers=workers, since=since, address=address, cleaning=cleaning
                )
            rows.append(
                {
                    "business_line": name,
                    "funnel": result.funnel,
                    "dataset": result.path,
                    "content_hash": result.dataset,
                    "seconds": result.seconds,
                }
            )
    return rows


@app.command()
def train(
    line: Annotated[str, typer.Argument(help="Business line to train.")],
    force: Annotated[
        bool, typer.Option(help="Train even if this dataset and recipe are already registered.")
    ] = False,
) -> None:
    """Train, evaluate against the champion, gate and register a line's adapter."""
    _train_and_report(_settings(), line, force=force)


@app.command("deploy-training")
def deploy_training_command(
    pool: Annotated[
        str, typer.Option(help="Prefect work pool whose workers train (created if missing).")
    ] = TRAIN_LINE.work_pool,
    name: Annotated[str, typer.Option(help="Deployment name.")] = TRAIN_LINE.name,
) -> None:
    """Register the training flow as a Prefect deployment on a work pool (the server at
    PREFECT_API_URL), so nightly lines train in parallel on that pool's workers."""
    if not os.environ.get("PREFECT_API_URL"):
        raise UsageError(
            "PREFECT_API_URL is not set: a work pool needs a Prefect server "
            "(`flywheel schedule` starts one on loopback, docker-compose runs one)"
        )
    from flows.prefect_env import configure_prefect

    configure_prefect(_settings())
    from flows.training import deploy_training

    deployment = deploy_training(pool, name=name)
    out.print(
        f"registered {deployment} on the work pool {pool!r}. Start workers with\n"
        f"  prefect worker start --pool {pool} --type process --limit 1\n"
        f"and set FLYWHEEL_TRAINING_DEPLOYMENT={deployment} where the nightly runs."
    )


@app.command()
def runs(
    line: Annotated[str | None, typer.Argument(help="Only this business line.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1_000)] = 20,
) -> None:
    """Recent training runs with their key metrics and gate decisions."""
    from registry.records import RUN_COLUMNS

    settings = _settings()
    registry = clients(settings).registry
    table = Table(title="training runs")
    for column in RUN_COLUMNS:
        table.add_column(column)
    for summary in registry.recent_runs(line, limit):
        table.add_row(*summary.cells())
    out.print(table)


@app.command()
def nightly(
    line: Annotated[
        list[str] | None, typer.Option(help="Only this business line (repeatable).")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=256,
            help="Dask worker processes for the cleaning stage "
            "(default: FLYWHEEL_CLEANING_WORKERS, 1 = in-process).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Run the nightly flow now (Prefect): per line, in parallel, datasets → train → gate →
    register → hot-load → 5% canary. Lines with too few new examples are skipped."""
    from flows.prefect_env import configure_prefect

    settings = _settings()
    for name in line or []:
        if name not in settings.business_lines:
            raise UsageError(f"unknown business line {name!r}")
    configure_prefect(settings)
    from flows.nightly import run_nightly

    with _quiet_training(settings, "nightly"):
        reports = run_nightly(lines=line or None, workers=workers)
    if as_json:
        out.print_json(orjson.dumps(reports).decode())
        return
    table = Table("business line", "status", "version", "adapter", "seconds by stage")
    table.add_column("why", overflow="fold", ratio=1, min_width=30)
    for report in reports:
        table.add_row(
            report["business_line"],
            report["status"],
            str(report["version"] or "-"),
            report["adapter"] or "-",
            ", ".join(f"{k} {v:g}" for k, v in report.get("seconds", {}).items()) or "-",
            report["reason"],
        )
    out.print(table)


@contextmanager
def _quiet_training(settings: Settings, name: str) -> Iterator[None]:
    """Trainer and library logs to ``FLYWHEEL_HOME/logs/<name>-<time>.log`` (the path
    printed on stderr), a progress line per training in their stead."""
    from flywheel.library_logs import library_logs_to_file
    from flywheel.progress import training_progress

    with library_logs_to_file(settings.home, name) as path:
        err.print(f"trainer and library logs: {path}")
        with training_progress(err.print):
            yield


@app.command()
def schedule(
    cron: Annotated[str, typer.Option(help="When the nightly flow runs (cron).")] = NIGHTLY_CRON,
    timezone: Annotated[str, typer.Option(help="Time zone of the cron.")] = SCHEDULE_TIMEZONE,
    canary_minutes: Annotated[
        float, typer.Option(min=0.1, help="How often the canary flow runs.")
    ] = CANARY_EVERY_S / 60,
    port: Annotated[int, typer.Option(min=1, max=65_535, help="Prefect server port.")] = 4200,
) -> None:
    """Start a local Prefect server and serve the nightly and canary schedules (Ctrl-C stops);
    the deployments are flows/deployments.py's, as prefect.yaml declares them."""
    from flows.prefect_env import configure_prefect

    settings = _settings()
    # The server is its own, started below: a PREFECT_API_URL set for another one is not asked.
    configure_prefect(settings, check_api=False)
    from flows.schedule import prefect_server, serve_schedules

    with prefect_server(settings.home / "prefect", port) as api:
        os.environ["PREFECT_API_URL"] = api
        out.print(
            f"Prefect at {api.removesuffix('/api')}: nightly at '{cron}' ({timezone}), "
            f"canary every {canary_minutes:g} min; Ctrl-C stops"
        )
        serve_schedules(cron, timezone, timedelta(minutes=canary_minutes))


def _train_and_report(settings: Settings, line: str, *, force: bool) -> None:
    """Train one line under its lease (a nightly run of the line makes this wait its turn):
    on the training work pool when ``FLYWHEEL_TRAINING_DEPLOYMENT`` is set, else here."""
    from feedback.watermarks import WatermarkStore
    from flows.prefect_env import configure_prefect

    if line not in settings.business_lines:
        raise UsageError(
            f"unknown business line {line!r} (known: {', '.join(settings.business_lines)})"
        )
    configure_prefect(settings)
    from composition.line_training import train_line
    from feedback.leases import lease_owner, line_lease
    from flows.training import train_on_pool

    command = clients(settings)
    with line_lease(WatermarkStore(command.store.engine), line, lease_owner()):
        if settings.training_deployment is not None:
            out.print(f"training {line} on the work pool ({settings.training_deployment})")
            result = train_on_pool(
                settings.training_deployment,
                line,
                None,
                force=force,
                timeout_s=settings.training_timeout_s,
            )
            out.print(
                Text.assemble(
                    (line, "bold"),
                    f": {result.status}"
                    + (f", version {result.version}" if result.version is not None else "")
                    + f": {result.reason}",
                )
            )
            return
        with _quiet_training(settings, "train"):
            outcome = train_line(settings, command, line, force=force)
    if outcome.status != "trained":
        out.print(f"{line}: {outcome.status}: {outcome.reason}")
        return
    out.print(
        Text.assemble(
            (line, "bold"), f": registered version {outcome.version} (run {outcome.run_id})"
        )
    )
    if outcome.decision is not None:
        out.print(Text.assemble("gate: ", (outcome.decision.summary, "bold")))
        for reason in outcome.decision.reasons:
            out.print(f"  {reason}")
    metrics = outcome.metrics
    kept = (
        f", kept step {metrics['kept_step']} (the last inside the general-set loss limit)"
        if metrics.get("kept_step") is not None
        else ""
    )
    out.print(
        f"trained {metrics['steps']} steps in {metrics['train_seconds']:.0f} s{kept} "
        f"({metrics['tokens_per_second']:.0f} tokens/s, peak RSS {metrics['peak_rss_mb']:.0f} MB)"
    )


def _safe_url(settings: Settings) -> str:
    return safe_url(settings)


def main() -> None:
    """Entry point: run the app; errors become a message on stderr and an exit code."""
    from sqlalchemy.exc import OperationalError

    try:
        app()
    except FlywheelError as exc:
        err.print(Text.assemble(("error:", "red"), f" {exc}"))
        sys.exit(exc.exit_code)
    except OperationalError as exc:
        err.print(
            Text.assemble(("error:", "red"), f" the feedback store failed: {str(exc.orig).strip()}")
        )
        sys.exit(StoreUnavailableError.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("FLYWHEEL_DEBUG"):
            raise
        err.print(
            Text.assemble(
                ("internal error:", "red"),
                f" {type(exc).__name__}: {exc} (set FLYWHEEL_DEBUG=1 for the traceback)",
            )
        )
        sys.exit(70)
