"""Pure shaping of rollup cells into what the page and ``flywheel buckets`` show.

Totals per adapter with rates, time series binned so a plot has a bounded number
of points, and the canary against the champion over the same hours. No I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from feedback.rollup import ERRORS, FEEDBACK_SIGNALS, REQUESTS, RollupCount, floor_hour

BUCKET_SIZES: tuple[timedelta, ...] = (
    timedelta(hours=1),
    timedelta(hours=3),
    timedelta(hours=6),
    timedelta(hours=12),
    timedelta(days=1),
    timedelta(days=7),
    timedelta(days=28),
)
# Below an hour only for counts read from the raw rows (the rollup is hourly).
FINE_BUCKET_SIZES: tuple[timedelta, ...] = tuple(
    timedelta(minutes=m) for m in (1, 2, 5, 10, 15, 30)
)
HOUR = timedelta(hours=1)
RATE_SIGNALS: tuple[str, ...] = (ERRORS, *FEEDBACK_SIGNALS)
_EPOCH = datetime(1970, 1, 5, tzinfo=UTC)  # a Monday: weekly buckets start on Mondays


def human_time(value: datetime | str | None) -> str:
    """A moment as people read it: ``4 Dec 2026, 09:25 UTC`` (an ISO string is parsed first;
    a string that is not a time is returned as it is)."""
    if not value:
        return ""
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    else:
        moment = value
    if moment.tzinfo:
        moment = moment.astimezone(UTC)
    return f"{moment.day} {moment:%b %Y, %H:%M} UTC"


def human_span(size: timedelta) -> str:
    """A bucket size as people say it: ``5 min``, ``3 h``, ``1 day``, ``7 days``."""
    minutes = int(size.total_seconds() // 60)
    if minutes < 60:
        return f"{minutes} min"
    if minutes < 24 * 60:
        return f"{minutes // 60} h"
    days = minutes // (24 * 60)
    return f"{days} day" if days == 1 else f"{days} days"


def rate(count: int, requests: int) -> float | None:
    """``count / requests``, or ``None`` when nothing was served."""
    return count / requests if requests else None


@dataclass(slots=True)
class AdapterTotals:
    """One adapter's requests and signal counts over a range."""

    adapter: str
    requests: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def count(self, signal: str) -> int:
        """How many of ``signal`` (``requests`` included)."""
        return self.requests if signal == REQUESTS else self.counts.get(signal, 0)

    def rate(self, signal: str) -> float | None:
        """Share of requests that drew ``signal``."""
        return rate(self.counts.get(signal, 0), self.requests)

    def as_dict(self) -> dict[str, object]:
        """JSON-ready: counts and rates per signal."""
        return {
            "adapter": self.adapter,
            "requests": self.requests,
            "counts": {s: self.counts.get(s, 0) for s in RATE_SIGNALS},
            "rates": {s: self.rate(s) for s in RATE_SIGNALS},
        }


def adapter_totals(cells: Iterable[RollupCount], order: Sequence[str] = ()) -> list[AdapterTotals]:
    """Totals per adapter (in ``order`` first, then by name), plus an ``all`` row when
    more than one adapter served."""
    by_adapter: dict[str, AdapterTotals] = {}
    for cell in cells:
        totals = by_adapter.setdefault(cell.adapter, AdapterTotals(cell.adapter))
        if cell.signal == REQUESTS:
            totals.requests += cell.count
        else:
            totals.counts[cell.signal] = totals.counts.get(cell.signal, 0) + cell.count
    rank = {name: i for i, name in enumerate(order)}
    rows = sorted(by_adapter.values(), key=lambda t: (rank.get(t.adapter, len(rank)), t.adapter))
    if len(rows) > 1:
        overall = AdapterTotals("all")
        for row in rows:
            overall.requests += row.requests
            for signal, count in row.counts.items():
                overall.counts[signal] = overall.counts.get(signal, 0) + count
        rows.append(overall)
    return rows


