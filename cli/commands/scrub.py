"""``flywheel scrub``: replace PII in chosen fields of a JSONL file, streaming in batches."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer
from pydantic import ValidationError

from cli.commands.common import clients
from feedback.jsonl import MalformedLine, dumps_line, iter_jsonl
from flywheel.errors import InputFileError
from flywheel.settings import load_settings


@contextmanager
def _progress_bar(total: int) -> Iterator[Any]:
    """A byte-count progress bar on stderr when it is a terminal; a no-op otherwise."""
    if not sys.stderr.isatty():
        yield lambda advance: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("scrubbing", markup=False),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True, markup=False),
        transient=True,
    ) as progress:
        task = progress.add_task("scrub", total=total)
        yield lambda advance: progress.advance(task, advance)


def scrub(
    in_path: Annotated[
        Path,
        typer.Option(
            "--in", help="JSONL file to read.", exists=True, dir_okay=False, readable=True
        ),
    ],
    out_path: Annotated[Path, typer.Option("--out", help="JSONL file to write.", dir_okay=False)],
    field: Annotated[
        list[str],
        typer.Option("--field", help="Field to scrub (text or chat messages); repeatable."),
    ],
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=10_000, help="Records scrubbed together.")
    ] = 128,
    language: Annotated[
        list[str] | None,
        typer.Option(
            "--language", help="Language to recognise (en, zh); repeatable. Default: both."
        ),
    ] = None,
) -> None:
    """Scrub PII from FIELDs of every record of a JSONL file and add a ``pii`` summary.

    Malformed lines are reported on stderr with their line number and skipped;
    all good records are still written, and the exit code is then 1.
    """
    scrubber, size = _scrubber(batch_size, language)
    partial = out_path.with_name(out_path.name + ".partial")
    try:
        with partial.open("wb") as out, _progress_bar(in_path.stat().st_size) as advance:
            written, malformed = _scrub_lines(in_path, out, field, scrubber, size, advance)
        partial.replace(out_path)
    except InputFileError:
        partial.unlink(missing_ok=True)
        raise
    except OSError as exc:
        partial.unlink(missing_ok=True)
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None

    if malformed:
        typer.echo(
            f"{malformed} malformed line(s) skipped; {written} record(s) written to {out_path}",
            err=True,
        )
        raise typer.Exit(1)


def _scrubber(batch_size: int, language: list[str] | None) -> tuple[Any, int]:
    """The PII scrubber for these options, and its batch size; exit 2 on bad options, 1 when
    the PII models cannot load."""
    from feedback.pii import ScrubberSettings

    try:
        scrubbing = ScrubberSettings(
            batch_size=batch_size,
            languages=tuple(language or ("en", "zh")),  # type: ignore[arg-type]
        )
    except ValidationError as exc:
        message = "; ".join(error["msg"] for error in exc.errors())
        typer.echo(f"error: invalid settings: {message}", err=True)
        raise typer.Exit(2) from None
    settings = load_settings().model_copy(update={"scrubber": scrubbing})
    try:
        return clients(settings).scrubber, scrubbing.batch_size
    except OSError as exc:
        typer.echo(f"error: cannot load the PII models: {exc}", err=True)
        raise typer.Exit(1) from None


def _scrub_lines(
    in_path: Path,
    out: BinaryIO,
    fields: list[str],
    scrubber: Any,
    batch_size: int,
    advance: Callable[[int], None],
) -> tuple[int, int]:
    """Every good record of ``in_path`` scrubbed into ``out`` in batches; each malformed line
    reported on stderr. Returns (records written, malformed lines)."""
    from feedback.pii import scrub_records

    source = str(in_path)
    malformed = written = 0
    batch: list[dict[str, Any]] = []

    def flush() -> None:
        nonlocal written
        for record in scrub_records(batch, fields, scrubber):
            out.write(dumps_line(record))
        written += len(batch)
        batch.clear()

    for item in iter_jsonl(in_path):
        advance(len(item.raw))
        if isinstance(item, MalformedLine):
            malformed += 1
            typer.echo(item.describe(source), err=True)
            continue
        batch.append(item.data)
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    return written, malformed
