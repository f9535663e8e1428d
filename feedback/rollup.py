"""Hourly signal counts per business line and served adapter, kept up to date incrementally.

The feedback page and ``flywheel buckets`` show signal counts and rates over time.
Counting them from ``interactions`` and ``feedback_events`` on every read is a scan
of the whole store; the rollup keeps ``(line, adapter, hour, signal) -> count`` in
``signal_rollup`` and folds in only the rows above its own watermark (one per
source table), so a read costs in proportion to what arrived since the last fold.

``requests`` and ``errors`` count interactions; every other signal counts feedback
events, filed under the hour and adapter of the interaction they are about (a
task outcome that arrives days later still counts for the answer that earned it),
so a rate is "share of the requests served in that hour that drew the signal". A
request counts once per signal however many events of it arrive (an imported
OpenAssistant reply carries every annotator's vote): only the first event of a signal
about a request is counted, so a rate never exceeds 100%.

Why a grace period: ids are handed out when a row is inserted, not when its
transaction commits, so a lower id can become visible after a higher one. A fold
only moves the watermark over rows ingested more than ``grace`` ago (ingest and
gateway transactions last well under a second); rows above the watermark are
counted live on every read (the tail), so numbers are exact and fresh either way.
A transaction held open for longer than the grace would be missed by the fold;
:func:`rebuild_rollup` recounts from scratch. Deletions are not folded:
``FeedbackStore.forget_user`` empties the rollup in its own transaction.

Two folds at once cannot double count: the watermark moves by compare-and-set in
the same transaction as the counts it covers; the loser rolls back.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    and_,
    case,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from feedback.events import USER_SIGNALS, FeedbackType, Signal, TaskOutcome
from feedback.schema import (
    feedback_table,
    interactions_table,
    rollup_watermarks_table,
    signal_rollup_table,
)

BASE_ADAPTER = "base"
REQUESTS = "requests"
ERRORS = "errors"
# Feedback signals as the rollup names them: a task outcome splits by its result.
FEEDBACK_SIGNALS: tuple[str, ...] = tuple(signal.value for signal in USER_SIGNALS)
SOURCES = ("interactions", "feedback_events")
FOLD_CHUNK_ROWS = 250_000
TAIL_PAGE_ROWS = 20_000


@dataclass(frozen=True, slots=True)
class RollupCount:
    """One cell of the rollup: how many of ``signal`` for a line, adapter and hour."""

    business_line: str
    adapter: str
    hour: datetime
    signal: str
    count: int


@dataclass(frozen=True, slots=True)
class RollupQuery:
    """Which cells to read: one line or all, an hour range (``until`` exclusive), one adapter."""

    business_line: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    adapter: str | None = None


def floor_hour(value: datetime) -> datetime:
    """``value`` in UTC, cut down to the start of its hour."""
    return value.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ceil_hour(value: datetime) -> datetime:
    """The first hour boundary at or after ``value`` (UTC)."""
    floor = floor_hour(value)
    return floor if floor == value.astimezone(UTC) else floor + timedelta(hours=1)


def feedback_signal(kind: str, outcome: str | None) -> str:
    """The rollup's name for a feedback event (a task outcome splits by success/failure)."""
    if kind == FeedbackType.TASK_OUTCOME:
        found = Signal.TASK_SUCCESS if outcome == TaskOutcome.SUCCESS else Signal.TASK_FAILURE
        return found.value
    return kind


def merge_counts(*parts: Iterable[RollupCount]) -> list[RollupCount]:
    """Cells with the same line, adapter, hour and signal added up (pure)."""
    totals: dict[tuple[str, str, datetime, str], int] = defaultdict(int)
    for part in parts:
        for cell in part:
            totals[(cell.business_line, cell.adapter, cell.hour, cell.signal)] += cell.count
    return [RollupCount(*key, count) for key, count in sorted(totals.items()) if count]


