"""The Prefect deployments are declared once (flows/deployments.py): prefect.yaml is generated
from them, and ``flywheel schedule`` serves the scheduled ones as declared; a Prefect server
that flywheel starts, or prints the command of, sends no telemetry."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.deployments import (
    CANARY,
    DEPLOYMENTS,
    NIGHTLY,
    PREFECT_YAML,
    TRAIN_LINE,
    FlowDeployment,
    main,
    render_prefect_yaml,
    served_deployments,
)
from flows.prefect_env import DEFAULTS, TELEMETRY_OFF
from flows.schedule import prefect_server_command
from tests.conftest import REPO


def test_prefect_yaml_is_the_one_the_deployments_module_generates() -> None:
    assert PREFECT_YAML == REPO / "prefect.yaml"
    assert PREFECT_YAML.read_text(encoding="utf-8") == render_prefect_yaml(), (
        "prefect.yaml differs from flows/deployments.py: edit the module and run "
        "`python -m flows.deployments`"
    )


def test_prefect_yaml_says_what_each_declaration_says() -> None:
    declared = {d["name"]: d for d in yaml.safe_load(render_prefect_yaml())["deployments"]}
    assert list(declared) == [d.name for d in DEPLOYMENTS]
    for deployment in DEPLOYMENTS:
        entry = declared[deployment.name]
        assert entry["entrypoint"] == deployment.entrypoint
        assert (REPO / deployment.entrypoint.partition(":")[0]).is_file()
        assert entry["description"] == deployment.description
        assert entry["work_pool"] == {"name": deployment.work_pool}
        assert ("concurrency_limit" in entry) == deployment.one_at_a_time
    assert declared["nightly"]["schedules"] == [{"cron": "0 2 * * *", "timezone": "UTC"}]
    assert declared["canary"]["schedules"] == [{"interval": 600}]
    assert "schedules" not in declared["train-line"]


def test_check_fails_on_a_prefect_yaml_edited_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "prefect.yaml"
    assert main(["--path", str(path)]) == 0
    assert main(["--check", "--path", str(path)]) == 0
    path.write_text(path.read_text().replace("0 2 * * *", "0 3 * * *"))
    assert main(["--check", "--path", str(path)]) == 1
    assert "python -m flows.deployments" in capsys.readouterr().out


def test_a_deployment_has_one_schedule_at_most() -> None:
    with pytest.raises(ValueError, match="not both"):
        FlowDeployment("x", "flows.nightly:nightly", "x", "pool", cron="* * * * *", interval_s=60)


def test_flywheel_schedule_serves_the_declared_scheduled_deployments() -> None:
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy

    served = {
        d.name: d
        for d in served_deployments(
            cron="30 1 * * *", timezone="Europe/Paris", canary_every=timedelta(minutes=5)
        )
    }
    assert set(served) == {d.name for d in DEPLOYMENTS if d.scheduled} == {"nightly", "canary"}
    nightly, canary = served["nightly"], served["canary"]
    assert nightly.flow_name == NIGHTLY.load_flow().name
    assert canary.flow_name == CANARY.load_flow().name
    assert nightly.description == NIGHTLY.description
    [cron] = nightly.schedules
    assert (cron.schedule.cron, cron.schedule.timezone) == ("30 1 * * *", "Europe/Paris")
    [every] = canary.schedules
    assert every.schedule.interval == timedelta(minutes=5)
    for deployment in (nightly, canary):
        assert deployment.concurrency_limit == 1
        assert deployment.concurrency_options is not None
        assert deployment.concurrency_options.collision_strategy is (
            ConcurrencyLimitStrategy.CANCEL_NEW
        )


def test_the_training_deployment_is_registered_as_declared() -> None:
    from cli.main import deploy_training_command, schedule
    from flows.training import TRAIN_DEPLOYMENT, TRAIN_FLOW, train_line_flow

    assert TRAIN_LINE.name == TRAIN_DEPLOYMENT
    assert TRAIN_LINE.load_flow() is train_line_flow
    assert train_line_flow.name == TRAIN_FLOW
    defaults = deploy_training_command.__defaults__
    assert defaults is not None
    assert list(defaults) == [TRAIN_LINE.work_pool, TRAIN_LINE.name]
    schedule_defaults = schedule.__defaults__
    assert schedule_defaults is not None
    assert list(schedule_defaults[:3]) == [
        NIGHTLY.cron,
        NIGHTLY.timezone,
        (CANARY.interval_s or 0) / 60,
    ]


def test_telemetry_is_off_wherever_flywheel_starts_or_prints_a_prefect_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert DEFAULTS.items() >= TELEMETRY_OFF.items()
    words = shlex.split(prefect_server_command(tmp_path / "prefect home"))
    assert words[-3:] == [".venv/bin/prefect", "server", "start"]
    assigned = dict(word.split("=", 1) for word in words[:-3])
    assert assigned == {"PREFECT_HOME": str(tmp_path / "prefect home"), **TELEMETRY_OFF}
    captured: dict[str, Any] = {}

    @contextmanager
    def started(argv: list[str], **options: Any) -> Iterator[None]:
        captured.update(argv=argv, env=options["env"])
        yield

    import flows.schedule

    monkeypatch.setattr(flows.schedule, "service_process", started)
    with flows.schedule.prefect_server(tmp_path / "prefect", 4299) as api:
        assert api == "http://127.0.0.1:4299/api"
    assert captured["argv"][1:5] == ["-m", "prefect", "server", "start"]
    assert captured["env"].items() >= TELEMETRY_OFF.items()
