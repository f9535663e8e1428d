"""Six nights of faults on one store: the rollout lifecycle must never wedge.

Run from the repository root (about 15 minutes on 2 cores; real vLLM on the CPU,
real Prefect flows, real training of tiny adapters, the embedded store and MLflow)::

    .venv/bin/python lab/bench/lifecycle_fault_bench.py [--lines customer_service,legal]
        [--requests 300] [--json results.json]

Each line goes through the same nights:

1. **normal**: new traffic, the nightly flow trains, gates and deploys a canary;
   the canary flow promotes it on the online reactions;
2. **empty window**: no new traffic; the nightly skips the line with the
   reason and keeps the watermark;
3. **deploy failure**: the recipe's LoRA rank (16) passes flywheel's settings
   but not the server (``--max-lora-rank 8``): vLLM refuses the load; the
   version is rejected, the window closed as failed;
4. **canary left live**: a canary is deployed and no decision is made;
5. **vLLM restart, canary live at nightly time**: vLLM restarts with no
   adapter; the nightly skips the line (the canary is live); the canary flow's
   reconciler loads champion and canary back, then it promotes the canary;
6. **champion regresses, then normal**: the new champion's reactions are worse
   than its predecessor's; the canary flow's watch reverts it (routing and
   alias); then a normal nightly deploys and the canary flow promotes.

The online reactions are injected rows (thumbs-down counts per arm; this bench
is about the lifecycle, not about learning: ``flywheel loop`` is). The gate is
loosened and training is four steps for the same reason. After every night it
checks, per line: no window left pending, no MLflow run left RUNNING, routing
vs aliases vs loaded adapters (``flywheel lifecycle check``) with no drift; it
prints one row per night and line, and exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SERVER_RANK = 8


def _recipes(folder: Path, lines: list[str], rank: int) -> None:
    """The demo recipes, trained for four steps, gated loosely, rollout in seconds."""
    from composition.recipes import recipe_settings

    folder.mkdir(parents=True, exist_ok=True)
    for line in lines:
        recipe = recipe_settings(REPO / "recipes/demo" / f"{line}.yaml")
        recipe.update(
            lora={"rank": rank, "alpha": 2 * rank, "dropout": 0.0},
            # A high rate so four steps change the greedy answers (the probe refuses an
            # adapter that answers like the base model).
            learning_rate=1e-2,
            max_steps=4,
            eval_generations=2,
            min_new_examples=5,
            gate={
                "preference_test": "non_inferior",
                "non_inferiority_margin": 1.0,
                "min_eval_pairs": 1,
                "max_preferred_loss_increase": 10,
                "max_general_loss_increase": 10,
                "max_refusal_rate_increase": 1,
                "max_length_ratio": 100,
                "min_length_ratio": 0.01,
            },
            rollout={"soak_s": 0, "watch_s": 3600, "on_live_canary": "keep"},
        )
        (folder / f"{line}.yaml").write_text(yaml.safe_dump(recipe))


def _reactions(
    store: Any, line: str, adapter: str | None, n: int, unhappy: int, at: datetime
) -> None:
    """``n`` answers of ``adapter`` from ``at`` on, the first ``unhappy`` thumbed down."""
    from tests.reactions import arm_events

    events = arm_events(line, adapter, n, unhappy, at, spacing=timedelta(milliseconds=10))
    store.ingest(events, source="fault-bench")


def _traffic(store: Any, lines: list[str], requests: int, seed: int) -> None:
    """Stored traffic for the nightly to train on, inside its next window (after the last
    watermark, before the nightly opens its window). The simulator's late feedback (minutes
    to days after the answer) is brought forward to now: late feedback rightly brings an
    answer back into a later window, which would make the empty night not empty."""
    from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator

    now = datetime.now(UTC)
    simulation = SimulationSettings(
        requests=requests * len(lines),
        seed=seed,
        start=now - timedelta(seconds=1),
        span=timedelta(seconds=1),
        business_lines=tuple(lines),
    )
    events = [
        {**event, "created_at": min(datetime.fromisoformat(event["created_at"]), now).isoformat()}
        for event in TrafficSimulator(simulation).events()
    ]
    store.ingest(events, source="fault-bench")
    time.sleep(1.0)


def _health(settings: Any, store: Any, lines: list[str], upstreams: list[str]) -> dict[str, Any]:
    """Pending windows, RUNNING runs and drift, per line."""
    from composition.clients import build_clients
    from feedback.watermarks import WatermarkStore
    from registry.adapter_sync import lifecycle_check
    from registry.tracking import Registry

    marks = WatermarkStore(store.engine).watermarks()
    registry = Registry.for_home(settings.home, settings.mlflow_tracking_uri)
    with build_clients(settings) as clients:
        check = lifecycle_check(settings, clients, upstreams)
    health = {}
    for line in lines:
        running = registry.client.search_runs(
            [registry.experiment_id(line)], filter_string="attributes.status = 'RUNNING'"
        )
        health[line] = {
            "pending": marks.get(line, {}).get("pending_until") is not None,
            "orphans": len(running),
            "drift": check["lines"].get(line, {}).get("drift", []),
            "watermark": marks.get(line, {}).get("watermark"),
        }
    health["_problems"] = check["problems"]
    return health


def _promote_on_reactions(store: Any, lines: list[str], canary_watch: Any) -> dict[str, str]:
    """Inject good reactions for both arms until the canary flow promotes (at most 4 looks)."""
    from registry.routes import RouteStore

    actions: dict[str, str] = {}
    for _ in range(4):
        pending = [line for line in lines if RouteStore(store.engine).table(line).canary]
        if not pending:
            break
        now = datetime.now(UTC)
        for line in pending:
            table = RouteStore(store.engine).table(line)
            _reactions(store, line, table.champion, 150, 20, now)
            _reactions(store, line, table.canary, 150, 8, now)
        time.sleep(0.5)
        for row in canary_watch(lines=pending):
            actions[row["business_line"]] = row["action"]
    return actions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", default="customer_service,legal")
    parser.add_argument("--requests", type=int, default=300, help="Stored requests per line.")
    parser.add_argument("--home", type=Path, default=None, help="Keep the run here.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    lines = [line.strip() for line in args.lines.split(",") if line.strip()]
    home = args.home or Path(tempfile.mkdtemp(prefix="flywheel-faults-"))
    recipes = home / "recipes"
    _recipes(recipes, lines, SERVER_RANK)
    os.environ.update(
        FLYWHEEL_HOME=str(home),
        FLYWHEEL_RECIPES_DIR=str(recipes),
        FLYWHEEL_VLLM_MAX_LORA_RANK=str(SERVER_RANK),
        FLYWHEEL_BUSINESS_LINES=json.dumps(lines),
    )
    os.environ.pop("FLYWHEEL_DATABASE_URL", None)
    from flywheel.settings import load_settings

    settings = load_settings()
    from flows.prefect_env import configure_prefect

    configure_prefect(settings)
    from feedback.store import FeedbackStore
    from flows.canary import canary_watch
    from flows.nightly import line_nightly
    from flywheel.install import vllm_venv
    from registry.routes import RouteStore
    from registry.vllm_server import VllmEnvironment, VllmServer, VllmServerSettings, free_port
    from training.base_model import ensure_base_model

    cached = REPO / ".cache" / "models"
    if cached.is_dir() and not settings.models_dir.exists():
        shutil.copytree(cached, settings.models_dir)
    base = ensure_base_model(settings.models_dir, settings.base_model)
    python = VllmEnvironment(vllm_venv(settings.home), torch_index=settings.torch_index).ensure()
    server = VllmServer(
        VllmServerSettings(
            model=base, port=free_port(), served_model_name=base.name, max_lora_rank=SERVER_RANK
        ),
        python=python,
        log_path=home / "logs" / "vllm.log",
        report=print,
    )
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    started_all = time.monotonic()
    store = FeedbackStore.open(settings)
    server.start()
    os.environ["FLYWHEEL_GATEWAY_UPSTREAMS"] = server.base_url
    upstreams = [server.base_url]

    def night(number: int, scenario: str, nightly: dict[str, Any], canary: dict[str, str]) -> None:
        health = _health(load_settings(), store, lines, upstreams)
        for line in lines:
            state = health[line]
            table = RouteStore(store.engine).table(line)
            row = {
                "night": number,
                "scenario": scenario,
                "line": line,
                "nightly": nightly.get(line, {}).get("status", "-"),
                "why": (nightly.get(line, {}).get("reason") or "")[:70],
                "canary_flow": canary.get(line, "-"),
                "champion": table.champion or "base",
                "canary": table.canary or "-",
                "pending": state["pending"],
                "orphan_runs": state["orphans"],
                "drift": state["drift"],
            }
            rows.append(row)
            if state["pending"] or state["orphans"] or state["drift"]:
                failed.append(f"night {number} {line}: {row}")
            print(
                f"night {number} {scenario:<34} {line:<17} nightly {row['nightly']:<11} "
                f"canary flow {row['canary_flow']:<9} champion {row['champion']:<20} "
                f"canary {row['canary']:<20} pending {row['pending']!s:<5} "
                f"orphans {row['orphan_runs']} drift {len(row['drift'])}  {row['why']}",
                flush=True,
            )

    def nightly_all() -> dict[str, Any]:
        # A failed line's run ends Failed in Prefect; its report is still the state's data.
        return {
            line: line_nightly(line, return_state=True).result(raise_on_failure=False)
            for line in lines
        }

    try:
        # 1. normal
        _traffic(store, lines, args.requests, seed=1)
        first = nightly_all()
        night(1, "normal", first, _promote_on_reactions(store, lines, canary_watch))
        # 2. empty window
        night(2, "empty window", nightly_all(), {})
        # 3. deploy failure: flywheel believes rank 16 fits; the server says no.
        _recipes(recipes, lines, 16)
        os.environ["FLYWHEEL_VLLM_MAX_LORA_RANK"] = "16"
        _traffic(store, lines, args.requests, seed=3)
        night(3, "deploy failure (rank over the server's)", nightly_all(), {})
        _recipes(recipes, lines, SERVER_RANK)
        os.environ["FLYWHEEL_VLLM_MAX_LORA_RANK"] = str(SERVER_RANK)
        # 4. a canary left live
        _traffic(store, lines, args.requests, seed=4)
        night(4, "canary left live", nightly_all(), {})
        # 5. vLLM restarts (no adapter loaded); the nightly meets a live canary.
        server.stop()
        server.start()
        _traffic(store, lines, args.requests, seed=5)
        fifth = nightly_all()
        night(5, "vLLM restart, canary live at nightly", fifth, _promote_on_reactions(
            store, lines, canary_watch
        ))  # fmt: skip
        # 6. the new champion regresses against its predecessor; then a normal night.
        promoted_at = datetime.now(UTC)
        for line in lines:
            table = RouteStore(store.engine).table(line)
            _reactions(store, line, table.previous, 150, 10, promoted_at - timedelta(minutes=5))
            _reactions(store, line, table.champion, 150, 90, promoted_at)
        time.sleep(0.5)
        watched = {r["business_line"]: r["champion_watch"] for r in canary_watch(lines=lines)}
        night(6, "champion regresses (watch)", {}, watched)
        _traffic(store, lines, args.requests, seed=6)
        sixth = nightly_all()
        night(
            6, "normal after the revert", sixth, _promote_on_reactions(store, lines, canary_watch)
        )
    finally:
        server.stop()
        store.close()
    minutes = (time.monotonic() - started_all) / 60
    expected = {
        (1, "nightly"): "deployed",
        (1, "canary_flow"): "promote",
        (2, "nightly"): "skipped",
        (3, "nightly"): "failed",
        (4, "nightly"): "deployed",
        (5, "nightly"): "canary_live",
        (5, "canary_flow"): "promote",
    }
    for row in rows:
        want = [
            (key, value)
            for (number, key), value in expected.items()
            if number == row["night"] and row[key] != value
        ]
        if want:
            failed.append(f"night {row['night']} {row['line']}: expected {want}, got {row}")
    reverted = [r for r in rows if r["scenario"].startswith("champion regresses")]
    failed += [f"no revert on {r['line']}: {r}" for r in reverted if r["canary_flow"] != "revert"]
    print(f"\n{len(rows)} rows, {minutes:.1f} min; " + ("all checks passed" if not failed else ""))
    for problem in failed:
        print(f"FAILED: {problem}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "minutes": minutes, "failed": failed},
                                        default=str, indent=2))  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
