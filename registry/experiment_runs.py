"""An A/B experiment's MLflow run: opened with its arms and test settings, each look logged
as metrics at its step with the verdict as tags, closed with how it ended."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from registry.experiment_store import ExperimentRecord
from registry.experiments import ArmLabel, ExperimentLook
from registry.records import TAG_LINE
from registry.routing import RoutingTable

if TYPE_CHECKING:
    from registry.tracking import Registry

RUN_KIND = "ab_experiment"


def open_experiment_run(registry: Registry, record: ExperimentRecord) -> str:
    """The experiment's MLflow run in the line's experiment: its arms and settings."""
    from mlflow.entities import Param

    client = registry.client
    run = client.create_run(
        registry.experiment_id(record.business_line),
        run_name=f"ab-{record.id}-{record.metric}",
        tags={
            TAG_LINE: record.business_line,
            "flywheel.run_kind": RUN_KIND,
            "flywheel.ab_experiment_id": str(record.id),
        },
    )
    run_id = str(run.info.run_id)
    params = {
        "arm_a": record.arm_a or "base",
        "arm_b": record.arm_b or "base",
        "share_b": record.share,
        "metric": record.metric,
        **record.policy.model_dump(),
    }
    client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])
    return run_id


def log_experiment_look(
    registry: Registry, record: ExperimentRecord, look: ExperimentLook, step: int
) -> None:
    """The look's numbers as metrics at step ``look``, the verdict as tags."""
    from mlflow.entities import Metric, RunTag

    if record.mlflow_run_id is None:
        return
    stamp = int(time.time() * 1000)
    numbers = look.as_dict()
    metrics = [
        Metric(key, float(value), stamp, step)
        for key, value in numbers.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]
    tags = [RunTag("ab.verdict", look.verdict.value), RunTag("ab.reason", look.reasons[0][:4000])]
    if record.winner is not None:
        tags += [
            RunTag("ab.winner", record.winner.upper()),
            RunTag("ab.winner_adapter", record.arm(record.winner) or "base"),
            RunTag("ab.decided_look", str(record.decided_look)),
        ]
    registry.client.log_batch(record.mlflow_run_id, metrics=metrics, tags=tags)


def close_experiment_run(
    registry: Registry,
    record: ExperimentRecord,
    after: RoutingTable,
    *,
    promoted: ArmLabel | None = None,
) -> None:
    """The run's outcome as tags (status, why it ended, the champion after), then ended."""
    if record.mlflow_run_id is None:
        return
    client = registry.client
    client.set_tag(record.mlflow_run_id, "ab.status", record.status)
    client.set_tag(record.mlflow_run_id, "ab.ended_reason", (record.ended_reason or "")[:4000])
    client.set_tag(record.mlflow_run_id, "ab.champion_after", after.champion or "base")
    if promoted is not None:
        client.set_tag(record.mlflow_run_id, "ab.promoted", promoted.upper())
    client.set_terminated(record.mlflow_run_id, "FINISHED")