def _as_hour(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def matches(cell: RollupCount, query: RollupQuery) -> bool:
    """Whether a cell falls inside ``query`` (pure; hours compared at their start)."""
    return (
        (query.business_line is None or cell.business_line == query.business_line)
        and (query.since is None or cell.hour >= query.since)
        and (query.until is None or cell.hour < query.until)
        and (query.adapter is None or cell.adapter == query.adapter)
    )


def _cell_conditions(query: RollupQuery) -> list[ColumnElement[bool]]:
    table = signal_rollup_table.c
    where: list[ColumnElement[bool]] = [true()]
    if query.business_line is not None:
        where.append(table.business_line == query.business_line)
    if query.since is not None:
        where.append(table.hour >= query.since)
    if query.until is not None:
        where.append(table.hour < query.until)
    if query.adapter is not None:
        where.append(table.adapter == query.adapter)
    return where


def _pages(connection: Connection, query: Select[Any], key: Any, above: int) -> Iterator[Any]:
    """Rows of ``query`` with ``key`` above ``above``, in key order, a page at a time."""
    while True:
        rows = connection.execute(
            query.where(key > above).order_by(key).limit(TAIL_PAGE_ROWS)
        ).all()
        yield from rows
        if len(rows) < TAIL_PAGE_ROWS:
            return
        above = rows[-1][0]


def _watermarks(connection: Connection) -> dict[str, int]:
    marks = rollup_watermarks_table.c
    found = {
        row.source: int(row.last_id)
        for row in connection.execute(select(marks.source, marks.last_id))
    }
    return {source: found.get(source, 0) for source in SOURCES}


def _hour_of(column: Any, dialect: str) -> ColumnElement[Any]:
    """SQL for the UTC hour of a timestamp column (naive UTC; read back by ``_as_hour``)."""
    if dialect == "postgresql":
        return func.date_trunc("hour", func.timezone("UTC", column))
    return func.strftime("%Y-%m-%d %H:00:00", column)


class SignalRollup:
    """Reads the hourly rollup (plus the live tail) and folds new rows into it."""

    def __init__(
        self,
        engine: Engine,
        *,
        grace: timedelta = timedelta(minutes=2),
        min_fold_interval_s: float = 5.0,
        tail_ttl_s: float = 1.0,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.engine = engine
        self.grace = grace
        self.min_fold_interval_s = min_fold_interval_s
        self._clock = clock or (lambda: datetime.now(UTC))
        self.tail_ttl_s = tail_ttl_s
        self._lock = threading.Lock()
        self._lock_tail = threading.Lock()
        self._tail_memo: tuple[float, dict[str, int], list[RollupCount]] | None = None
        self._folded_at: float | None = None

    @property
    def dialect(self) -> str:
        """``postgresql`` or ``sqlite``."""
        return self.engine.dialect.name

    def watermarks(self) -> dict[str, int]:
        """The last folded id of each source table (0 before the first fold)."""
        with self.engine.connect() as connection:
            return _watermarks(connection)

    def refresh(self, *, force: bool = False) -> int:
        """Fold rows older than the grace period into the rollup; returns how many rows.

        At most one fold per ``min_fold_interval_s`` in this process unless ``force``;
        reads stay exact in between because they add the tail.
        """
        now = time.monotonic()
        if (
            not force
            and self._folded_at is not None
            and now - self._folded_at < self.min_fold_interval_s
        ):
            return 0
        if not self._lock.acquire(blocking=force):
            return 0
        try:
            folded = sum(self._fold(source) for source in SOURCES)
            self._folded_at = time.monotonic()
            return folded
        finally:
            self._lock.release()

    def _fold(self, source: str) -> int:
        table = interactions_table if source == "interactions" else feedback_table
        cutoff = self._clock() - self.grace
        self._ensure_watermark(source)
        folded = 0
        while True:
            with self.engine.connect() as connection:
                old = connection.execute(
                    select(rollup_watermarks_table.c.last_id).where(
                        rollup_watermarks_table.c.source == source
                    )
                ).scalar_one()
                chunk = (
                    select(table.c.id)
                    .where(table.c.id > old, table.c.ingested_at < cutoff)
                    .order_by(table.c.id)
                    .limit(FOLD_CHUNK_ROWS)
                    .subquery()
                )
                rows, ready = connection.execute(select(func.count(), func.max(chunk.c.id))).one()
            if ready is None:
                return folded
            with self.engine.begin() as connection:
                moved = connection.execute(
                    update(rollup_watermarks_table)
                    .where(
                        rollup_watermarks_table.c.source == source,
                        rollup_watermarks_table.c.last_id == old,
                    )
                    .values(last_id=ready, updated_at=self._clock())
                ).rowcount
                if moved != 1:
                    # Another fold moved it first and counted these rows; ours rolls back.
                    return folded
                cells = self._aggregate(connection, source, old, ready)
                self._add(connection, cells)
            folded += int(rows)

    def _ensure_watermark(self, source: str) -> None:
        insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        with self.engine.begin() as connection:
            connection.execute(
                insert(rollup_watermarks_table)
                .values(source=source, last_id=0, updated_at=self._clock())
                .on_conflict_do_nothing(index_elements=["source"])
            )

    def _add(self, connection: Connection, cells: list[RollupCount]) -> None:
        if not cells:
            return
        table = signal_rollup_table
        insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        statement = insert(table)
        statement = statement.on_conflict_do_update(
            index_elements=["business_line", "adapter", "hour", "signal"],
            set_={"count": table.c.count + statement.excluded.count},
        )
        connection.execute(
            statement,
            [
                {
                    "business_line": c.business_line,
                    "adapter": c.adapter,
                    "hour": c.hour,
                    "signal": c.signal,
                    "count": c.count,
                }
                for c in cells
            ],
        )

    def _aggregate(
        self, connection: Connection, source: str, above: int, upto: int
    ) -> list[RollupCount]:
        """Count the rows of ``source`` with ids in ``(above, upto]`` by line, adapter, hour.

        Only a bounded id range selects rows, so the plan is a primary-key range scan
        (plus a unique-index probe per feedback event of a small range).
        """
        i, f = interactions_table.c, feedback_table.c
        adapter = func.coalesce(i.adapter_name, literal(BASE_ADAPTER))
        hour = _hour_of(i.created_at, self.dialect)
        cells: list[RollupCount] = []
        if source == "interactions":
            in_range = and_(i.id > above, i.id <= upto)
            errors = func.sum(case((i.status != "ok", 1), else_=0))
            rows = connection.execute(
                select(i.business_line, adapter, hour, func.count(), errors)
                .where(in_range)
                .group_by(i.business_line, adapter, hour)
            )
            for line, name, at, requests, failed in rows:
                cells.append(RollupCount(line, name, _as_hour(at), REQUESTS, int(requests)))
                if failed:
                    cells.append(RollupCount(line, name, _as_hour(at), ERRORS, int(failed)))
            return cells
        in_range = and_(f.id > above, f.id <= upto)
        e = feedback_table.alias("earlier").c
        first_of_its_signal = ~exists(
            select(literal(1)).where(
                e.request_id == f.request_id,
                e.type == f.type,
                or_(e.outcome == f.outcome, and_(e.outcome.is_(None), f.outcome.is_(None))),
                e.id < f.id,
            )
        )
        rows = connection.execute(
            select(i.business_line, adapter, hour, f.type, f.outcome, func.count())
            .select_from(feedback_table.join(interactions_table, i.request_id == f.request_id))
            .where(in_range, f.type.in_((*FEEDBACK_SIGNALS, "task_outcome")), first_of_its_signal)
            .group_by(i.business_line, adapter, hour, f.type, f.outcome)
        )
        for line, name, at, kind, outcome, count in rows:
            signal = feedback_signal(kind, outcome)
            cells.append(RollupCount(line, name, _as_hour(at), signal, int(count)))
        return merge_counts(cells)

    def _tail(self, connection: Connection) -> list[RollupCount]:
        """Cells of the rows above the watermarks (not folded yet), counted live and kept
        for ``tail_ttl_s`` (one page view reads it several times).

        Read in primary-key order with a limit, a page at a time, and counted here:
        whatever the planner's statistics say, that is an index range scan of the few
        rows that arrived in the last ``grace``, never a scan of the store.
        """
        now = time.monotonic()
        marks = _watermarks(connection)
        with self._lock_tail:
            memo = self._tail_memo
        if memo is not None and memo[1] == marks and now - memo[0] < self.tail_ttl_s:
            return memo[2]
        cells = self._count_tail(connection, marks)
        with self._lock_tail:
            self._tail_memo = (now, marks, cells)
        return cells

    def _count_tail(self, connection: Connection, marks: dict[str, int]) -> list[RollupCount]:
        i, f = interactions_table.c, feedback_table.c
        served: dict[str, tuple[str, str, datetime]] = {}
        cells: Counter[tuple[str, str, datetime, str]] = Counter()
        for row in _pages(
            connection,
            select(i.id, i.request_id, i.business_line, i.adapter_name, i.created_at, i.status),
            i.id,
            marks["interactions"],
        ):
            key = (row.business_line, row.adapter_name or BASE_ADAPTER, floor_hour(row.created_at))
            served[row.request_id] = key
            cells[(*key, REQUESTS)] += 1
            if row.status != "ok":
                cells[(*key, ERRORS)] += 1
        events = list(
            _pages(
                connection,
                select(f.id, f.request_id, f.type, f.outcome),
                f.id,
                marks["feedback_events"],
            )
        )
        missing = sorted({e.request_id for e in events} - served.keys())
        for start in range(0, len(missing), 1_000):
            chunk = missing[start : start + 1_000]
            query = select(i.request_id, i.business_line, i.adapter_name, i.created_at).where(
                i.request_id.in_(chunk)
            )
            for row in connection.execute(query):
                served[row.request_id] = (
                    row.business_line,
                    row.adapter_name or BASE_ADAPTER,
                    floor_hour(row.created_at),
                )
        first = _first_events(connection, sorted({e.request_id for e in events}))
        for event in events:
            signal = feedback_signal(event.type, event.outcome)
            if (
                signal in FEEDBACK_SIGNALS
                and event.request_id in served
                and first.get((event.request_id, event.type, event.outcome)) == event.id
            ):
                cells[(*served[event.request_id], signal)] += 1
        return [RollupCount(*key, count) for key, count in cells.items()]

    def total(self, query: RollupQuery, signal: str) -> int:
        """How many of ``signal`` the cells matching ``query`` hold (summed in the database)."""
        self.refresh()
        table = signal_rollup_table
        where = [*_cell_conditions(query), table.c.signal == signal]
        with self.engine.connect() as connection:
            folded = connection.execute(select(func.sum(table.c.count)).where(*where)).scalar()
            tail = self._tail(connection)
        fresh = sum(c.count for c in tail if c.signal == signal and matches(c, query))
        return int(folded or 0) + fresh

    def counts(self, query: RollupQuery) -> list[RollupCount]:
        """The cells matching ``query``: folded ones plus the live tail above the watermarks.

        ``since``/``until`` select whole hours (the rollup's resolution): pass hour
        boundaries (:func:`floor_hour`, :func:`ceil_hour`) for exact numbers.
        """
        self.refresh()
        table = signal_rollup_table
        where = _cell_conditions(query)
        columns = (table.c.business_line, table.c.adapter, table.c.hour, table.c.signal)
        with self.engine.connect() as connection:
            folded = [
                RollupCount(line, adapter, _as_hour(hour), signal, int(count))
                for line, adapter, hour, signal, count in connection.execute(
                    select(*columns, table.c.count).where(*where)
                )
            ]
            tail = [cell for cell in self._tail(connection) if matches(cell, query)]
        return merge_counts(folded, tail) if tail else folded

    def lines(self) -> list[str]:
        """Business lines with at least one counted request (folded or in the tail)."""
        self.refresh()
        with self.engine.connect() as connection:
            folded = set(
                connection.execute(select(signal_rollup_table.c.business_line).distinct()).scalars()
            )
            fresh = {cell.business_line for cell in self._tail(connection)}
        return sorted(folded | fresh)

    def span(self, business_line: str) -> tuple[datetime, datetime] | None:
        """From the line's first counted hour to the end of its last one (None when empty)."""
        self.refresh()
        table = signal_rollup_table
        with self.engine.connect() as connection:
            first, last = connection.execute(
                select(func.min(table.c.hour), func.max(table.c.hour)).where(
                    table.c.business_line == business_line
                )
            ).one()
            tail = self._tail(connection)
        hours = [_as_hour(v) for v in (first, last) if v is not None]
        hours += [cell.hour for cell in tail if cell.business_line == business_line]
        if not hours:
            return None
        return min(hours), max(hours) + timedelta(hours=1)

    def adapters(self, business_line: str) -> list[str]:
        """Adapters that served the line, in the order they first served it."""
        self.refresh()
        table = signal_rollup_table
        with self.engine.connect() as connection:
            first = {
                adapter: _as_hour(hour)
                for adapter, hour in connection.execute(
                    select(table.c.adapter, func.min(table.c.hour))
                    .where(table.c.business_line == business_line, table.c.signal == REQUESTS)
                    .group_by(table.c.adapter)
                )
            }
            tail = self._tail(connection)
        for cell in tail:
            if cell.business_line == business_line and cell.signal == REQUESTS:
                first[cell.adapter] = min(first.get(cell.adapter, cell.hour), cell.hour)
        return sorted(first, key=lambda name: (first[name], name))


def _first_events(
    connection: Connection, request_ids: list[str]
) -> dict[tuple[str, str, str | None], int]:
    """The id of the first event of each (request, type, outcome) of these requests: the
    one event a request's signal is counted by."""
    f = feedback_table.c
    first: dict[tuple[str, str, str | None], int] = {}
    for start in range(0, len(request_ids), 1_000):
        query = select(f.id, f.request_id, f.type, f.outcome).where(
            f.request_id.in_(request_ids[start : start + 1_000])
        )
        for row in connection.execute(query):
            key = (row.request_id, row.type, row.outcome)
            first[key] = min(first.get(key, row.id), row.id)
    return first


def rebuild_rollup(engine: Engine) -> None:
    """Forget every count and watermark; the next read recounts the store from scratch."""
    with engine.begin() as connection:
        connection.execute(delete(signal_rollup_table))
        connection.execute(delete(rollup_watermarks_table))
