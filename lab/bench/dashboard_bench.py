"""Response time of the feedback page's main views on 1,000,000 generated events.

One command, one run, ratios against baselines measured in the same run:

    .venv/bin/python lab/bench/dashboard_bench.py [--events 1000000] [--requests 30]

It fills two fresh PostgreSQL databases with served traffic (``tests/served_traffic.py``:
three lines, adapter versions, a canary; 30 days) through the store's COPY ingest,
one with ``--events`` events and one with a tenth of them, builds a dataset for one
line from its last two hours (real scrubber) and two MLflow runs, then requests each
main view of the page in-process (FastAPI TestClient: the app's own time, no network)
and prints p50/p99 per view on both stores and their ratio (about 1 means the view
costs the same on a 10x bigger store: indexes and the rollup, no full scans), with a
reviewer's key that sees every line: the overview, samples, funnel and eval review of
one line, its review queue (each request hands the reviewer a new blind, scrubbed answer
of the canary or the champion), and the page of an A/B experiment on another line's
last week of traffic (its users split between two adapters). Baselines:
the overview's counts without the rollup (the same aggregation over the raw tables), the
experiment's numbers recounted from the raw tables (what its views cost before its
running tally), and the first, cold request of each view (scrubbing a page of samples;
the rollup's and the tally's first folds are timed on their own, before the views).
It also EXPLAINs the samples queries before and after ANALYZE (stale statistics must not
turn a page into a scan) and flags any sequential scan of the big tables.

At 1,000,000 events it takes about 8 minutes on 2 cores, most of it generating and
ingesting the traffic; ``--events 100000`` takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from composition.recipes import start_training_run

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench_db import drop_database, fresh_database  # noqa: E402 (beside this script)

START = datetime(2026, 10, 1, tzinfo=UTC)
SPAN = timedelta(days=30)
LINE = "medical"
EXPERIMENT_LINE = "legal"
EXPERIMENT_DAYS = 7
REVIEWER = "bench-reviewer"
EVENTS_PER_REQUEST = 1.45


@dataclass
class Site:
    """A filled store under a flywheel home, and the page on it."""

    label: str
    events: int
    home: Path
    url: str
    store: Any
    ingest_s: float
    key: str = ""
    experiment_id: int = 0


def build_site(label: str, events: int, root: Path) -> Site:
    """Generate and ingest ``events`` served events into a fresh database."""
    from feedback.store import FeedbackStore
    from flywheel.progress import progress_bar
    from flywheel.settings import load_settings
    from lab.simulation.stored_traffic import SimulationSettings
    from tests.served_traffic import fill_demo_store

    url = fresh_database()
    home = root / label
    settings = load_settings(home=home, database_url=url)
    store = FeedbackStore.open(settings)
    simulation = SimulationSettings(
        requests=int(events / EVENTS_PER_REQUEST) + 10, seed=7, start=START, span=SPAN
    )
    started = time.perf_counter()
    with progress_bar(f"{label}: generating + ingesting", total=events) as advance:
        _, report = fill_demo_store(store, simulation, limit=events, on_progress=advance)
    assert report.quarantined == 0, report.rejections
    return Site(label, report.read, home, url, store, time.perf_counter() - started)


def analyze(site: Site) -> None:
    """What autovacuum does after a bulk load on a production server (it is off on some
    development servers); the page's queries must not depend on it (see ``scan_check``)."""
    engine = site.store.engine
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("ANALYZE")


def add_dataset(site: Site) -> int:
    """A real dataset of the line's last two hours (so the funnel and lineage have data)."""
    from feedback.cleaning import clean_line, scrub_with
    from feedback.pii import build_scrubber
    from flywheel.settings.cleaning import CleaningSettings

    result = clean_line(
        site.store.engine,
        LINE,
        scrub=scrub_with(build_scrubber()),
        settings=CleaningSettings(),
        dataset_root=site.home / "datasets",
        since=START + SPAN - timedelta(hours=2),
    )
    return sum(result.funnel.as_dict()["steps"].get("pulled", {}).values())


