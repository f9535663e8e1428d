"""Refusals the feedback page answers with a status and a message (never a stack trace)."""

from __future__ import annotations

from flywheel.errors import FlywheelError


class PageError(FlywheelError):
    """A request the page cannot serve: the HTTP status and a message the caller can act on."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
