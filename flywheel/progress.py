"""Progress bars for long work: shown on a terminal, silent in pipes and CI logs."""

from __future__ import annotations

import logging
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


# What training.train.log_training_step puts on each record: step, steps in all, latest loss,
# whether training ended.
TrainingStep = Callable[[int, int, float | None, bool], None]


class _TrainingSteps(logging.Handler):
    """Hands each training step record of ``training.train`` to a callback."""

    def __init__(self, on_step: TrainingStep) -> None:
        super().__init__(logging.INFO)
        self.on_step = on_step

    def emit(self, record: logging.LogRecord) -> None:
        step = getattr(record, "training_step", None)
        total = getattr(record, "training_total", None)
        if isinstance(step, int) and isinstance(total, int):
            loss = getattr(record, "training_loss", None)
            self.on_step(step, total, loss, bool(getattr(record, "training_done", False)))


@contextmanager
def training_steps(on_step: TrainingStep) -> Iterator[None]:
    """Call ``on_step(step, total, loss, done)`` for each step a training in this process
    logs (:func:`training.train.log_training_step`: step 0 as it begins, loss None where
    the record has none, done True once as it ends) while the block runs."""
    logger = logging.getLogger("training.train")
    handler = _TrainingSteps(on_step)
    level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
