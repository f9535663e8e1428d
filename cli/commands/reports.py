"""What the commands print about the feedback store, and the cleaning step they share:
an import's report, the counts by line and signal, a line's cleaning funnel, the datasets
built from the store, and how to open the feedback page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table
from rich.text import Text

from cli.commands.common import SHORT_NAMES, clients, err, out
from flywheel.errors import UsageError
from flywheel.settings import Settings

if TYPE_CHECKING:
    from feedback.store import FeedbackStore, IngestReport


def print_ingest_report(report: IngestReport) -> None:
    """One line of what an import added and skipped; each quarantined record on stderr."""
    out.print(
        Text.assemble(
            (report.source, "bold"),
            f": read {report.read}, added {report.interactions_added} "
            f"interactions and {report.feedback_added} feedback events, "
            f"{report.duplicates} duplicates skipped, {report.quarantined} quarantined",
        )
    )
    for message in report.rejections:
        err.print(Text.assemble(("quarantined", "yellow"), f" {message}"))
    if report.quarantined > len(report.rejections):
        err.print(
            f"... and {report.quarantined - len(report.rejections)} more (flywheel quarantine)"
        )


def finish_ingest(report: IngestReport) -> None:
    """The import's report, and exit 1 when any record went to quarantine."""
    print_ingest_report(report)
    if report.quarantined:
        raise typer.Exit(1)


def require_file(path: Path) -> None:
    """A usage error naming ``path`` unless it is a file."""
    if not path.is_file():
        raise UsageError(f"no such file: {path}")


def parse_start(start: str | None) -> datetime:
    """``--start`` as an aware time (UTC when it names no zone); yesterday at midnight when
    not given."""
    if start is None:
        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        return today - timedelta(days=1)
    try:
        value = datetime.fromisoformat(start.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--start {start!r} is not an ISO-8601 time") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def print_buckets(counts: dict[str, Any]) -> None:
    """The store's counts (``FeedbackStore.stats``) as a table of signals by line."""
    signals = list(counts["events"])
    table = Table(title="feedback by business line")
    table.add_column("line", no_wrap=True)
    # Numbers fold onto a second line when the table is too wide; never cut to "10…".
    table.add_column("requests", justify="right", overflow="fold")
    for signal in signals:
        table.add_column(SHORT_NAMES.get(signal, signal), justify="right", overflow="fold")
    for name, entry in counts["business_lines"].items():
        row = [name, str(entry["interactions"])]
        row += [str(entry["events"].get(s, 0)) for s in signals]
        table.add_row(*row)
    total: list[str | Text] = [Text("all", style="bold"), str(counts["interactions"])]
    total += [str(counts["events"][s]) for s in signals]
    table.add_row(*total)
    out.print(table)
    if counts.get("quarantined"):
        out.print(f"{counts['quarantined']} records in quarantine (flywheel quarantine)")


def cleaning_with(settings: Settings, eval_fraction: float, max_user_share: float) -> Any:
    """The configured cleaning settings with the command's dataset options on top (validated)."""
    values = settings.cleaning.model_dump()
    values["datasets"] |= {"eval_fraction": eval_fraction, "max_user_share": max_user_share}
    return type(settings.cleaning).model_validate(values)


def print_funnel(line: str, funnel: dict[str, Any]) -> None:
    """A line's cleaning funnel: records by signal after each step, what was dropped."""
    steps = funnel["steps"]
    signals = sorted({s for counts in steps.values() for s in counts})
    table = Table(title=f"{line}: records by signal after each cleaning step")
    table.add_column("step", no_wrap=True)
    for signal in signals:
        table.add_column(SHORT_NAMES.get(signal, signal), justify="right", overflow="fold")
    table.add_column("total", justify="right", overflow="fold")
    for step, counts in steps.items():
        table.add_row(step, *[str(counts.get(s, 0)) for s in signals], str(sum(counts.values())))
    out.print(table)
    dropped = ", ".join(f"{k} {v}" for k, v in funnel["dropped"].items()) or "none"
    found = ", ".join(f"{k} {v}" for k, v in funnel["pii"].items()) or "none"
    examples = ", ".join(f"{k} {v}" for k, v in funnel["examples"].items())
    out.print(f"  dropped: {dropped}\n  PII replaced: {found}\n  examples: {examples}")


def print_feedback_page_hint(settings: Settings) -> None:
    """How to open the feedback page on this home, commands whole (a wrapped one breaks)."""
    from dashboard.access import login_commands

    make_key, serve_page = login_commands(settings.home)
    page = f"http://{settings.dashboard.host}:{settings.dashboard.port}"
    out.print(f"  feedback page: {serve_page}, then {page}", soft_wrap=True)
    out.print(f"    logging in with the key this prints: {make_key}", soft_wrap=True)


def build_datasets(
    settings: Settings,
    store: FeedbackStore,
    lines: list[str],
    *,
    eval_fraction: float = 0.1,
    max_user_share: float = 0.1,
    since: datetime | None = None,
) -> list[Any]:
    from feedback.cleaning import clean_line, scrub_with
    from flywheel.progress import progress_bar

    cleaning = cleaning_with(settings, eval_fraction, max_user_share)
    scrub = scrub_with(clients(settings).scrubber)
    results = []
    for name in lines:
        with progress_bar(f"cleaning {name}") as advance:
            results.append(
                clean_line(
                    store.engine,
                    name,
                    scrub=scrub,
                    settings=cleaning,
                    dataset_root=settings.datasets_dir,
                    since=since,
                    on_progress=advance,
                )
            )
    return results
