"""Helpers every command shares: the command's clients, the consoles."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import typer
from rich.console import Console, ConsoleDimensions

from flywheel.settings import Settings

if TYPE_CHECKING:
    from composition.clients import Clients
    from feedback.store import FeedbackStore

# Off a terminal (a pipe, a CI log) rich lays tables out in 80 columns and cuts what does
# not fit ("10…" for a total); there nothing needs the lines short.
PIPE_WIDTH = 200


class ReadableConsole(Console):
    """A console as wide as its terminal; off a terminal as wide as ``COLUMNS`` says, else
    :data:`PIPE_WIDTH`, so tables in logs keep every number whole."""

    @property
    def size(self) -> ConsoleDimensions:
        """The terminal's size, or :data:`PIPE_WIDTH` wide when printing to a pipe or file."""
        size = Console.size.fget(self)  # type: ignore[attr-defined]
        chosen = self._width is not None or self._environ.get("COLUMNS", "").isdigit()
        if chosen or self.is_terminal:
            return size  # type: ignore[no-any-return]
        return ConsoleDimensions(PIPE_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


# Without markup: what is printed holds users' text (records, reasons quoting them, file
# names, messages); a style is given as a rich.text.Text.
out = ReadableConsole(soft_wrap=True, markup=False)
# Column headers of signals in terminal tables.
SHORT_NAMES = {
    "errors": "err",
    "thumbs_up": "up",
    "thumbs_down": "down",
    "regenerate": "regen",
    "abandon": "aband",
    "task_success": "solved",
    "task_failure": "failed",
    "task_outcome": "outcome",
}
err = ReadableConsole(stderr=True, soft_wrap=True, markup=False)


def clients(settings: Settings) -> Clients:
    """The running command's clients (:func:`composition.clients.open_clients`): built from
    ``settings`` on first use and closed when the command ends; the set a test put in use
    instead. An unreachable store is a clear error (exit 3) when first used."""
    scope = _SCOPE.get()
    if scope is None:
        raise RuntimeError(
            "no command is running: register cli.commands.common.with_clients as the "
            "Typer app's callback"
        )
    return scope.clients(settings)


class _CommandScope:
    """The clients of one command, opened on first use, closed with the scope."""

    def __init__(self) -> None:
        self.stack = ExitStack()
        self.opened: Clients | None = None

    def clients(self, settings: Settings) -> Clients:
        from composition.clients import open_clients

        if self.opened is None:
            self.opened = self.stack.enter_context(open_clients(settings))
        return self.opened


_SCOPE: ContextVar[_CommandScope | None] = ContextVar("flywheel_command", default=None)


@contextmanager
def command_scope() -> Iterator[None]:
    """A command's run: the clients :func:`clients` opens in it close when it ends."""
    scope = _CommandScope()
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)
        scope.stack.close()


def with_clients(ctx: typer.Context) -> None:
    """The Typer app callback that gives each command its clients, closed when it ends."""
    ctx.with_resource(command_scope())


def open_store(settings: Settings) -> FeedbackStore:
    """The command's store, migrated (:func:`clients`)."""
    return clients(settings).store


def safe_url(settings: Settings) -> str:
    """The store URL with the password hidden."""
    from composition.clients import shown_store_url

    return shown_store_url(settings)
