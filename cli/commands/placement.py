"""``flywheel placement``: which vLLM replicas hold each business line's adapters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.table import Table
from rich.text import Text

from cli.commands.common import clients, out
from cli.commands.serving import _actor, _check_line
from flywheel.errors import UsageError
from flywheel.settings import load_settings

if TYPE_CHECKING:
    from registry.line_placement import LinePlacement

placement_app = typer.Typer(
    help="Place each line's adapters on some vLLM replicas (hot lines spread, cold packed).",
    no_args_is_help=True,
)


def _shown(placement: tuple[str, ...] | None) -> str:
    return "every replica" if placement is None else ", ".join(placement)


@placement_app.command("plan")
def placement_plan(
    hours: Annotated[
        float, typer.Option(min=0.1, max=24 * 90, help="Traffic window, in hours back from now.")
    ] = 24.0,
    hot_share: Annotated[
        float,
        typer.Option(
            min=0.01,
            max=1.0,
            help="A line with at least this share of requests is on every replica.",
        ),
    ] = 0.25,
    cold_replicas: Annotated[
        int, typer.Option(min=1, max=64, help="Replicas each other line is packed onto.")
    ] = 1,
    apply: Annotated[
        bool, typer.Option("--apply", help="Move the lines whose placement changes.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Each line's share of the requests over the last ``--hours`` and the replicas the plan
    places it on; ``--apply`` loads its adapters where it arrives, writes the placement, then
    unloads them (drained) where it leaves."""
    from registry.line_placement import move_line, plan_lines

    settings = load_settings()
    upstreams = settings.gateway.upstreams
    command = clients(settings)
    plans = plan_lines(
        settings, command, upstreams, hours=hours, hot_share=hot_share, cold_replicas=cold_replicas
    )
    _print_plans(plans, as_json=as_json)
    if not apply:
        return
    failed = False
    reason = f"placement plan over {hours:g} h (hot share {hot_share:g}, {cold_replicas} cold)"
    for p in plans:
        if p.changes:
            move = move_line(
                settings,
                command,
                p.business_line,
                p.planned,
                upstreams,
                actor=_actor(),
                reason=reason,
            )
            _print_move(move.business_line, move.placement, move.loaded_on, move.unloaded_from)
            for failure in move.failed:
                out.print(Text.assemble(("left to the reconciler", "yellow"), f": {failure}"))
            failed |= bool(move.failed)
    if failed:
        raise typer.Exit(1)


def _print_plans(plans: list[LinePlacement], *, as_json: bool) -> None:
    """Each line's traffic, where it is placed now and where the plan puts it."""
    if as_json:
        rows = [
            {
                "business_line": p.business_line,
                "requests": p.requests,
                "share": p.share,
                "current": p.current,
                "planned": p.planned,
            }
            for p in plans
        ]
        out.print_json(orjson.dumps(rows).decode())
        return
    shown = Table("business line", "requests", "share", "placed now", "planned")
    for p in plans:
        planned = _shown(p.planned) if p.changes else "(unchanged)"
        shown.add_row(
            p.business_line, str(p.requests), f"{p.share:.1%}", _shown(p.current), planned
        )
    out.print(shown)


def _print_move(
    line: str, placement: tuple[str, ...] | None, loaded: list[str], unloaded: list[str]
) -> None:
    out.print(
        f"{line}: placed on {_shown(placement)}"
        + (f"; loaded on {', '.join(loaded)}" if loaded else "")
        + (f"; unloaded from {', '.join(unloaded)}" if unloaded else "")
    )


def _place(business_line: str, placement: tuple[str, ...] | None, reason: str) -> None:
    from registry.line_placement import move_line
    from registry.placement import replica_url

    settings = load_settings()
    _check_line(settings, business_line)
    upstreams = settings.gateway.upstreams
    known = {replica_url(url) for url in upstreams}
    if placement is not None:
        placement = tuple(dict.fromkeys(replica_url(url) for url in placement))
        unknown = [url for url in placement if url not in known]
        if unknown:
            raise UsageError(
                f"not a configured replica: {', '.join(unknown)} "
                f"(FLYWHEEL_GATEWAY_UPSTREAMS: {', '.join(upstreams)})"
            )
    move = move_line(
        settings,
        clients(settings),
        business_line,
        placement,
        upstreams,
        actor=_actor(),
        reason=reason,
    )
    _print_move(business_line, placement, move.loaded_on, move.unloaded_from)
    for failure in move.failed:
        out.print(Text.assemble(("left to the reconciler", "yellow"), f": {failure}"))
    if move.failed:
        raise typer.Exit(1)


@placement_app.command("set")
def placement_set(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    replicas: Annotated[list[str], typer.Argument(help="Root URLs of the replicas to hold it.")],
    reason: Annotated[str, typer.Option(help="Why, for the routing history.")] = "set by hand",
) -> None:
    """Place the line on these replicas by hand (loaded there first, unloaded elsewhere)."""
    _place(business_line, tuple(replicas), reason)


@placement_app.command("clear")
def placement_clear(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    reason: Annotated[str, typer.Option(help="Why, for the routing history.")] = "cleared by hand",
) -> None:
    """Put the line back on every replica (its adapters loaded on each)."""
    _place(business_line, None, reason)
