"""A night is read in Prefect: the nightly flow's runs, started as flywheel's commands start
them, hold each stage's INFO line with its counts and decisions (the project's own loggers
included) and a failed line's reason at ERROR, read back from Prefect's API.

The flows run in a child process (``tests.prefect_run_logs``) against Prefect's test
harness, because Prefect takes its logging settings once, at import. Before, every run said
"This run didn't generate logs": Prefect's level was WARNING and the project's loggers were
not sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.prefect_run_logs import FAILING_LINE, FAILURE, LINE, PACKAGE_LINE

# About a minute on a busy 2-core machine, most of it the harness's API server starting.
pytestmark = [pytest.mark.integration]

INFO, WARNING, ERROR = 20, 30, 40
UNREACHABLE = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both nights' results, their flow runs' logs, and what the child printed."""
    folder = tmp_path_factory.mktemp("prefect-run-logs")
    out = folder / "runs.json"
    # The product's own Prefect settings, not the test session's (which quiets Prefect).
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PREFECT_", "FLYWHEEL_"))
    }
    env["FLYWHEEL_HOME"] = str(folder / "home")
    # No replica listens there: the canary flow's reconciling fails and its decisions go on.
    env["FLYWHEEL_GATEWAY_UPSTREAMS"] = UNREACHABLE
    done = subprocess.run(
        [sys.executable, "-m", "tests.prefect_run_logs", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    runs: dict[str, Any] = json.loads(Path(out).read_text(encoding="utf-8"))
    runs["stderr"] = done.stderr
    return runs


def _messages(nights: dict[str, Any], run: str, level: int = INFO) -> list[str]:
    return [log["message"] for log in nights["logs"].get(run, []) if log["level"] == level]


def test_a_line_s_flow_run_logs_each_stage_with_its_counts_and_decisions(
    nights: dict[str, Any],
) -> None:
    assert nights["good"][0]["status"] == "deployed"
    said = "\n".join(_messages(nights, f"nightly-{LINE}"))
    for expected in (
        f"{LINE}: window the beginning → ",
        f"{LINE}: dataset 3f2a1b9c8d7e, 460 training examples (SFT 120, DPO 40, KTO 300) "
        "from 1,234 records",
        f"{LINE}: trained v3 in ",
        "gate passed: promote: preference accuracy 0.62 vs 0.50",
        f"{LINE}: hot-load and canary of {LINE}-v3: canary: ",
        f"{LINE}: retention: no raw text older than",
        f"{LINE}: deployed (v3, {LINE}-v3): ",
    ):
        assert expected in said, f"{expected!r} is not in the run's INFO lines:\n{said}"
    nightly = [m for run in nights["logs"].values() for m in (log["message"] for log in run)]
    assert f"nightly: {LINE} deployed" in nightly


def test_the_project_s_own_loggers_reach_the_run_they_log_in(nights: dict[str, Any]) -> None:
    package = [
        log
        for log in nights["logs"].get(f"nightly-{LINE}", [])
        if log["name"] == "feedback.cleaning"
    ]
    assert [(log["level"], log["message"]) for log in package] == [(INFO, PACKAGE_LINE % LINE)]


def test_a_failed_line_s_reason_is_one_line_at_error(nights: dict[str, Any]) -> None:
    assert nights["failed"][0]["status"] == "failed"
    first_lines = [m.splitlines()[0] for m in _messages(nights, f"nightly-{FAILING_LINE}", ERROR)]
    reason = f"{FAILING_LINE}: failed: FlywheelError: {FAILURE}"
    assert any(line.startswith(reason) for line in first_lines), first_lines


def test_a_failed_line_s_night_ends_failed_in_prefect_and_a_good_one_completed(
    nights: dict[str, Any],
) -> None:
    # The UI colours a run by its state: a night whose training failed must not read
    # "Completed"; its report is still returned to the caller.
    states = nights["states"]
    assert states[f"nightly-{LINE}"] == ["COMPLETED"]
    assert states[f"nightly-{FAILING_LINE}"] == ["FAILED"]
    assert states["flywheel-nightly"] == ["COMPLETED", "FAILED"]
    [failed] = nights["failed"]
    assert failed["status"] == "failed"
    assert FAILURE in failed["reason"]


def test_the_canary_flow_logs_each_line_s_decisions_and_an_unreachable_replica(
    nights: dict[str, Any],
) -> None:
    assert nights["canary"][0]["action"] == "none"
    said = _messages(nights, "flywheel-canary")
    assert f"{LINE}: nothing to judge (no shadow, no canary, no champion on watch)" in said
    [unreachable] = _messages(nights, "flywheel-canary", WARNING)
    assert unreachable.startswith(f"reconciled {UNREACHABLE}: failed vLLM at {UNREACHABLE}")


def test_the_terminal_stays_at_warning(nights: dict[str, Any]) -> None:
    """The INFO lines go to the API; a command's own output is not buried under them."""
    assert "| INFO" not in nights["stderr"]
    assert "| ERROR" in nights["stderr"]
