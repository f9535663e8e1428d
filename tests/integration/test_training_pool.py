"""The nightly trains its lines on a Prefect work pool: two lines, two process workers, in parallel.

A real Prefect API server (the test harness), the training deployment registered by
``flows.training.deploy_training``, two ``prefect worker start --type process --limit 1``
workers, and the nightly flow of two lines with ``FLYWHEEL_TRAINING_DEPLOYMENT`` set. Each
line's training is a flow run on a worker; the runs' pids differ and their times overlap.
The gate is set to refuse, so the test needs no vLLM.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from feedback.store import FeedbackStore
from flywheel.settings import load_settings
from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LINES = ("customer_service", "legal")
POOL = "flywheel-training-test"
RECIPE = """\
business_line: {line}
method: dpo
lora: {{rank: 8, alpha: 16, dropout: 0.0}}
learning_rate: 2.0e-4
max_steps: 2
batch_size: 2
max_length: 160
min_new_examples: 5
eval_generations: 1
gate: {{min_margin_gain: 100, min_eval_pairs: 1}}
"""


@pytest.fixture
def prefect_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A temporary Prefect API server; flow results on a folder every process shares."""
    monkeypatch.setenv("PREFECT_LOCAL_STORAGE_PATH", str(tmp_path / "prefect-results"))
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        url = PREFECT_API_URL.value()
        assert url
        yield str(url)


def _worker(api: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_LOGGING_LEVEL": "INFO"}
    argv = [
        sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL,
        "--type", "process", "--limit", "1",
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_a_nightly_trains_two_lines_on_two_pool_workers_at_once(
    tmp_path: Path,
    base_model_dir: Path,
    prefect_api: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    for line in LINES:
        (recipes / f"{line}.yaml").write_text(RECIPE.format(line=line))
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLYWHEEL_RECIPES_DIR", str(recipes))
    monkeypatch.setenv("FLYWHEEL_BASE_MODEL", str(base_model_dir))
    monkeypatch.setenv("FLYWHEEL_BUSINESS_LINES", '["customer_service", "legal"]')
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    monkeypatch.delenv("FLYWHEEL_MLFLOW_TRACKING_URI", raising=False)
    # One torch thread per training: two of them share this machine's cores.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    settings = load_settings()
    store = FeedbackStore.open(settings)
    simulation = SimulationSettings(
        requests=500, seed=11, start=datetime(2026, 11, 1, tzinfo=UTC), business_lines=LINES
    )
    store.ingest(TrafficSimulator(simulation).events(), source="simulate")
    store.close()

    from flows.nightly import run_nightly
    from flows.training import TRAIN_FLOW, deploy_training

    deployment = deploy_training(POOL)
    monkeypatch.setenv("FLYWHEEL_TRAINING_DEPLOYMENT", deployment)
    monkeypatch.setenv("FLYWHEEL_TRAINING_TIMEOUT_S", "1200")
    workers = [_worker(prefect_api, tmp_path / f"worker-{n}.log") for n in (1, 2)]
    try:
        reports = run_nightly(lines=list(LINES))
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
    logs = "\n".join((tmp_path / f"worker-{n}.log").read_text()[-2000:] for n in (1, 2))

    by_line = {report["business_line"]: report for report in reports}
    for line in LINES:
        assert by_line[line]["status"] == "gated_out", (by_line[line], logs)
        assert by_line[line]["version"] == 1

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[TRAIN_FLOW])))
    assert len(runs) == 2, [run.name for run in runs]
    assert all(run.state is not None and run.state.is_completed() for run in runs)
    assert {run.parameters["line"] for run in runs} == set(LINES)
    for run in runs:
        # Small typed parameters only: no settings, no store URL, no secret.
        assert set(run.parameters) == {"line", "dataset_hash", "force"}
        assert all("://" not in str(value) for value in run.parameters.values())
    pids = {run.infrastructure_pid for run in runs}
    assert None not in pids
    assert len(pids) == 2, pids  # two worker processes
    first, second = sorted(runs, key=lambda run: run.start_time or datetime.max.replace(tzinfo=UTC))
    assert first.end_time is not None
    assert second.start_time is not None
    assert second.start_time < first.end_time, "the two lines' trainings did not overlap"
