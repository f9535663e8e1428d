"""Training as its own Prefect deployment, so lines train on a work pool's workers.

By default the nightly and ``flywheel train`` train in their own process
(:func:`composition.line_training.train_line`). With ``FLYWHEEL_TRAINING_DEPLOYMENT`` set
(``flywheel-train-line/<name>``, registered by :func:`deploy_training` or by
``prefect deploy`` from ``prefect.yaml``), they start that deployment with
``run_deployment`` and wait for it instead: each line's training is a flow run on
a worker of the deployment's work pool — a ``process`` pool on one machine, GPU
workers in docker-compose — so the lines of a night train in parallel, in
separate processes, each with its own torch threads.

The flow takes the line and the dataset's content hash; never settings or a
secret (a worker reads its own environment). Its small JSON result is persisted
so the caller can read it back. Idempotence is the registry's, not Prefect's
cache: the same dataset, recipe and base model reuse the registered version, so
a retried or repeated run never trains twice.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from composition.clients import open_clients
from composition.line_training import TrainResult, train_line
from flows.deployments import TRAIN_LINE
from flywheel.errors import FlywheelError
from flywheel.settings import Settings, current_settings

TRAIN_FLOW = "flywheel-train-line"
TRAIN_DEPLOYMENT = TRAIN_LINE.name


class TrainingRunError(FlywheelError):
    """A training flow run on the work pool failed or was cancelled."""


class TrainingTimeoutError(TimeoutError):
    """The training flow run did not finish in time (it may still be running)."""


@flow(
    name=TRAIN_FLOW,
    flow_run_name="train-{line}",
    persist_result=True,
    result_serializer="json",
)
def train_line_flow(
    line: str, dataset_hash: str | None = None, force: bool = False
) -> dict[str, Any]:
    """Train, evaluate, gate and register one line's adapter on this worker."""
    settings = current_settings()
    if line not in settings.business_lines:
        raise FlywheelError(f"unknown business line {line!r}")
    with open_clients(settings) as clients:
        outcome = train_line(settings, clients, line, dataset_hash=dataset_hash, force=force)
    result = TrainResult.from_outcome(outcome)
    get_run_logger().info(
        "%s: %s (version %s): %s", line, result.status.value, result.version, result.reason
    )
    return result.as_dict()


def train(
    settings: Settings, line: str, dataset_hash: str | None, *, force: bool = False
) -> TrainResult:
    """Train one line: on the work pool when a training deployment is configured, else here."""
    if settings.training_deployment is None:
        with open_clients(settings) as clients:
            outcome = train_line(settings, clients, line, dataset_hash=dataset_hash, force=force)
        return TrainResult.from_outcome(outcome)
    return train_on_pool(
        settings.training_deployment,
        line,
        dataset_hash,
        force=force,
        timeout_s=settings.training_timeout_s,
    )


def train_on_pool(
    deployment: str,
    line: str,
    dataset_hash: str | None,
    *,
    force: bool = False,
    timeout_s: float,
    poll_s: float = 2.0,
) -> TrainResult:
    """Start the training deployment for ``line`` and wait for its result.

    Raises :class:`TrainingTimeoutError` (a transient failure: the nightly keeps its
    window open) when the run has not finished after ``timeout_s``, and
    :class:`TrainingRunError` with the run's state when it failed or was cancelled.
    """
    from prefect.deployments import run_deployment

    run = run_deployment(
        name=deployment,
        parameters={"line": line, "dataset_hash": dataset_hash, "force": force},
        timeout=timeout_s,
        poll_interval=poll_s,
    )
    state = run.state
    if state is None or not state.is_final():
        raise TrainingTimeoutError(
            f"training {line} on {deployment} (flow run {run.name}) had not finished after "
            f"{timeout_s:g} s (FLYWHEEL_TRAINING_TIMEOUT_S); it may still be running"
        )
    if not state.is_completed():
        raise TrainingRunError(
            f"training {line} on {deployment} (flow run {run.name}) ended {state.name}: "
            f"{state.message or 'no message'}"
        )
    return TrainResult.from_dict(state.result())


def deploy_training(work_pool: str, *, name: str = TRAIN_DEPLOYMENT) -> str:
    """Register the training flow as a deployment on ``work_pool``; its full name.

    Creates the pool as a ``process`` pool when it does not exist yet. The workers
    import the flow from the installed package (no image, no code storage): every
    worker of the pool runs this same flywheel install.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.types.entrypoint import EntrypointType
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(work_pool)
        except ObjectNotFound:
            client.create_work_pool(
                WorkPoolCreate(
                    name=work_pool,
                    type=ProcessWorker.type,
                    base_job_template=ProcessWorker.get_default_base_job_template(),
                )
            )
    train_line_flow.deploy(
        name=name,
        work_pool_name=work_pool,
        build=False,
        push=False,
        entrypoint_type=EntrypointType.MODULE_PATH,
        print_next_steps=False,
        description=TRAIN_LINE.description,
    )
    return f"{TRAIN_FLOW}/{name}"
