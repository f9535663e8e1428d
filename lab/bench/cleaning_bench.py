"""Scale-out of the cleaning stage on Dask workers, and a nightly run broken down by stage.

Run: ``.venv/bin/python lab/bench/cleaning_bench.py [--requests 69000] [--no-baseline]
[--no-nightly]``

1. Generates simulated traffic into a fresh PostgreSQL database (69,000
   requests give about 100,000 stored events: interactions plus feedback;
   ``--requests 14000`` about 20,000).
2. Cleans every business line (pull, Presidio scrub, filter, exact and
   near-duplicate removal by band-key shuffle, datasets) with the partitioned
   Prefect flow on a fresh local Dask cluster per run, in the same process:
   the baseline (1 worker, every text analysed: no detection cache, as before
   the cache existed; skipped with ``--no-baseline``), both scrub orders on 1
   worker (``scrub_first``: scrub everything, then filter and deduplicate;
   ``dedup_first``: failed requests and raw exact duplicates set aside before
   scrubbing), the kept order on 2 workers, then the one-process path
   (:func:`feedback.cleaning.clean_line`, the whole window in this process).
   Prints wall times (cluster start-up included), events/s per worker, the
   seconds of each step, the workers' CPU seconds for pull + scrub + sign (much
   less moved by other jobs than wall time), ratios against the baseline and
   the load average, and checks that every run built the same datasets
   (content hashes) and that the kept order's runs have the same funnels.
3. Unless ``--no-nightly``: starts vLLM on the CPU, runs the nightly flow for
   one line on the same store with 2 cleaning workers (datasets, DPO training
   with the demo recipe, offline eval, gate, MLflow registration, hot-load,
   probe, 5% canary) and prints the seconds of each stage.

The machine is shared and noisy: read the ratios, measured in the same run, and
the load average printed beside each run.
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

# Wide enough for the runs table when the output goes to a file.
out = Console(width=160)
START = datetime(2026, 11, 1, tzinfo=UTC)


def fill_store(url: str, home: Path, requests: int) -> dict[str, int]:
    """Simulated traffic into the store; counts of what was stored."""
    from feedback.store import FeedbackStore
    from flywheel.settings import load_settings
    from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator

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


def clean_all(
    home: Path, url: str, name: str, workers: int, lines: list[str], cleaning: Any
) -> dict[str, Any]:
    """Every line through the partitioned flow on a fresh local cluster of ``workers``."""
    from flows.cleaning import local_cluster, run_partitioned
    from flywheel.settings import load_settings

    settings = load_settings(home=home / name, database_url=url)
    steps: dict[str, float] = {}
    hashes: dict[str, str | None] = {}
    funnels: dict[str, Any] = {}
    load = os.getloadavg()[0]
    started = time.perf_counter()
    # One cluster for every line, as the nightly flow does: workers load Presidio once.
    with local_cluster(workers) as address:
        for line in lines:
            with out.status(f"{name}: cleaning {line} on {workers} Dask worker(s)"):
                result = run_partitioned(
                    settings, line, workers=workers, address=address, cleaning=cleaning
                )
            hashes[line] = result.dataset
            funnels[line] = result.funnel
            for step, seconds in result.seconds.items():
                steps[step] = steps.get(step, 0.0) + seconds
            out.print(f"  {name} {line}: {result.partitions} partitions, {result.seconds}")
    return {
        "workers": workers,
        "seconds": time.perf_counter() - started,
        "cpu_seconds": steps["pull_scrub_sign_cpu"],
        "steps": steps,
        "hashes": hashes,
        "funnels": funnels,
        "load": [load, os.getloadavg()[0]],
        "cleaning": cleaning,
    }


def clean_one_process(home: Path, url: str, lines: list[str], cleaning: Any) -> dict[str, Any]:
    """Every line through the one-process stage (:func:`feedback.cleaning.clean_line`)."""
    from feedback.cleaning import clean_line, scrub_with
    from feedback.pii import build_scrubber
    from feedback.store import FeedbackStore
    from flywheel.settings import load_settings

    settings = load_settings(home=home / "one-process", database_url=url)
    hashes: dict[str, str | None] = {}
    funnels: dict[str, Any] = {}
    load = os.getloadavg()[0]
    started = time.perf_counter()
    cpu_started = time.process_time()
    scrub = scrub_with(build_scrubber(), cache_texts=cleaning.scrub_cache_texts)
    store = FeedbackStore.open(settings)
    try:
        for line in lines:
            with out.status(f"one process: cleaning {line}"):
                result = clean_line(
                    store.engine,
                    line,
                    scrub=scrub,
                    settings=cleaning,
                    dataset_root=settings.datasets_dir,
                )
            hashes[line] = result.dataset.content_hash if result.dataset else None
            funnels[line] = result.funnel.as_dict()
    finally:
        store.close()
    return {
        "workers": 1,
        "seconds": time.perf_counter() - started,
        # Everything here, dedup and writing included: close to pull + scrub + sign.
        "cpu_seconds": time.process_time() - cpu_started,
        "steps": {},
        "hashes": hashes,
        "funnels": funnels,
        "load": [load, os.getloadavg()[0]],
        "cleaning": cleaning,
    }


def nightly_breakdown(home: Path, url: str, line: str, workers: int) -> dict[str, Any]:
    """A real nightly run of one line (vLLM on the CPU); its report with seconds by stage."""
    from composition.recipes import packaged_recipes_dir
    from flywheel.install import vllm_venv
    from flywheel.settings import load_settings
    from registry.vllm_server import VllmEnvironment, VllmServer, VllmServerSettings, free_port
    from training.base_model import ensure_base_model

    settings = load_settings(home=home / "nightly", database_url=url)
    base = ensure_base_model(settings.models_dir, settings.base_model)
    python = VllmEnvironment(
        vllm_venv(settings.home), torch_index=settings.torch_index, report=out.print
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
        from flows.nightly import run_nightly

        with out.status(f"nightly run of {line} ({workers} cleaning workers)"):
            [report] = run_nightly(lines=[line], workers=workers)
    return report


KEPT_ORDER = "scrub_first"


def compare_runs(home: Path, url: str, lines: list[str], *, baseline: bool) -> dict[str, Any]:
    """The baseline, both scrub orders on 1 worker, the kept order on 2, one process."""
    from flywheel.settings.cleaning import CleaningSettings

    plans: list[tuple[str, int, CleaningSettings]] = []
    if baseline:
        plans.append(("baseline (no cache), 1 worker", 1, CleaningSettings(scrub_cache_texts=0)))
    other = "dedup_first" if KEPT_ORDER == "scrub_first" else "scrub_first"
    plans += [
        (f"{KEPT_ORDER}, 1 worker", 1, CleaningSettings(scrub_order=KEPT_ORDER)),
        (f"{other}, 1 worker", 1, CleaningSettings(scrub_order=other)),
        (f"{KEPT_ORDER}, 2 workers", 2, CleaningSettings(scrub_order=KEPT_ORDER)),
    ]
    runs = {
        name: clean_all(home, url, f"run-{index}", workers, lines, cleaning)
        for index, (name, workers, cleaning) in enumerate(plans)
    }
    runs["one process"] = clean_one_process(
        home, url, lines, CleaningSettings(scrub_order=KEPT_ORDER)
    )
    return runs


def print_runs(runs: dict[str, Any], events: int) -> None:
    """A table of the runs: wall seconds, events/s per worker, steps, ratios, load."""
    reference = next(iter(runs.values()))
    steps = list(reference["steps"])
    table = Table(title=f"cleaning {events:,} events, every line")
    table.add_column("run")
    table.add_column("wall s", justify="right")
    table.add_column("events/s per worker", justify="right")
    for step in steps:
        table.add_column(f"{step} s", justify="right")
    table.add_column(f"speed vs {next(iter(runs))}", justify="right")
    table.add_column("events per CPU s (pull+scrub+sign)", justify="right")
    table.add_column("CPU speed vs first", justify="right")
    table.add_column("load before-after", justify="right")
    for name, run in runs.items():
        run["events_per_s_per_worker"] = events / run["seconds"] / run["workers"]
        table.add_row(
            name,
            f"{run['seconds']:.1f}",
            f"{run['events_per_s_per_worker']:.0f}",
            *[f"{run['steps'].get(step, 0.0):.1f}" if run["steps"] else "-" for step in steps],
            f"{reference['seconds'] / run['seconds']:.2f}x",
            f"{events / run['cpu_seconds']:.0f}",
            f"{reference['cpu_seconds'] / run['cpu_seconds']:.2f}x",
            "-".join(f"{load:.1f}" for load in run["load"]),
        )
    out.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=69_000)
    parser.add_argument(
        "--no-baseline", action="store_true", help="Skip the run without the detection cache."
    )
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
        runs = compare_runs(home, url, lines, baseline=not args.no_baseline)
        results["cleaning"] = runs
        results["uptime"] = os.getloadavg()
        print_runs(runs, results["store"]["events"])
        kept = runs[f"{KEPT_ORDER}, 1 worker"]
        checks = {
            "same datasets in every run": all(r["hashes"] == kept["hashes"] for r in runs.values()),
            f"same funnels in every {KEPT_ORDER} run (1, 2 workers, one process, baseline)": all(
                run["funnels"] == kept["funnels"]
                for run in runs.values()
                if run["cleaning"].scrub_order == KEPT_ORDER
            ),
        }
        results["checks"] = checks
        for check, passed in checks.items():
            out.print(f"{check}: {passed}")
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
