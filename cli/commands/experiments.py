"""``flywheel experiment``: A/B experiments between two adapters of a line, judged on a
business metric with the canary's anytime-valid test (``composition.experiments``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.table import Table

from cli.commands.common import clients, out
from cli.commands.serving import _actor, _check_line
from flywheel.errors import UsageError
from flywheel.settings import load_settings
from registry.experiments import METRIC_NAMES, ArmLabel

if TYPE_CHECKING:
    from composition.experiments import ExperimentStatus

experiment_app = typer.Typer(
    help="A/B experiments: a sticky share of a line's users on arm B, the rest on arm A, "
    "judged on a business metric.",
    no_args_is_help=True,
)
METRIC_HELP = "The business metric that decides: " + ", ".join(METRIC_NAMES) + "."


@experiment_app.command("start")
def experiment_start(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    arm_a: Annotated[str, typer.Argument(help="Arm A: <line>-v<N>, v<N>, 'champion' or 'base'.")],
    arm_b: Annotated[str, typer.Argument(help="Arm B: <line>-v<N>, v<N>, 'champion' or 'base'.")],
    metric: Annotated[str, typer.Option(help=METRIC_HELP)],
    share: Annotated[float, typer.Option(help="Share of the line's users on B (sticky).")] = 0.5,
    alpha: Annotated[
        float | None, typer.Option(help="Error bound over all looks (default: the recipe's).")
    ] = None,
    min_samples: Annotated[
        int | None,
        typer.Option(help="Samples per arm before deciding (default: the recipe's canary's)."),
    ] = None,
    effect_scale: Annotated[
        float | None,
        typer.Option(help="Effect (absolute rate difference) the test is quickest to find."),
    ] = None,
    reason: Annotated[str | None, typer.Option(help="Why, for the routing history.")] = None,
) -> None:
    """Start an A/B experiment: the arms are loaded and probed on vLLM, then ``--share`` of
    the line's users go to B and the rest to A (refused while a canary, a shadow or another
    experiment is live on the line)."""
    from composition.experiments import start_experiment

    settings = load_settings()
    _check_line(settings, business_line)
    if metric not in METRIC_NAMES:
        raise UsageError(f"unknown --metric {metric!r}; the metrics are {', '.join(METRIC_NAMES)}")
    record = start_experiment(
        settings,
        clients(settings),
        business_line,
        arm_a,
        arm_b,
        settings.gateway.upstreams,
        share=share,
        metric=metric,
        alpha=alpha,
        min_samples=min_samples,
        mixture_scale=effect_scale,
        actor=_actor(),
        reason=reason,
    )
    out.print(
        f"{business_line}: experiment {record.id} on {record.metric}: "
        f"A {record.arm_a or 'base'} on {1 - record.share:.0%}, "
        f"B {record.arm_b or 'base'} on {record.share:.0%} of users "
        f"(alpha {record.policy.alpha:g}, {record.policy.min_samples} per arm before deciding)"
    )


@experiment_app.command("status")
def experiment_status(
    business_line: Annotated[
        str | None, typer.Argument(help="The business line (default: every line).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Each line's live experiment looked at now (the look is recorded), and the latest
    ended ones with their decisions."""
    from composition.experiments import ExperimentStatus, look_experiment
    from registry.experiment_store import current_look, list_experiments, live_experiment

    settings = load_settings()
    if business_line is not None:
        _check_line(settings, business_line)
    lines = [business_line] if business_line else list(settings.business_lines)
    command = clients(settings)
    store = command.store
    shown: list[ExperimentStatus] = []
    for line in lines:
        if live_experiment(store.engine, line) is not None:
            shown.append(look_experiment(settings, command, line, actor=_actor()))
        for record in list_experiments(store.engine, line, limit=10):
            if record.status != "running":
                look = current_look(store.engine, record, record.ended_at or record.started_at)
                shown.append(ExperimentStatus(record, look))
    if as_json:
        out.print_json(orjson.dumps([s.as_dict() for s in shown]).decode())
        return
    if not shown:
        out.print("no experiments (flywheel experiment start LINE A B --metric M)")
        return
    _print_statuses(shown)


def _print_statuses(shown: list[ExperimentStatus]) -> None:
    table = Table(
        "id", "line", "status", "metric", "A", "B", "samples A/B", "rate A", "rate B",
        "effect B-A [interval]", "p", "decision",
    )  # fmt: skip
    for status in shown:
        record, look = status.record, status.look
        decision = (
            f"{record.winner.upper()} better (look {record.decided_look})"
            if record.winner
            else (look.verdict.value if look else "-")
        )
        table.add_row(
            str(record.id),
            record.business_line,
            record.status,
            record.metric,
            record.arm_a or "base",
            record.arm_b or "base",
            f"{look.a.samples}/{look.b.samples}" if look else "-",
            _rate(look.a.rate) if look else "-",
            _rate(look.b.rate) if look else "-",
            (
                f"{look.effect:+.3f} [{look.lower:+.3f}, {look.upper:+.3f}]"
                if look and look.effect is not None
                else "-"
            ),
            f"{look.p_value:.2g}" if look else "-",
            decision,
        )
    out.print(table)


def _rate(value: float | None) -> str:
    return f"{value:.1%}" if value is not None else "-"


@experiment_app.command("stop")
def experiment_stop(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    reason: Annotated[str | None, typer.Option(help="Why, for the routing history.")] = None,
) -> None:
    """End the line's experiment without promoting: every user back on the champion."""
    from composition.experiments import stop_experiment

    settings = load_settings()
    _check_line(settings, business_line)
    status = stop_experiment(
        settings,
        clients(settings),
        business_line,
        settings.gateway.upstreams,
        reason=reason,
        actor=_actor(),
    )
    out.print(f"{business_line}: experiment {status.record.id} stopped; users on the champion")


@experiment_app.command("promote")
def experiment_promote(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    force: Annotated[
        bool, typer.Option(help="Promote though the test has not decided (needs --reason).")
    ] = False,
    arm: Annotated[
        str | None, typer.Option(help="A or B: the arm to promote (default: the test's winner).")
    ] = None,
    reason: Annotated[str | None, typer.Option(help="Why (recorded; needed with --force).")] = (
        None
    ),
) -> None:
    """Make the experiment's winner the line's champion (routing and MLflow alias together)
    and end the experiment; refused while the test has not decided, unless --force."""
    from composition.experiments import promote_experiment

    chosen: ArmLabel | None = None
    if arm is not None:
        if arm.strip().lower() not in ("a", "b"):
            raise UsageError(f"--arm must be A or B, got {arm!r}")
        chosen = "a" if arm.strip().lower() == "a" else "b"
    settings = load_settings()
    _check_line(settings, business_line)
    status, transition = promote_experiment(
        settings,
        clients(settings),
        business_line,
        settings.gateway.upstreams,
        arm=chosen,
        force=force,
        reason=reason,
        actor=_actor(),
    )
    out.print(
        f"{business_line}: experiment {status.record.id} promoted; champion "
        f"{transition.table.champion or 'base model'} ({status.record.ended_reason})"
    )
