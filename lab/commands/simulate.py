"""``flywheel simulate``: a day of stored traffic with feedback, or simulated users sent
through the gateway, reacting to the answers they get."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from cli.commands.common import clients, err, open_store, out
from cli.commands.reports import finish_ingest, parse_start
from flywheel.errors import UsageError
from flywheel.settings import load_settings
from lab.commands.loop import DEFAULT_USERS, FEEDBACK_HELP


def simulate(
    requests: Annotated[int, typer.Option(min=1, help="Number of interactions.")] = 1_000,
    seed: Annotated[int, typer.Option(help="Same seed, same traffic.")] = 0,
    start: Annotated[
        str | None,
        typer.Option(help="ISO time of the first request (default: yesterday 00:00 UTC)."),
    ] = None,
    hours: Annotated[float, typer.Option(min=0.001, help="Time span of the traffic.")] = 24.0,
    lines: Annotated[
        str | None, typer.Option(help="Comma-separated business lines (default: settings).")
    ] = None,
    chinese_share: Annotated[float, typer.Option(min=0, max=1)] = 0.35,
    pii_share: Annotated[float, typer.Option(min=0, max=1)] = 0.2,
    flood_share: Annotated[float, typer.Option(min=0, max=1)] = 0.1,
    rate: Annotated[
        list[str] | None,
        typer.Option(help="Signal rate, e.g. --rate thumbs_down=0.2 (repeatable)."),
    ] = None,
    out_path: Annotated[
        Path | None, typer.Option("--out", help="Write JSONL here instead of the store.")
    ] = None,
    gateway: Annotated[
        str | None,
        typer.Option(help="Send the traffic through this gateway URL (real answers) instead."),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="FLYWHEEL_API_KEY", help="The gateway key (all simulated lines)."),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, max=256, help="Gateway users at once.")] = 4,
    users: Annotated[
        str,
        typer.Option(
            help="With --gateway: the user model (path/to/file.py:NAME or package.module:NAME) "
            "that reacts to each real answer."
        ),
    ] = DEFAULT_USERS,
    feedback: Annotated[str | None, typer.Option(help="With --gateway: " + FEEDBACK_HELP)] = None,
) -> None:
    """Generate realistic traffic with feedback and store it, write it as JSONL, or send
    simulated users through the gateway to vLLM, reacting to the answers they get (the
    gateway logs everything and infers regenerates)."""
    from pydantic import ValidationError

    from feedback.jsonl import dumps_line
    from flywheel.progress import progress_bar
    from lab.simulation.stored_traffic import SignalRates, SimulationSettings, TrafficSimulator

    settings = load_settings()
    try:
        rates = SignalRates(**_parse_rates(rate or []))
        simulation = SimulationSettings(
            requests=requests,
            seed=seed,
            start=parse_start(start),
            span=timedelta(hours=hours),
            business_lines=tuple(lines.split(",")) if lines else settings.business_lines,
            chinese_share=chinese_share,
            pii_share=pii_share,
            flood_share=flood_share,
            rates=rates,
        )
        if feedback is not None and gateway is None:
            raise UsageError("--feedback sets how the users of --gateway react; give --gateway too")
        if gateway is not None:
            # Each answer's arm as the gateway routes it (no answer says): the store's tables.
            def routes(line: str) -> Any:
                return clients(settings).routes.table(line)

            _drive_gateway(gateway, api_key, users, simulation, concurrency, feedback, routes)
            return
        events = TrafficSimulator(simulation).events()
        if out_path is not None:
            count = 0
            with out_path.open("wb") as sink, progress_bar("simulating") as advance:
                for event in events:
                    sink.write(dumps_line(event))
                    count += 1
                    advance(1)
            out.print(f"wrote {count} events to {out_path}")
            return
        store = open_store(settings)
        with progress_bar("simulating") as advance:
            report = store.ingest(events, source=f"simulate:seed={seed}", on_progress=advance)
    except (ValidationError, ValueError) as exc:
        raise UsageError(f"invalid simulation settings: {exc}") from None
    finish_ingest(report)


def _drive_gateway(
    url: str,
    api_key: str | None,
    spec: str,
    simulation: Any,
    concurrency: int,
    feedback: str | None = None,
    routes: Any = None,
) -> None:
    from flywheel.progress import progress_bar
    from lab.simulation.protocol import load_users
    from lab.simulation.traffic import UserTraffic, user_requests

    if not api_key:
        raise UsageError("--gateway needs --api-key (or FLYWHEEL_API_KEY)")
    users = load_users(spec, feedback)
    lines = simulation.business_lines
    for line in lines:
        users.check(line)
    out.print(f"users {spec}: {users.describe_feedback()}")
    traffic = UserTraffic(url, api_key, users, concurrency=concurrency, routes=routes)
    failed = False
    for index, line in enumerate(lines):
        share = simulation.requests // len(lines) + (index < simulation.requests % len(lines))
        ids = [f"sim-{simulation.seed}-{line}-{k % simulation.user_count()}" for k in range(share)]
        requests = user_requests(users, line, ids, simulation.seed, f"sim-{simulation.seed}-{line}")
        with progress_bar(f"{line} through the gateway", total=len(requests)) as advance:
            report = traffic.run(line, requests, seed=simulation.seed, on_request=advance)
        summary = report.as_dict()
        out.print(
            f"{line}: {len(requests)} users, served by {summary['served_by']}, satisfied "
            f"{summary['satisfied']}, feedback posted {summary['feedback_posted']}"
        )
        if report.failures:
            err.print(Text.assemble(("failures", "yellow"), f": {dict(report.failures)}"))
            failed = True
    if failed:
        raise typer.Exit(1)


def _parse_rates(pairs: list[str]) -> dict[str, float]:
    rates: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--rate {pair!r}: expected SIGNAL=RATE, e.g. thumbs_down=0.2")
        try:
            rates[name.strip()] = float(value)
        except ValueError:
            raise UsageError(f"--rate {pair!r}: {value!r} is not a number") from None
    return rates
