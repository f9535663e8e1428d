"""Run the nightly flow as flywheel's commands do, against Prefect's test harness, and write
what Prefect's API holds of each flow run's logs (``python -m tests.prefect_run_logs OUT``).

A child process, because Prefect reads its logging settings once, when it is first
imported: here :func:`flows.prefect_env.configure_prefect` runs before that, as in every
command that runs a flow, whereas a test session imports Prefect under its own settings.
The stages that train, evaluate, scrub or call vLLM are replaced by stand-ins that return
what the real ones return; the window, the lease, the routing and the store are the real
ones on the embedded store. Two nights: ``customer_service``'s is a good one (trained, gate
passed, on its canary), ``legal``'s training fails with :data:`FAILURE`; then the canary
flow, on replicas that cannot be reached and a line with nothing to judge (the stand-in put
no canary in the routing table).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

LINE = "customer_service"
FAILING_LINE = "legal"
FAILURE = "the legal recipe's LoRA rank 64 is above the serving vLLM's --max-lora-rank 16"
DATASET = "3f2a1b9c8d7e5a4b"
# What a package logger says during a stage (the stand-in speaks for the cleaning package).
PACKAGE_LINE = "cleaned 1,234 records of %s"


def _stand_ins(fail: bool) -> None:
    """Replace the heavy stages of ``flows.nightly`` by tasks that return as they do."""
    from prefect import task

    import flows.nightly as nightly
    from composition.line_training import TrainingStatus, TrainResult
    from flywheel.errors import FlywheelError

    @task(name="build_datasets")
    def build_datasets(settings: Any, line: str, window: Any) -> dict[str, Any]:
        logging.getLogger("feedback.cleaning").info(PACKAGE_LINE, line)
        return {
            "dataset": DATASET,
            "train_examples": {"sft": 120, "dpo": 40, "kto": 300},
            "funnel": {"steps": {"pulled": {"thumbs_up": 1000, "edit": 234}}},
        }

    @task(name="satisfaction_model")
    def satisfaction_model(settings: Any, line: str, dataset: str) -> dict[str, Any]:
        return {"status": "off", "reason": "the recipe's satisfaction_model is not enabled"}

    @task(name="train_and_gate")
    def train_and_gate(settings: Any, line: str, dataset: str | None) -> TrainResult:
        if fail:
            raise FlywheelError(FAILURE)
        reason = "promote: preference accuracy 0.62 vs 0.50 (n=300, +0.12 ≥ 0.02)"
        return TrainResult(line, TrainingStatus.TRAINED, reason, 3, True)

    @task(name="hot_load_and_canary")
    def hot_load_and_canary(settings: Any, line: str, version: int) -> dict[str, Any]:
        reason = f"{line}-v{version} probed on 1 replica(s); 5% of users"
        return {"adapter": f"{line}-v{version}", "status": "canary", "reason": reason}

    @task(name="enforce_retention")
    def enforce_retention(settings: Any, line: str) -> dict[str, Any]:
        return {"action": "scrub", "cutoff": "2026-11-01T02:00:00+00:00", "interactions": 0}

    nightly.build_datasets = build_datasets
    nightly.satisfaction_model = satisfaction_model
    nightly.train_and_gate = train_and_gate
    nightly.hot_load_and_canary = hot_load_and_canary
    nightly.enforce_retention = enforce_retention


def _logs_by_flow_run() -> dict[str, list[dict[str, Any]]]:
    """Every log the API holds, in order, by flow run: the lines' runs by name
    (``nightly-legal``), the nightly runs that started them as ``flywheel-nightly``."""
    from prefect.client.orchestration import get_client
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    found: dict[str, list[dict[str, Any]]] = {}
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs()
        flows = {run.flow_id: client.read_flow(run.flow_id).name for run in runs}
        names = {
            run.id: run.name if run.name.startswith("nightly-") else flows[run.flow_id]
            for run in runs
        }
        logs: list[Any] = []
        while page := client.read_logs(offset=len(logs)):
            logs += page
        for log in sorted(logs, key=lambda log: log.timestamp):
            run = names.get(log.flow_run_id) if log.flow_run_id else None
            found.setdefault(run or "-", []).append(
                {"level": log.level, "name": log.name, "message": log.message}
            )
    return found


def _states_by_flow_run() -> dict[str, list[str]]:
    """Each flow run's final state type, by run name (``nightly-legal``) or flow name, oldest
    first: what Prefect's UI colours the run by."""
    from prefect.client.orchestration import get_client

    found: dict[str, list[str]] = {}
    with get_client(sync_client=True) as client:
        runs = sorted(client.read_flow_runs(), key=lambda run: str(run.start_time))
        flows = {run.flow_id: client.read_flow(run.flow_id).name for run in runs}
        for run in runs:
            name = run.name if run.name.startswith("nightly-") else flows[run.flow_id]
            state = run.state.type.value if run.state else "-"
            found.setdefault(name, []).append(state)
    return found


def main(out: Path) -> None:
    """Both nights under the test harness; their logs, by flow run name, into ``out``."""
    from flows.prefect_env import configure_prefect
    from flywheel.settings import load_settings

    configure_prefect(load_settings())
    from prefect.testing.utilities import prefect_test_harness

    from flows.canary import canary_watch
    from flows.nightly import run_nightly

    runs: dict[str, Any] = {}
    with prefect_test_harness(server_startup_timeout=240):
        _stand_ins(fail=False)
        runs["good"] = run_nightly(lines=[LINE])
        _stand_ins(fail=True)
        runs["failed"] = run_nightly(lines=[FAILING_LINE])
        runs["canary"] = canary_watch(lines=[LINE])
        runs["logs"] = _logs_by_flow_run()
        runs["states"] = _states_by_flow_run()
    out.write_text(json.dumps(runs, default=str), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