def bucket_size(
    since: datetime, until: datetime, max_points: int, finest: timedelta = HOUR
) -> timedelta:
    """The smallest bucket of at least ``finest`` that keeps ``[since, until)`` within
    ``max_points`` buckets."""
    span = until - since
    for size in (*FINE_BUCKET_SIZES, *BUCKET_SIZES):
        if size < finest:
            continue
        if span / size <= max_points:
            return size
    return BUCKET_SIZES[-1]


def bucket_start(value: datetime, size: timedelta) -> datetime:
    """The start of the bucket of ``size`` holding ``value`` (aligned on UTC, weeks on Monday)."""
    steps = (value.astimezone(UTC) - _EPOCH) // size
    return _EPOCH + steps * size


def bucket_starts(since: datetime, until: datetime, size: timedelta) -> list[datetime]:
    """Every bucket start covering ``[since, until)``."""
    starts = []
    current = bucket_start(since, size)
    while current < until:
        starts.append(current)
        current += size
    return starts


@dataclass(frozen=True, slots=True)
class Series:
    """Counts per bucket, per adapter and signal, on shared bucket starts."""

    starts: list[datetime]
    size: timedelta
    counts: dict[str, dict[str, list[int]]]

    def rates(self, adapter: str, signal: str) -> list[float | None]:
        """Per-bucket share of the adapter's requests that drew ``signal``."""
        requests = self.counts[adapter].get(REQUESTS, [0] * len(self.starts))
        values = self.counts[adapter].get(signal, [0] * len(self.starts))
        return [rate(v, r) for v, r in zip(values, requests, strict=True)]


def time_series(
    cells: Iterable[RollupCount],
    since: datetime,
    until: datetime,
    max_points: int,
    adapters: Sequence[str] = (),
    finest: timedelta = HOUR,
) -> Series:
    """Cells binned into at most ``max_points`` buckets between ``since`` and ``until``
    (buckets of at least ``finest``: the resolution of the cells)."""
    size = bucket_size(since, until, max_points, finest)
    starts = bucket_starts(since, until, size)
    index = {start: i for i, start in enumerate(starts)}
    counts: dict[str, dict[str, list[int]]] = {name: {} for name in adapters}
    for cell in cells:
        position = index.get(bucket_start(cell.hour, size))
        if position is None:
            continue
        per_signal = counts.setdefault(cell.adapter, {})
        values = per_signal.setdefault(cell.signal, [0] * len(starts))
        values[position] += cell.count
    return Series(starts, size, counts)


def default_range(
    span: tuple[datetime, datetime] | None, since: datetime | None, until: datetime | None
) -> tuple[datetime, datetime]:
    """The range a view shows: what was asked, filled in from the data's own span."""
    now = floor_hour(datetime.now(UTC)) + timedelta(hours=1)
    first, last = span or (now - timedelta(days=7), now)
    end = until or last
    start = since or min(first, end - timedelta(hours=1))
    return start, end


@dataclass(frozen=True, slots=True)
class ArmComparison:
    """One signal's rate on the champion and on the canary over the same hours."""

    signal: str
    champion_count: int
    champion_rate: float | None
    canary_count: int
    canary_rate: float | None

    @property
    def difference(self) -> float | None:
        """Canary rate minus champion rate (percentage points as a fraction)."""
        if self.champion_rate is None or self.canary_rate is None:
            return None
        return self.canary_rate - self.champion_rate


def compare_arms(
    cells: Iterable[RollupCount], champion: str, canary: str
) -> tuple[int, int, list[ArmComparison]]:
    """(champion requests, canary requests, one comparison per signal) from rollup cells."""
    totals = {t.adapter: t for t in adapter_totals(cells)}
    ours = totals.get(canary, AdapterTotals(canary))
    theirs = totals.get(champion, AdapterTotals(champion))
    rows = [
        ArmComparison(
            signal,
            theirs.counts.get(signal, 0),
            theirs.rate(signal),
            ours.counts.get(signal, 0),
            ours.rate(signal),
        )
        for signal in RATE_SIGNALS
    ]
    return theirs.requests, ours.requests, rows
