"""Errors a user can act on; the CLI turns them into a message and an exit code.

Exit codes: 1 a failure of the work itself, 2 bad arguments, input files or settings, and
one code per service that does not answer, so a script can tell which one to look at:
3 the feedback store, 4 MLflow, 5 Prefect's API, 6 Redis, 7 a vLLM replica
(:class:`registry.vllm_admin.VllmUnavailableError`); 70 a bug (an internal error).
"""

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


class ServiceUnavailableError(FlywheelError):
    """A service flywheel needs did not answer; the message names its URL (password hidden)
    and the setting to change. Each service has its own subclass and exit code."""

    exit_code = 69  # EX_UNAVAILABLE, for a service without a code of its own


class StoreUnavailableError(ServiceUnavailableError):
    """The feedback store cannot be reached."""

    exit_code = 3


class MlflowUnavailableError(ServiceUnavailableError):
    """The MLflow tracking server cannot be reached."""

    exit_code = 4


class PrefectUnavailableError(ServiceUnavailableError):
    """Prefect's API server (``PREFECT_API_URL``) cannot be reached."""

    exit_code = 5


class RedisUnavailableError(ServiceUnavailableError):
    """The Redis server (``FLYWHEEL_REDIS_URL``) cannot be reached."""

    exit_code = 6


class InputFileError(UsageError):
    """A user's file that cannot be read: missing, corrupt, not UTF-8, too large, invalid."""


class InvalidSettingsError(UsageError):
    """A setting (an environment variable, ``.env``) that is not valid, named in the message."""
