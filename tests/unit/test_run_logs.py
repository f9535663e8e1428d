"""How flywheel sets Prefect up: a flow run's INFO lines (the project's loggers included) go to
Prefect's API and the terminal stays at WARNING; and the lines the flows log, built from
their results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from composition.line_training import TrainingStatus, TrainResult
from composition.nightly_report import (
    LineReport,
    LineStatus,
    describe_datasets,
    describe_line,
    describe_retention,
    describe_training,
)
from flows.canary import describe_decisions, describe_sync
from flows.prefect_env import PROJECT_LOGGERS, RUN_LOGS, TELEMETRY_OFF
from tests.conftest import REPO

# What Prefect makes of flywheel's settings, in a process that sets them up as every command
# does (configure_prefect before Prefect's first import).
PROBE = """
import json, logging, sys
from flows.prefect_env import PROJECT_LOGGERS, configure_prefect
from flywheel.settings import load_settings

configure_prefect(load_settings())
import flows.nightly  # as a command imports its flow: Prefect sets its logging up
from prefect.logging.handlers import APILogHandler, PrefectConsoleHandler
from prefect.settings import get_current_settings

settings = get_current_settings()
root = logging.getLogger()
print(json.dumps({
    "analytics": settings.server.analytics_enabled,
    "run_logger": logging.getLogger("prefect.flow_runs").getEffectiveLevel(),
    "package_levels": {n: logging.getLogger(n + ".x").getEffectiveLevel() for n in PROJECT_LOGGERS},
    "to_api": [
        n for n in PROJECT_LOGGERS
        if any(isinstance(h, APILogHandler) for h in logging.getLogger(n).handlers)
    ],
    "console": [h.level for h in root.handlers if isinstance(h, PrefectConsoleHandler)],
}))
"""


def _probe(tmp_path: Path) -> dict[str, Any]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PREFECT_", "FLYWHEEL_", "DO_NOT_TRACK"))
    }
    env["FLYWHEEL_HOME"] = str(tmp_path / "home")
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_a_command_s_prefect_sends_run_logs_at_info_and_keeps_the_terminal_at_warning(
    tmp_path: Path,
) -> None:
    found = _probe(tmp_path)
    assert found["run_logger"] == 20, "the flow run logger's INFO lines are dropped"
    assert found["package_levels"] == dict.fromkeys(PROJECT_LOGGERS, 20)
    assert found["to_api"] == list(PROJECT_LOGGERS), "a package's logger is not sent to Prefect"
    assert found["console"] == [30]
    assert found["analytics"] is False


def test_docker_compose_s_flow_runs_log_as_a_command_s_do() -> None:
    """The workers' flow runs read only their environment: the shared one carries the same
    logging settings, and Prefect's server there sends no telemetry."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))
    shared = {name: str(value) for name, value in compose["x-flywheel-env"].items()}
    assert shared.items() >= RUN_LOGS.items()
    server = {
        name: str(value)
        for name, value in compose["services"]["prefect-server"]["environment"].items()
    }
    assert server.items() >= TELEMETRY_OFF.items()


def test_the_datasets_line_gives_the_counts_by_kind() -> None:
    datasets = {
        "dataset": "3f2a1b9c8d7e5a4b",
        "train_examples": {"sft": 120, "dpo": 40, "kto": 1300},
        "funnel": {"steps": {"pulled": {"thumbs_up": 2000, "edit": 234}}},
    }
    assert describe_datasets("legal", datasets, 12.34) == (
        "legal: dataset 3f2a1b9c8d7e, 1,460 training examples (SFT 120, DPO 40, KTO 1,300) "
        "from 2,234 records (12.3 s)"
    )
    empty = {"dataset": None, "train_examples": {}, "funnel": {}}
    assert describe_datasets("legal", empty, 0.5) == (
        "legal: no new dataset: 0 training examples (0.5 s)"
    )


def test_the_training_line_gives_the_version_the_time_and_the_gate_s_verdict() -> None:
    trained = TrainResult("legal", TrainingStatus.TRAINED, "margin 0.01 < 0.02", 3, False)
    assert describe_training("legal", trained, 486.0) == (
        "legal: trained v3 in 8.1 min; gate failed: margin 0.01 < 0.02"
    )
    reused = TrainResult("legal", TrainingStatus.REUSED, "already version 2", 2, True)
    assert describe_training("legal", reused, 1.0) == (
        "legal: reused v2, gate passed: already version 2"
    )
    skipped = TrainResult.skipped("legal", "3 new DPO examples < 10")
    assert describe_training("legal", skipped, 0.1) == (
        "legal: training skipped: 3 new DPO examples < 10"
    )


def test_the_retention_and_closing_lines() -> None:
    assert describe_retention("legal", {"action": "delete", "cutoff": "C", "interactions": 3}) == (
        "legal: retention: deleted 3 interactions, 0 feedback events, 0 shadow outputs older than C"
    )
    report = LineReport(
        "legal",
        LineStatus.GATED_OUT,
        "margin 0.01 < 0.02",
        version=3,
        seconds={"datasets": 30.0, "datasets.scrub": 20.0, "train_eval_gate_register": 60.0},
    )
    assert describe_line(report) == "legal: gated_out (v3): margin 0.01 < 0.02 [1.5 min]"


def test_each_canary_decision_is_a_line_and_a_quiet_line_says_so() -> None:
    result = {
        "business_line": "legal",
        "action": "rollback",
        "reason": "thumbs down 0.30 vs 0.10",
        "champion_watch": "none",
        "champion_watch_reason": "no champion on watch",
        "shadow": "none",
        "shadow_reason": "no shadow on this line",
    }
    assert describe_decisions(result) == ["legal: canary: rolled back: thumbs down 0.30 vs 0.10"]
    quiet = result | {"action": "none"}
    assert describe_decisions(quiet) == [
        "legal: nothing to judge (no shadow, no canary, no champion on watch)"
    ]
    changes = {"loaded": ["legal-v3"], "kept": ["legal-v2"], "unloaded": [], "failed": []}
    assert describe_sync("http://vllm:8000", changes) == "http://vllm:8000: loaded legal-v3"