def add_eval_runs(site: Site) -> None:
    """Two training runs with evaluations in the home's local MLflow (no training)."""
    from composition.recipes import Recipe, recipe_hash
    from eval.reports import EvalReport, GateCheck, GateDecision, GenerationSample
    from registry.tracking import Registry

    registry = Registry.for_home(site.home)
    recipe = Recipe(business_line=LINE, method="dpo", max_steps=2)
    for n, promote in enumerate((True, False)):
        content = f"{n}" * 64
        manifest = site.home / "runs" / content[:8] / "manifest.json"
        manifest.parent.mkdir(parents=True)
        manifest.write_text(json.dumps({"business_line": LINE, "content_hash": content}))
        run = start_training_run(registry, recipe, content, manifest, "base", "bench")
        samples = tuple(
            GenerationSample(prompt=f"question {i}?", answer=f"answer {i}.", refused=False)
            for i in range(8)
        )

        def report(model: str, accuracy: float, samples: Any = samples) -> EvalReport:
            return EvalReport(
                model, 40, accuracy, accuracy - 0.5, 1.4, 2.0, 0.0, 30.0, 0, 0, samples
            )

        registry.log_evaluation(
            run,
            report("candidate", 0.7 if promote else 0.5),
            report("champion", 0.6),
            GateDecision(promote, (GateCheck("preference_accuracy", promote, "bench"),)),
        )
        adapter = site.home / "runs" / f"adapter-{n}"
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text("{}")
        registry.log_adapter(run, adapter)
        if promote:
            lineage = {
                "base_model": "base",
                "dataset_hash": content,
                "recipe_hash": recipe_hash(recipe),
                "code_version": "bench",
            }
            registry.promote(LINE, registry.register_adapter(run, LINE, lineage))
        registry.finish_run(run)


def add_experiment(site: Site) -> int:
    """An A/B experiment on the last week of one line's traffic: its users split between
    arm A (v1) and arm B (v2) by a hash, as the gateway records them; the experiment's id."""
    from registry.experiment_store import ARM_LABELS, create_experiment
    from registry.experiments import ExperimentPolicy

    started = START + SPAN - timedelta(days=EXPERIMENT_DAYS)
    with site.store.engine.begin() as connection:
        connection.exec_driver_sql(
            "UPDATE interactions SET arm = CASE WHEN abs(hashtext(user_id)) %% 2 = 0 "
            "THEN %(a)s ELSE %(b)s END WHERE business_line = %(line)s AND created_at >= %(since)s",
            {"a": ARM_LABELS["a"], "b": ARM_LABELS["b"], "line": EXPERIMENT_LINE, "since": started},
        )
    return create_experiment(
        site.store.engine,
        business_line=EXPERIMENT_LINE,
        arm_a=f"{EXPERIMENT_LINE}-v1",
        arm_b=f"{EXPERIMENT_LINE}-v2",
        share=0.5,
        metric="task_success",
        policy=ExperimentPolicy(),
        actor="bench",
        reason="dashboard bench",
        when=started,
    )


def add_reviewer(site: Site) -> str:
    """A key that sees every line and reviews ``LINE``; the key (every view is requested
    with it, the review queue needs its role)."""
    from gateway.keys import add_key

    return add_key(site.home / "gateway-keys.yaml", REVIEWER, ["*"], [LINE])


