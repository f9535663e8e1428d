"""flywheel's Prefect deployments, declared once.

Three deployments: the nightly retraining (cron), the canary watch (every few minutes) and
one line's training (no schedule: the nightly starts it on the training work pool). This
module is their one home:

- ``prefect.yaml`` (``prefect deploy --all`` for docker-compose's work pools) is generated
  from it: ``python -m flows.deployments`` writes it, ``--check`` says whether it is current,
  and a unit test fails when the two differ;
- ``flywheel schedule`` serves the scheduled ones from it (:func:`served_deployments`);
- ``flywheel deploy-training`` registers the training one under its name and description.

Nothing here imports Prefect at import time: flywheel points Prefect at its home before
Prefect is first imported (``flows.prefect_env``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect.deployments.runner import RunnerDeployment

PREFECT_YAML = Path(__file__).resolve().parents[1] / "prefect.yaml"
# The image keeps the code here (docker/Dockerfile's WORKDIR): flow runs start in it.
IMAGE_WORKDIR = "/app"
PREFECT_VERSION = "3.9.1"
# The schedules' defaults (``flywheel schedule`` takes others as options).
NIGHTLY_CRON = "0 2 * * *"
SCHEDULE_TIMEZONE = "UTC"
CANARY_EVERY_S = 600


@dataclass(frozen=True, slots=True)
class FlowDeployment:
    """One deployment of a flywheel flow: what runs, where, and when.

    ``flow`` is ``module:attribute`` (``flows.nightly:nightly``); ``work_pool`` is the
    pool whose workers run it under docker-compose; ``cron`` (in ``timezone``) or
    ``interval_s`` is its schedule, neither for one started on demand; ``one_at_a_time``
    cancels a new run while the last one is still going.
    """

    name: str
    flow: str
    description: str
    work_pool: str
    cron: str | None = None
    timezone: str = "UTC"
    interval_s: float | None = None
    one_at_a_time: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        if self.cron is not None and self.interval_s is not None:
            raise ValueError(f"deployment {self.name!r}: a cron or an interval, not both")
        if self.interval_s is not None and self.interval_s <= 0:
            raise ValueError(f"deployment {self.name!r}: interval_s must be positive")

    @property
    def entrypoint(self) -> str:
        """The flow as prefect.yaml names it: ``flows/nightly.py:nightly``."""
        module, _, attribute = self.flow.partition(":")
        return f"{module.replace('.', '/')}.py:{attribute}"

    @property
    def scheduled(self) -> bool:
        """Whether it runs on a schedule (``flywheel schedule`` serves it)."""
        return self.cron is not None or self.interval_s is not None

    def load_flow(self) -> Any:
        """The Prefect flow object (imports Prefect)."""
        module, _, attribute = self.flow.partition(":")
        return getattr(importlib.import_module(module), attribute)

    def to_runner_deployment(self) -> RunnerDeployment:
        """This deployment as ``prefect.serve`` takes it (no work pool: served in-process)."""
        from prefect.client.schemas.objects import (
            ConcurrencyLimitConfig,
            ConcurrencyLimitStrategy,
        )
        from prefect.schedules import Cron, Interval

        schedule = None
        if self.cron is not None:
            schedule = Cron(self.cron, timezone=self.timezone)
        elif self.interval_s is not None:
            schedule = Interval(timedelta(seconds=self.interval_s))
        limit = None
        if self.one_at_a_time:
            limit = ConcurrencyLimitConfig(
                limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW
            )
        deployment: RunnerDeployment = self.load_flow().to_deployment(
            name=self.name,
            description=self.description,
            schedule=schedule,
            concurrency_limit=limit,
        )
        return deployment


NIGHTLY = FlowDeployment(
    name="nightly",
    flow="flows.nightly:nightly",
    description=(
        "Per business line, in parallel: datasets -> train -> gate -> register -> hot-load -> "
        "5% canary. Lines with too few new examples are skipped."
    ),
    work_pool="flywheel",
    cron=NIGHTLY_CRON,
    timezone=SCHEDULE_TIMEZONE,
    one_at_a_time=True,
)
CANARY = FlowDeployment(
    name="canary",
    flow="flows.canary:canary_watch",
    description=(
        "For each line with a canary: compare it with the champion and promote, step up, roll "
        "back or wait; every decision is recorded with its numbers."
    ),
    work_pool="flywheel",
    interval_s=CANARY_EVERY_S,
    one_at_a_time=True,
)
TRAIN_LINE = FlowDeployment(
    name="train-line",
    flow="flows.training:train_line_flow",
    description="Train, evaluate, gate and register one business line's adapter.",
    work_pool="flywheel-training",
    note=(
        "One line's training, started by the nightly with run_deployment when "
        "FLYWHEEL_TRAINING_DEPLOYMENT=flywheel-train-line/train-line: lines train in parallel, "
        "each in a flow run on a worker of the training pool (GPU workers in docker-compose)."
    ),
)
DEPLOYMENTS: tuple[FlowDeployment, ...] = (NIGHTLY, CANARY, TRAIN_LINE)


def served_deployments(
    *, cron: str, timezone: str, canary_every: timedelta
) -> list[RunnerDeployment]:
    """The scheduled deployments as ``flywheel schedule`` serves them: the nightly at
    ``cron`` in ``timezone``, the canary every ``canary_every`` (its options' values)."""
    chosen = {
        NIGHTLY.name: dataclasses.replace(NIGHTLY, cron=cron, timezone=timezone),
        CANARY.name: dataclasses.replace(CANARY, interval_s=canary_every.total_seconds()),
    }
    return [
        chosen.get(deployment.name, deployment).to_runner_deployment()
        for deployment in DEPLOYMENTS
        if deployment.scheduled
    ]


_HEADER = """\
# GENERATED from flows/deployments.py by `python -m flows.deployments`: edit the module, then
# regenerate (tests/unit/test_deployments.py fails while the two differ).
#
# Prefect deployments of flywheel's flows, for `process` work pools (docker-compose's
# `prefect-worker`, and `training-worker` for the training pool). `prefect --no-prompt deploy
# --all` registers them (the compose service `prefect-deploy` does it once the workers have
# created their pools). Without a work pool, `flywheel schedule` serves the scheduled ones
# (nightly, canary) and `flywheel deploy-training` registers the training one.
name: flywheel
prefect-version: {version}

# The code is baked into the image (docker/Dockerfile, WORKDIR {workdir}): nothing to build or
# push; a flow run starts in the folder that holds it.
build: null
push: null
pull:
  - prefect.deployments.steps.set_working_directory:
      directory: {workdir}

deployments:
"""


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, 92 - len(indent))]


