"""Scale-out of the cleaning stage on Dask workers, and a nightly run broken down by stage.

Run: ``.venv/bin/python bench/cleaning_bench.py [--requests 69000] [--no-nightly]``

1. Generates simulated traffic into a fresh PostgreSQL database (69,000
   requests give about 100,000 stored events: interactions plus feedback).
2. Cleans every business line (pull, Presidio scrub, filter, exact and
   near-duplicate removal by band-key shuffle, datasets) with the partitioned
   Prefect flow on a local Dask cluster of 1 worker, then of 2 workers, in
   the same run; prints wall times (cluster start-up included), the seconds of
   each step and the ratio of 2 workers to 1, and checks that both built the
   same datasets (content hashes).
3. Unless ``--no-nightly``: starts vLLM on the CPU, runs the nightly flow for
   one line on the same store with 2 cleaning workers (datasets, DPO training
   with the demo recipe, offline eval, gate, MLflow registration, hot-load,
   probe, 5% canary) and prints the seconds of each stage.

On this 2-core machine the defaults take about 20 minutes (most of it is
Presidio scrubbing, twice); ``--requests 5000 --no-nightly`` takes ~2 minutes.
The machine is shared and noisy: read the ratio, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_db import drop_database, fresh_database
from rich.console import Console
from rich.table import Table

out = Console()
START = datetime(2026, 11, 1, tzinfo=UTC)


def fill_store(url: str, home: Path, requests: int) -> dict[str, int]:
    """Simulated traffic into the store; counts of what was stored."""
    from feedback.simulate import SimulationSettings, TrafficSimulator
    from feedback.store import FeedbackStore
    from flywheel.settings import load_settings

    store = FeedbackStore.open(load_settings(home=home, database_url=url))
    try:
        simulation = SimulationSettings(requests=requests, seed=11, start=START)
        with out.status(f"simulating {requests:,} requests into PostgreSQL"):
            report = store.ingest(TrafficSimulator(simulation).events(), source="simulate")
        stats = store.stats()
    finally:
        store.close()
    return {
        "events": report.added,
        "interactions": stats["interactions"],
        "feedback_events": sum(stats["events"].values()),
    }


def clean_all(home: Path, url: str, workers: int, lines: list[str]) -> dict[str, Any]:
    """Every line through the partitioned flow on a fresh local cluster of ``workers``."""
    from flows.cleaning import local_cluster, run_partitioned
    from flywheel.settings import load_settings

    settings = load_settings(home=home / f"workers-{workers}", database_url=url)
    steps: dict[str, float] = {}
    hashes: dict[str, str | None] = {}
    started = time.perf_counter()
    # One cluster for every line, as the nightly flow does: workers load Presidio once.
    with local_cluster(workers) as address:
        for line in lines:
            with out.status(f"cleaning {line} on {workers} Dask worker(s)"):
                result = run_partitioned(settings, line, workers=workers, address=address)
            hashes[line] = result.dataset
            for step, seconds in result.seconds.items():
                steps[step] = steps.get(step, 0.0) + seconds
            out.print(f"  {line}: {result.partitions} partitions, {result.seconds}")
    return {"seconds": time.perf_counter() - started, "steps": steps, "hashes": hashes}


def nightly_breakdown(home: Path, url: str, line: str, workers: int) -> dict[str, Any]:
    """A real nightly run of one line (vLLM on the CPU); its report with seconds by stage."""
    from flywheel.cli import _vllm_venv
    from flywheel.settings import load_settings
    from registry.vllm_server import VllmEnvironment, VllmServer, VllmServerSettings, free_port
    from training.base_model import ensure_base_model
    from training.recipes import packaged_recipes_dir

    settings = load_settings(home=home / "nightly", database_url=url)
    base = ensure_base_model(settings.models_dir, settings.base_model)
    python = VllmEnvironment(
        _vllm_venv(settings), torch_index=settings.torch_index, report=out.print
    ).ensure()
    vllm = VllmServerSettings(model=base, port=free_port(), served_model_name=base.name)
    log = settings.home / "vllm.log"
    with VllmServer(vllm, python=python, log_path=log, report=out.print) as server:
        os.environ.update(
            FLYWHEEL_HOME=str(settings.home),
            FLYWHEEL_DATABASE_URL=url,
            FLYWHEEL_RECIPES_DIR=str(packaged_recipes_dir() / "demo"),
            FLYWHEEL_GATEWAY_UPSTREAMS=server.base_url,
        )
        from flows.nightly import nightly

        with out.status(f"nightly run of {line} ({workers} cleaning workers)"):
            [report] = nightly(lines=[line], workers=workers)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=69_000)
    parser.add_argument("--no-nightly", action="store_true", help="Skip the nightly breakdown.")
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="flywheel-cleaning-bench-"))
    from flows.prefect_env import configure_prefect
    from flywheel.settings import load_settings

    configure_prefect(load_settings(home=home))
    url = fresh_database()
    results: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    try:
        results["store"] = fill_store(url, home, args.requests)
        out.print(f"store: {results['store']}")
        lines = list(load_settings().business_lines)
        runs = {workers: clean_all(home, url, workers, lines) for workers in (1, 2)}
        results["cleaning"] = {str(k): v for k, v in runs.items()}
        table = Table(title=f"cleaning {results['store']['events']:,} events, every line")
        table.add_column("Dask workers", justify="right")
        table.add_column("wall s", justify="right")
        for step in runs[1]["steps"]:
            table.add_column(f"{step} s", justify="right")
        table.add_column("time vs 1 worker", justify="right")
        for workers, run in runs.items():
            table.add_row(
                str(workers),
                f"{run['seconds']:.1f}",
                *[f"{v:.1f}" for v in run["steps"].values()],
                f"{run['seconds'] / runs[1]['seconds']:.2f}x",
            )
        out.print(table)
        same = runs[1]["hashes"] == runs[2]["hashes"]
        results["same_datasets"] = same
        out.print(f"same datasets with 1 and 2 workers: {same}")
        if not args.no_nightly:
            report = nightly_breakdown(home, url, lines[0], workers=2)
            results["nightly"] = report
            stages = Table(title=f"nightly run of {lines[0]}: {report['status']}")
            stages.add_column("stage")
            stages.add_column("seconds", justify="right")
            for stage, seconds in report["seconds"].items():
                stages.add_row(stage, f"{seconds:.1f}")
            out.print(stages)
            out.print(f"  {report['reason']}")
    finally:
        drop_database(url)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
