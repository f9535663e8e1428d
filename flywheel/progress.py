"""Progress bars for long work: shown on a terminal, silent in pipes and CI logs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
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


def milestones(
    label: str,
    total: int,
    say: Callable[[str], None],
    *,
    parts: int = 4,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[int], None]:
    """Off a terminal, a long stage's progress as lines: ``say`` tells its start, then the
    count done of ``total`` and the minutes so far each time another of ``parts`` equal
    shares is done (a log shows a 15-minute stage moving, not one line and silence)."""
    started = clock()
    done = 0
    told = 0
    say(f"  {label} ({total})")

    def advance(n: int) -> None:
        nonlocal done, told
        done += n
        reached = min(parts, done * parts // total) if total > 0 else 0
        if reached > told:
            told = reached
            say(f"  {label}: {done}/{total} ({(clock() - started) / 60:.1f} min)")

    return advance


# What training.train.log_training_step puts on each record: step, steps in all, latest loss,
# whether training ended, and at its end the step whose adapter a loss guard kept (None if
# the last step's).
TrainingStep = Callable[[int, int, float | None, bool, int | None], None]


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
            done = bool(getattr(record, "training_done", False))
            self.on_step(step, total, loss, done, getattr(record, "training_kept_step", None))


@contextmanager
def training_steps(on_step: TrainingStep) -> Iterator[None]:
    """Call ``on_step(step, total, loss, done, kept)`` for each step a training in this
    process logs (:func:`training.train.log_training_step`: step 0 as it begins, loss None
    where the record has none, done True once as it ends, kept the step a loss guard cut
    back to, else None) while the block runs."""
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


def announce_training(say: Callable[[str], None]) -> TrainingStep:
    """Off a terminal, each training's progress as two lines: its start, and its end with
    the first and the last loss, and the step kept when a loss guard cut it back."""
    losses: list[float] = []

    def on_step(step: int, total: int, loss: float | None, done: bool, kept: int | None) -> None:
        if step == 0 and not done:
            losses.clear()
            say(f"  training ({total} steps)")
        if loss is not None:
            losses.append(loss)
        if done:
            shown = f", loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else ""
            if kept is not None:
                shown += f"; the adapter of step {kept} kept (a later one over the loss limit)"
            say(f"  trained {step} steps{shown}")

    return on_step


def training_bars(bars: Progress) -> TrainingStep:
    """On a terminal, each training as a bar of ``bars``: its steps done of all, its latest
    loss, and at its end the step kept when a loss guard cut it back."""
    trainings: list[TaskID] = []
    losses: list[float] = []

    def on_step(step: int, total: int, loss: float | None, done: bool, kept: int | None) -> None:
        if step == 0 or not trainings:
            trainings.append(bars.add_task("training", total=total))
            losses.clear()
        if loss is not None:
            losses.append(loss)
        shown = f"training: loss {losses[-1]:.3f}" if losses else "training"
        if done and kept is not None:
            shown += f", step {kept} kept"
        bars.update(trainings[-1], completed=step, total=step if done else total, description=shown)

    return on_step


@contextmanager
def training_progress(say: Callable[[str], None]) -> Iterator[None]:
    """Show the trainings this process runs in the block: a bar with steps and loss on a
    terminal (stderr), else :func:`announce_training`'s two lines through ``say``."""
    console = Console(stderr=True, markup=False)
    if not console.is_terminal:
        with training_steps(announce_training(say)):
            yield
        return
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn())
    with (
        Progress(*columns, TimeElapsedColumn(), console=console) as bars,
        training_steps(training_bars(bars)),
    ):
        yield
