"""Progress bars for long work: shown on a terminal, silent in pipes and CI logs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


@contextmanager
def progress_bar(description: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
    """Yield an ``advance(n)`` callback that drives a bar on stderr when it is a terminal."""
    # Descriptions name users' files and lines: plain text, never markup.
    console = Console(stderr=True, markup=False)
    if not console.is_terminal:
        yield lambda _n: None
        return
    description = TextColumn("{task.description}", markup=False)
    columns = [SpinnerColumn(), description, BarColumn(), MofNCompleteColumn()]
    columns += [TimeElapsedColumn(), TimeRemainingColumn()] if total else [TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)