def views(site: Site) -> dict[str, str]:
    """The main views, as URLs on this site's data."""
    from sqlalchemy import select

    from dashboard.filters import Cursor
    from feedback.schema import feedback_table

    middle = START + SPAN / 2
    deep = Cursor(middle, 2**62).encode()
    f = feedback_table.c
    with site.store.engine.connect() as connection:
        edited = connection.execute(
            select(f.request_id)
            .where(f.business_line == LINE, f.type == "edit")
            .order_by(f.id.desc())
            .limit(1)
        ).scalar_one()
    first, last = middle - timedelta(days=3), middle + timedelta(days=3)
    week = f"since={first:%Y-%m-%d}&until={last:%Y-%m-%d}"
    return {
        "overview": f"/lines/{LINE}",
        "overview, filtered": f"/lines/{LINE}?{week}&adapter={LINE}-v2&signal=thumbs_down",
        "samples, page 1": f"/lines/{LINE}/samples",
        "samples, deep page": f"/lines/{LINE}/samples?cursor={deep}",
        "samples, filtered": f"/lines/{LINE}/samples?signal=edit&adapter={LINE}-v1",
        "samples, rare signal": f"/lines/{LINE}/samples?signal=task_failure&{week}",
        "sample with edit": f"/lines/{LINE}/samples/{edited}",
        "funnel": f"/lines/{LINE}/funnel",
        "eval review": f"/lines/{LINE}/evals",
        "overview API": f"/api/lines/{LINE}/overview",
        "review queue": f"/lines/{LINE}/review",
        "review API, next": f"/api/lines/{LINE}/review/next",
        "experiments list": f"/lines/{EXPERIMENT_LINE}/experiments",
        "experiment page": f"/lines/{EXPERIMENT_LINE}/experiments/{site.experiment_id}",
        "experiment API": f"/api/lines/{EXPERIMENT_LINE}/experiments/{site.experiment_id}",
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def time_views(site: Site, requests: int) -> dict[str, dict[str, float]]:
    """Cold first request, then p50/p99 over ``requests`` of each view (milliseconds)."""
    from fastapi.testclient import TestClient

    from composition.recipes import recipe_for
    from dashboard.app import create_app
    from feedback.pii import build_scrubber
    from flywheel.progress import progress_bar
    from flywheel.settings import load_settings
    from flywheel.settings.dashboard import DashboardSettings
    from registry.routes import RouteStore

    settings = load_settings(home=site.home, database_url=site.url)
    app = create_app(
        settings,
        DashboardSettings(rollup_grace_s=0),
        store=site.store,
        routes=RouteStore(site.store.engine),
        scrubber_factory=build_scrubber,
        keys_file=site.home / "gateway-keys.yaml",
        review_policy_of=lambda line: recipe_for(settings, line).review,
    )
    results: dict[str, dict[str, float]] = {}
    pages = app.state.pages
    started = time.perf_counter()
    folded = pages.rollup.refresh(force=True)
    results["rollup: first fold"] = {"cold_ms": (time.perf_counter() - started) * 1e3}
    results["rollup: first fold"]["rows"] = folded
    results["experiment tally: first fold"] = first_tally_fold(site)
    targets = views(site)
    with (
        TestClient(
            app, client=("127.0.0.1", 9999), headers={"Authorization": f"Bearer {site.key}"}
        ) as client,
        progress_bar(f"{site.label}: timing views", total=len(targets)) as advance,
    ):
        for name, url in targets.items():
            began = time.perf_counter()
            first = client.get(url)
            cold = (time.perf_counter() - began) * 1e3
            assert first.status_code == 200, (url, first.status_code, first.text[:300])
            times = []
            for _ in range(requests):
                began = time.perf_counter()
                answer = client.get(url)
                times.append((time.perf_counter() - began) * 1e3)
                assert answer.status_code == 200
            results[name] = {
                "cold_ms": cold,
                "p50_ms": statistics.median(times),
                "p99_ms": percentile(times, 0.99),
            }
            advance(1)
    return results


def _experiment(site: Site) -> Any:
    from registry.experiment_store import get_experiment

    record = get_experiment(site.store.engine, site.experiment_id)
    assert record is not None
    return record


def first_tally_fold(site: Site) -> dict[str, float]:
    """The experiment's first fold into its running tally (every request of its week,
    once; later views fold what arrived since)."""
    from registry.experiment_tally import fold_tally

    started = time.perf_counter()
    fold_tally(site.store.engine, _experiment(site), grace=timedelta(0))
    return {"cold_ms": (time.perf_counter() - started) * 1e3}


def recount_experiment(site: Site, requests: int) -> dict[str, float]:
    """The experiment's numbers recounted from the raw tables, as a look does: what each
    experiment view cost before the running tally."""
    from registry.experiment_store import current_look

    record = _experiment(site)
    times = []
    for _ in range(max(3, requests // 5)):
        began = time.perf_counter()
        current_look(site.store.engine, record, datetime.now(UTC))
        times.append((time.perf_counter() - began) * 1e3)
    return {"p50_ms": statistics.median(times), "p99_ms": percentile(times, 0.99)}


def tally_plan(site: Site) -> str:
    """EXPLAIN ANALYZE the query a view runs on top of the folded tally (the rows above its
    marks): execution time, and any sequential scan of the big tables named."""
    from registry.experiment_tally import _marks, changes_query

    record = _experiment(site)
    with site.store.engine.connect() as connection:
        marks = _marks(connection, record.id)
        assert marks is not None
        compiled = changes_query(record, marks).compile(
            site.store.engine, compile_kwargs={"render_postcompile": True}
        )
        plan = "\n".join(
            row[0]
            for row in connection.exec_driver_sql(
                "EXPLAIN ANALYZE " + str(compiled), compiled.params
            )
        )
    scans = [t for t in ("interactions", "feedback_events") if f"Seq Scan on {t}" in plan]
    took = plan.rsplit("Execution Time: ", 1)[-1].split(" ms")[0]
    where = f"SEQ SCAN on {', '.join(scans)}" if scans else "index"
    return f"{float(took):.1f} ms ({where})"


NAIVE_QUERIES = (
    """SELECT coalesce(adapter_name, 'base'), date_trunc('hour', created_at AT TIME ZONE 'UTC'),
              count(*), sum(CASE WHEN status <> 'ok' THEN 1 ELSE 0 END)
       FROM interactions
       WHERE business_line = %(line)s AND created_at >= %(since)s AND created_at < %(until)s
       GROUP BY 1, 2""",
    """SELECT coalesce(i.adapter_name, 'base'), date_trunc('hour', i.created_at AT TIME ZONE 'UTC'),
              f.type, f.outcome, count(*)
       FROM feedback_events f JOIN interactions i ON i.request_id = f.request_id
       WHERE i.business_line = %(line)s AND i.created_at >= %(since)s AND i.created_at < %(until)s
       GROUP BY 1, 2, 3, 4""",
)


def naive_overview(site: Site, requests: int) -> dict[str, float]:
    """The overview's counts over its default range (14 days) aggregated from the raw
    tables on every read: what the page would cost without the rollup."""
    until = START + SPAN + timedelta(hours=1)
    params = {"line": LINE, "since": until - timedelta(days=14), "until": until}
    times = []
    with site.store.engine.connect() as connection:
        for _ in range(max(3, requests // 5)):
            began = time.perf_counter()
            for query in NAIVE_QUERIES:
                connection.exec_driver_sql(query, params).all()
            times.append((time.perf_counter() - began) * 1e3)
    return {"p50_ms": statistics.median(times), "p99_ms": percentile(times, 0.99)}


def scan_check(site: Site) -> list[str]:
    """EXPLAIN ANALYZE the samples queries: execution time, and any sequential scan of the
    big tables named."""
    from dashboard.filters import Cursor, parse_filter
    from dashboard.queries import sample_query

    middle = START + SPAN / 2
    week = {
        "since": f"{middle - timedelta(days=3):%Y-%m-%d}",
        "until": f"{middle + timedelta(days=3):%Y-%m-%d}",
    }
    buckets = {
        "page 1": (parse_filter(), None),
        "deep page": (parse_filter(), Cursor(middle, 2**62)),
        "edit on v1": (parse_filter(signal="edit", adapter=f"{LINE}-v1"), None),
        "rare signal, one week": (parse_filter(signal="task_failure", **week), None),
    }
    found = []
    with site.store.engine.connect() as connection:
        for name, (bucket, cursor) in buckets.items():
            compiled = sample_query(LINE, bucket, cursor, 51).compile(site.store.engine)
            plan = "\n".join(
                row[0]
                for row in connection.exec_driver_sql(
                    "EXPLAIN ANALYZE " + str(compiled), compiled.params
                )
            )
            scans = [t for t in ("interactions", "feedback_events") if f"Seq Scan on {t}" in plan]
            took = plan.rsplit("Execution Time: ", 1)[-1].split(" ms")[0]
            where = f"SEQ SCAN on {', '.join(scans)}" if scans else "index"
            found.append(f"{name} {float(took):.1f} ms ({where})")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--baseline-events", type=int, help="Default: a tenth of --events.")
    parser.add_argument("--requests", type=int, default=30, help="Timed requests per view.")
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

    from rich.console import Console
    from rich.table import Table

    console = Console()
    small_events = args.baseline_events or max(1_000, args.events // 10)
    sites: list[Site] = []
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="flywheel-dashboard-bench-") as folder:
        root = Path(folder)
        try:
            for label, events in (("big", args.events), ("small", small_events)):
                site = build_site(label, events, root)
                sites.append(site)
                if label == "big":
                    results["scans before ANALYZE"] = scan_check(site)
                analyze(site)
                console.print(
                    f"{label}: {site.events:,} events ingested in {site.ingest_s:.0f} s "
                    f"({site.events / site.ingest_s:,.0f}/s)"
                )
                records = add_dataset(site)
                console.print(f"{label}: dataset from the last 2 h of {LINE} ({records} records)")
                add_eval_runs(site)
                site.experiment_id = add_experiment(site)
                site.key = add_reviewer(site)
            for site in sites:
                results[site.label] = time_views(site, args.requests)
                results[f"{site.label} experiment recount"] = recount_experiment(
                    site, args.requests
                )
            results["naive"] = naive_overview(sites[0], args.requests)
            results["tally plan"] = tally_plan(sites[0])
            results["scans after ANALYZE"] = scan_check(sites[0])
        finally:
            for site in sites:
                site.store.close()
                drop_database(site.url)

    big, small = results["big"], results["small"]
    table = Table(
        title=f"feedback page on PostgreSQL: {sites[0].events:,} vs {sites[1].events:,} events "
        f"({args.requests} requests per view, in-process)"
    )
    for column in ("view", "p50 ms", "p99 ms", "small p50", "big/small", "cold 1st ms"):
        table.add_column(column, justify="right" if column != "view" else "left")
    for name, numbers in big.items():
        if "p50_ms" not in numbers:
            continue
        ratio = numbers["p50_ms"] / small[name]["p50_ms"]
        table.add_row(
            name,
            f"{numbers['p50_ms']:.1f}",
            f"{numbers['p99_ms']:.1f}",
            f"{small[name]['p50_ms']:.1f}",
            f"{ratio:.2f}",
            f"{numbers['cold_ms']:.0f}",
        )
    console.print(table)
    fold = big["rollup: first fold"]
    console.print(
        f"rollup first fold: {fold['rows']:,.0f} rows in {fold['cold_ms'] / 1e3:.1f} s "
        f"(once; later reads fold only what arrived since)"
    )
    tally = big["experiment tally: first fold"]["cold_ms"]
    recount = {label: results[f"{label} experiment recount"] for label in ("big", "small")}
    console.print(
        f"experiment tally first fold: {tally / 1e3:.2f} s (once); recounting the experiment "
        f"from the raw tables (a look, and every view before the tally): p50 "
        f"{recount['big']['p50_ms']:.0f} ms (p99 {recount['big']['p99_ms']:.0f}) vs "
        f"{recount['small']['p50_ms']:.0f} ms on the small store "
        f"({recount['big']['p50_ms'] / recount['small']['p50_ms']:.1f}x); the page's query "
        f"above the tally's marks: {results['tally plan']}"
    )
    naive = results["naive"]["p50_ms"]
    console.print(
        f"overview counts without the rollup (aggregating the raw tables): p50 {naive:.0f} ms; "
        f"the overview page with it: {big['overview']['p50_ms']:.0f} ms "
        f"(raw aggregation / page: [bold]{naive / big['overview']['p50_ms']:.1f}x[/])"
    )
    for when in ("before", "after"):
        key = f"scans {when} ANALYZE"
        console.print(f"samples queries, big store, {when} ANALYZE: " + "; ".join(results[key]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
