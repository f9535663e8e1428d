"""``flywheel buckets``: the feedback page's numbers in the terminal.

Per business line, the same per-adapter totals the page's overview shows for the
same filters (read through :meth:`dashboard.pages.FeedbackPages.totals`, the
hourly rollup), and the latest dataset's cleaning funnel as the funnel page
shows it.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import orjson
import typer
from rich.table import Table

from cli.commands.common import SHORT_NAMES, clients, out
from flywheel.errors import UsageError
from flywheel.settings import load_settings


def buckets(
    line: Annotated[
        list[str] | None, typer.Option("--line", help="Business line (repeatable; default: all).")
    ] = None,
    since: Annotated[str | None, typer.Option(help="From this ISO date or time (UTC).")] = None,
    until: Annotated[
        str | None, typer.Option(help="Until this ISO date (inclusive) or time (exclusive).")
    ] = None,
    adapter: Annotated[str | None, typer.Option(help="Only this adapter version.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Signal counts and rates per adapter version, and each line's latest cleaning funnel:
    the numbers of the feedback page (`flywheel serve dashboard`) for the same filters."""
    from dashboard.app import build_pages
    from dashboard.errors import PageError

    settings = load_settings()
    try:
        from dashboard.filters import parse_filter

        bucket = parse_filter(since, until, None, adapter)
    except PageError as exc:
        raise UsageError(exc.message) from None
    command = clients(settings)
    pages = build_pages(
        settings,
        settings.dashboard,
        command.store.engine,
        routes=command.routes,
        scrubber_factory=lambda: command.scrubber,
        mlflow_client_factory=lambda: command.registry.client,
    )
    known = sorted(set(settings.business_lines) | set(pages.rollup.lines()))
    unknown = sorted(set(line or ()) - set(known))
    if unknown:
        raise UsageError(f"unknown business line(s): {', '.join(unknown)}")
    report = [_line_entry(pages, name, bucket) for name in line or known]
    if as_json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    for entry in report:
        _print_line(entry)


def _line_entry(pages: Any, name: str, bucket: Any) -> dict[str, Any]:
    """One line's signal totals over the filters and its latest cleaning funnel."""
    from dashboard.lineage import drop_reasons, funnel_steps

    start, end, totals = pages.totals(name, bucket)
    builds = pages.funnel(name)
    return {
        "business_line": name,
        "since": start.isoformat(),
        "until": end.isoformat(),
        "totals": [t.as_dict() for t in totals],
        "funnel": None
        if not builds
        else {
            "dataset": builds[0].name,
            "accumulated_from": list(builds[0].accumulated_from),
            "funnel_of": builds[0].funnel_of,
            "steps": funnel_steps(builds[0].funnel),
            "dropped": drop_reasons(builds[0].funnel),
        },
    }


def _percent(share: float | None) -> str:
    if share is None:
        return ""
    return f" {share:.0%}" if share >= 0.1 or share == 0 else f" {share:.1%}"


def _print_line(entry: dict[str, Any]) -> None:
    from dashboard.shaping import RATE_SIGNALS

    table = Table(
        title=f"{entry['business_line']}: {entry['since'][:16]} → {entry['until'][:16]} UTC",
        title_justify="left",
        caption="count and share of requests; the feedback page shows the same",
        padding=(0, 1),
    )
    table.add_column("adapter", no_wrap=True)
    # Numbers fold onto a second line when the table is too wide; never cut to "10…".
    table.add_column("req", justify="right", overflow="fold")
    for signal in RATE_SIGNALS:
        table.add_column(SHORT_NAMES.get(signal, signal), justify="right", overflow="fold")
    for row in entry["totals"]:
        cells = [row["adapter"], f"{row['requests']:,}"]
        for signal in RATE_SIGNALS:
            share = row["rates"][signal]
            cells.append(f"{row['counts'][signal]:,}{_percent(share)}")
        table.add_row(*cells)
    if not entry["totals"]:
        table.add_row("(no requests)", "0", *["0"] * len(RATE_SIGNALS))
    out.print(table)
    funnel = entry["funnel"]
    if funnel is None:
        out.print("  no dataset built yet\n")
        return
    steps = " → ".join(f"{name} {count:,}" for name, count in funnel["steps"])
    dropped = ", ".join(f"{why} {count:,}" for why, count in funnel["dropped"]) or "none"
    source = funnel["dataset"]
    if funnel["accumulated_from"]:
        count = len(funnel["accumulated_from"])
        source += f", accumulated from {count} build{'s' if count != 1 else ''}"
        source += f": funnel of {funnel['funnel_of']}" if funnel["funnel_of"] else ""
    out.print(f"  funnel ({source}): {steps}\n  dropped: {dropped}\n")
