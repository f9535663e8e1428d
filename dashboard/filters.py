"""What a bucket view shows: time range, signal and adapter filters, and the page cursor.

Parsing is pure and strict: a bad value is a :class:`PageError` (400) that says
what was expected, so a hand-edited URL gets an answer rather than a stack trace.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from dashboard.errors import PageError
from feedback.events import Signal
from feedback.rollup import BASE_ADAPTER, FEEDBACK_SIGNALS

# Signals a sample can be filtered by; "none" means no feedback at all.
SAMPLE_SIGNALS: tuple[str, ...] = (*FEEDBACK_SIGNALS, Signal.NONE.value)
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,127}$")
_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True, slots=True)
class BucketFilter:
    """Filters of a bucket view; ``until`` is exclusive."""

    since: datetime | None = None
    until: datetime | None = None
    signal: str | None = None
    adapter: str | None = None

    def params(self) -> dict[str, str]:
        """The filter as query parameters (empty ones left out)."""
        values = {
            "since": _format_time(self.since),
            "until": _format_time(self.until, inclusive_day=True),
            "signal": self.signal,
            "adapter": self.adapter,
        }
        return {key: value for key, value in values.items() if value}

    def query(self, **extra: str | None) -> str:
        """``?since=...&signal=...`` with ``extra`` parameters added (``None`` drops one)."""
        values = self.params() | {k: v for k, v in extra.items() if v is not None}
        for key, value in extra.items():
            if value is None:
                values.pop(key, None)
        return "?" + urlencode(values) if values else ""

    def without(self, name: str) -> BucketFilter:
        """The same filter with one field cleared."""
        return replace(self, **{name: None})


def _format_time(value: datetime | None, *, inclusive_day: bool = False) -> str | None:
    """A time as a query parameter; an exclusive midnight ``until`` reads as the day before,
    which :func:`parse_time` turns back into the same midnight."""
    if value is None:
        return None
    value = value.astimezone(UTC)
    if value.hour == value.minute == value.second == value.microsecond == 0:
        return (value - timedelta(days=1) if inclusive_day else value).strftime("%Y-%m-%d")
    return value.strftime("%Y-%m-%dT%H:%M")


def parse_time(name: str, value: str | None, *, end_of_day: bool = False) -> datetime | None:
    """An ISO date or date-time (naive means UTC); a bare date as ``until`` means the end
    of that day, so "from 2024-05-01 until 2024-05-01" is that whole day."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise PageError(
            400, f"bad {name!r}: {value!r} is not an ISO date like 2024-05-01 or 2024-05-01T13:00"
        ) from None
    parsed = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    if end_of_day and _DATE_ONLY.match(text):
        parsed += timedelta(days=1)
    return parsed


def parse_filter(
    since: str | None = None,
    until: str | None = None,
    signal: str | None = None,
    adapter: str | None = None,
) -> BucketFilter:
    """A checked filter from query parameters (blank values mean no filter)."""
    start = parse_time("since", since)
    end = parse_time("until", until, end_of_day=True)
    if start is not None and end is not None and end <= start:
        raise PageError(400, f"bad time range: 'until' ({until}) is not after 'since' ({since})")
    chosen_signal = (signal or "").strip() or None
    if chosen_signal is not None and chosen_signal not in SAMPLE_SIGNALS:
        raise PageError(
            400, f"bad 'signal': {signal!r}; expected one of {', '.join(SAMPLE_SIGNALS)}"
        )
    chosen_adapter = (adapter or "").strip() or None
    if chosen_adapter is not None and not ADAPTER_NAME.match(chosen_adapter):
        raise PageError(
            400, f"bad 'adapter': {adapter!r}; expected an adapter name or {BASE_ADAPTER!r}"
        )
    return BucketFilter(start, end, chosen_signal, chosen_adapter)


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the next page of samples starts: just older than this (time, id)."""

    created_at: datetime
    id: int

    def encode(self) -> str:
        """An opaque, URL-safe token."""
        raw = f"{self.created_at.astimezone(UTC).isoformat()}|{self.id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_cursor(token: str | None) -> Cursor | None:
    """The cursor behind a token from a previous page (400 when it was tampered with)."""
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        when, _, ident = raw.partition("|")
        created = datetime.fromisoformat(when)
        if created.tzinfo is None:
            raise ValueError("naive")
        return Cursor(created.astimezone(UTC), int(ident))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise PageError(400, "bad 'cursor': use the 'next page' link of a previous page") from None