def _deployment_yaml(deployment: FlowDeployment) -> list[str]:
    lines = [f"  - name: {deployment.name}", "    description: >-"]
    lines += [f"      {line}" for line in textwrap.wrap(deployment.description, 88)]
    lines += [
        f"    entrypoint: {deployment.entrypoint}",
        "    parameters: {}",
        "    work_pool:",
        f"      name: {deployment.work_pool}",
    ]
    if deployment.cron is not None:
        lines += [
            "    schedules:",
            f"      - cron: {json.dumps(deployment.cron)}",
            f"        timezone: {deployment.timezone}",
        ]
    elif deployment.interval_s is not None:
        lines += ["    schedules:", f"      - interval: {deployment.interval_s:g}"]
    if deployment.one_at_a_time:
        lines += [
            "    # One run at a time: a new one is cancelled while the last is still going.",
            "    concurrency_limit:",
            "      limit: 1",
            "      collision_strategy: CANCEL_NEW",
        ]
    return lines


def render_prefect_yaml(deployments: Sequence[FlowDeployment] = DEPLOYMENTS) -> str:
    """The text of ``prefect.yaml`` for ``deployments``."""
    lines = [_HEADER.format(version=PREFECT_VERSION, workdir=IMAGE_WORKDIR).rstrip("\n")]
    for index, deployment in enumerate(deployments):
        if index:
            lines.append("")
        if deployment.note:
            lines += _comment(deployment.note, "  ")
        lines += _deployment_yaml(deployment)
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write ``prefect.yaml`` from :data:`DEPLOYMENTS`, or with ``--check`` exit 1 when it
    differs from them."""
    parser = argparse.ArgumentParser(prog="python -m flows.deployments", description=main.__doc__)
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    parser.add_argument("--path", type=Path, default=PREFECT_YAML)
    args = parser.parse_args(argv)
    text = render_prefect_yaml()
    current = args.path.read_text(encoding="utf-8") if args.path.exists() else None
    if args.check:
        if current != text:
            print(f"{args.path} differs from flows/deployments.py: run python -m flows.deployments")
            return 1
        print(f"{args.path} is current")
        return 0
    if current != text:
        args.path.write_text(text, encoding="utf-8")
        print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
