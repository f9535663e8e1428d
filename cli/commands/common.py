"""Helpers every command shares: the store opened with a clear error, the consoles."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

from flywheel.errors import StoreUnavailableError
from flywheel.settings import Settings

if TYPE_CHECKING:
    from feedback.store import FeedbackStore

out = Console(soft_wrap=True)
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
err = Console(stderr=True, soft_wrap=True)


def open_store(settings: Settings) -> FeedbackStore:
    """The configured store, migrated; an unreachable one is a clear error (exit 3)."""
    from sqlalchemy.exc import OperationalError

    from feedback.store import FeedbackStore

    try:
        return FeedbackStore.open(settings)
    except OperationalError as exc:
        raise StoreUnavailableError(store_error(settings, exc)) from None


def store_error(settings: Settings, exc: Exception) -> str:
    """The reason a store failed, with its URL (password hidden)."""
    reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
    return f"cannot reach the feedback store at {safe_url(settings)}: {reason}"


def safe_url(settings: Settings) -> str:
    """The store URL with the password hidden."""
    from sqlalchemy.engine import make_url

    return make_url(settings.resolved_database_url).render_as_string(hide_password=True)
