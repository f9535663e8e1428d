"""Bulk ingest into PostgreSQL: flywheel's batched path against row-by-row ORM inserts.

One command, one run, ratios against a baseline measured in the same run:

    .venv/bin/python lab/bench/ingest_bench.py [--events 200000] [--baseline-events 10000]

It generates simulated traffic to a JSONL file, then in separate processes
(so peak memory is per run) ingests it into fresh PostgreSQL databases with
flywheel's store and with a naive loop that validates the same records and
inserts them one ORM object at a time. Memory flatness is checked by ingesting
a quarter and all of the events: the peak resident size should barely move.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench_db import drop_database, fresh_database  # noqa: E402 (beside this script)


def make_traffic(path: Path, events: int) -> int:
    """Write about ``events`` simulated events to ``path``; returns the exact count."""
    from feedback.jsonl import dumps_line
    from flywheel.progress import progress_bar
    from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator

    # Roughly 1.45 events per request with the default rates.
    settings = SimulationSettings(
        requests=max(1, int(events / 1.45)), seed=7, start=datetime(2026, 11, 1, tzinfo=UTC)
    )
    written = 0
    with path.open("wb") as sink, progress_bar("generating traffic", total=events) as advance:
        for event in TrafficSimulator(settings).events():
            if written >= events:
                break
            sink.write(dumps_line(event))
            written += 1
            advance(1)
    return written


def run_flywheel(url: str, path: Path, limit: int | None) -> dict[str, Any]:
    """flywheel's store: validate, batch, COPY + ON CONFLICT, one transaction a batch."""
    from itertools import islice

    from feedback.jsonl import iter_jsonl
    from feedback.store import FeedbackStore, create_store_engine, upgrade_schema

    engine = create_store_engine(url)
    upgrade_schema(engine)
    store = FeedbackStore(engine)
    started = time.perf_counter()
    report = store.ingest(islice(iter_jsonl(path), limit), source=str(path))
    elapsed = time.perf_counter() - started
    assert report.quarantined == 0, report.rejections
    return {"events": report.read, "stored": report.added, "seconds": elapsed}


def run_naive(url: str, path: Path, limit: int | None) -> dict[str, Any]:
    """The baseline: same parsing and validation, then one ORM object added and flushed a row."""
    from itertools import islice

    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from feedback.events import InteractionEvent, validate_event
    from feedback.jsonl import JsonlRecord, iter_jsonl
    from feedback.schema import FeedbackEvent, Interaction
    from feedback.store import create_store_engine, feedback_row, interaction_row, upgrade_schema

    engine = create_store_engine(url)
    upgrade_schema(engine)
    started = time.perf_counter()
    stored = read = 0
    with Session(engine) as session:
        for item in islice(iter_jsonl(path), limit):
            read += 1
            assert isinstance(item, JsonlRecord)
            event = validate_event(item.data)
            if isinstance(event, InteractionEvent):
                row = interaction_row(event)
                row["meta"] = row.pop("metadata")
                session.add(Interaction(**row))
            else:
                line = session.scalar(
                    select(Interaction.business_line).where(
                        Interaction.request_id == event.request_id
                    )
                )
                assert line is not None
                row = feedback_row(event, line)
                row["meta"] = row.pop("metadata")
                session.add(FeedbackEvent(**row))
            session.flush()
            stored += 1
            if read % 2_000 == 0:
                session.commit()
        session.commit()
    return {"events": read, "stored": stored, "seconds": time.perf_counter() - started}


def worker(args: argparse.Namespace) -> None:
    url = fresh_database()
    try:
        run = run_flywheel if args.worker == "flywheel" else run_naive
        result = run(url, Path(args.path), args.limit)
    finally:
        drop_database(url)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def measure(kind: str, path: Path, limit: int) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--worker",
        kind,
        "--path",
        str(path),
        "--limit",
        str(limit),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"{kind} run failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["events_per_s"] = result["events"] / result["seconds"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--baseline-events", type=int, default=10_000)
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    parser.add_argument("--worker", choices=["flywheel", "naive"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    from rich.console import Console
    from rich.table import Table

    console = Console()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "traffic.jsonl"
        total = make_traffic(path, args.events)
        console.print(f"{total} events, {path.stat().st_size / 1e6:.1f} MB of JSONL")
        quarter = measure("flywheel", path, total // 4)
        full = measure("flywheel", path, total)
        naive = measure("naive", path, min(args.baseline_events, total))
    table = Table(title="bulk ingest into PostgreSQL (same machine, same run)")
    for column in ("path", "events", "events/s", "peak RSS MB", "vs naive"):
        table.add_column(column, justify="right")
    for name, result in (
        ("naive ORM row-by-row", naive),
        ("flywheel, 1/4 of events", quarter),
        ("flywheel, all events", full),
    ):
        table.add_row(
            name,
            str(result["events"]),
            f"{result['events_per_s']:,.0f}",
            f"{result['peak_rss_mb']:.0f}",
            f"{result['events_per_s'] / naive['events_per_s']:.1f}x",
        )
    console.print(table)
    growth = full["peak_rss_mb"] / quarter["peak_rss_mb"]
    console.print(
        f"speed-up over naive: [bold]{full['events_per_s'] / naive['events_per_s']:.1f}x[/]; "
        f"target 20,000 events/s: {'met' if full['events_per_s'] >= 20_000 else 'NOT met'}; "
        f"peak memory for 4x the events: {growth:.2f}x ({'flat' if growth < 1.25 else 'GROWS'})"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"naive": naive, "quarter": quarter, "full": full, "rss_growth": growth})
        )


if __name__ == "__main__":
    main()
