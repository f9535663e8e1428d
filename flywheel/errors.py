"""Errors a user can act on; the CLI turns them into a message and an exit code."""

from __future__ import annotations


class FlywheelError(Exception):
    """A failure with a message meant for the user, and the exit code that reports it."""

    exit_code = 1

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(FlywheelError):
    """Bad arguments or a missing input file."""

    exit_code = 2


class StoreUnavailableError(FlywheelError):
    """The feedback store cannot be reached."""

    exit_code = 3


class InputFileError(UsageError):
    """A user's file that cannot be read: missing, corrupt, not UTF-8, too large, invalid."""


class InvalidSettingsError(UsageError):
    """A setting (an environment variable, ``.env``) that is not valid, named in the message."""
