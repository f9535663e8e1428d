"""The feedback page's reads from the store (SQLAlchemy Core), thin and index-backed.

Samples come back as :class:`RawSample`: raw text straight from the store, meant
only for :mod:`dashboard.scrubbed`, which turns them into what a page may show.
Pages are keyset-paginated on ``(created_at, id)`` newest first, so page 1000
costs what page 1 does; filters are index range scans on
``interactions(business_line, created_at)`` (or ``(business_line, adapter_name,
created_at)``) with a probe of ``feedback_events(request_id)`` per candidate row
for a signal filter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Engine, Select, and_, exists, literal, or_, select

from dashboard.filters import BucketFilter, Cursor
from feedback.events import EDIT_TYPES, FeedbackType, Signal
from feedback.examples import user_digest
from feedback.rollup import (
    BASE_ADAPTER,
    ERRORS,
    FEEDBACK_SIGNALS,
    REQUESTS,
    RollupCount,
    feedback_signal,
    merge_counts,
)
from feedback.schema import feedback_table, interactions_table


@dataclass(frozen=True, slots=True)
class RawEvent:
    """One feedback event of a sample (``edited_text`` is raw)."""

    type: str
    outcome: str | None
    created_at: datetime
    edited_text: str | None


@dataclass(frozen=True, slots=True)
class RawSample:
    """An interaction with its feedback, unscrubbed: never rendered as it is."""

    id: int
    request_id: str
    business_line: str
    created_at: datetime
    adapter: str
    status: str
    latency_ms: float | None
    user: str | None
    messages: list[dict[str, Any]]
    response: str
    events: tuple[RawEvent, ...]

    @property
    def edit(self) -> str | None:
        """The newest edit's text (as the cleaning stage takes it)."""
        edits = [e.edited_text for e in self.events if e.type in EDIT_TYPES and e.edited_text]
        return edits[-1] if edits else None

    def cursor(self) -> Cursor:
        """The cursor of the page that starts just after this sample."""
        return Cursor(self.created_at, self.id)


# The outcome each task signal stands for (task_success: success).
_TASK_OUTCOMES = {s.value: s.outcome.value for s in Signal if s.outcome is not None}


def _signal_condition(signal: str) -> ColumnElement[bool]:
    """A per-row probe of ``feedback_events(request_id)`` for the signal.

    ``OFFSET 0`` keeps PostgreSQL from turning the probe into a join: as a join,
    stale or missing statistics can make it read every event of the signal (or
    worse) before the first page; as a probe, a page costs the rows it walks.
    """
    i, f = interactions_table.c, feedback_table.c
    about = [f.request_id == i.request_id]
    outcome = _TASK_OUTCOMES.get(signal)
    if outcome is not None:
        about += [f.type == FeedbackType.TASK_OUTCOME.value, f.outcome == outcome]
    elif signal != Signal.NONE:
        about.append(f.type == signal)
    probe = exists(select(literal(1)).where(*about).offset(0))
    return ~probe if signal == Signal.NONE else probe


def sample_conditions(business_line: str, bucket: BucketFilter) -> list[ColumnElement[bool]]:
    """WHERE clauses of a bucket (shared by pages and exports)."""
    i = interactions_table.c
    where: list[ColumnElement[bool]] = [i.business_line == business_line]
    if bucket.since is not None:
        where.append(i.created_at >= bucket.since)
    if bucket.until is not None:
        where.append(i.created_at < bucket.until)
    if bucket.adapter is not None:
        where.append(
            i.adapter_name.is_(None)
            if bucket.adapter == BASE_ADAPTER
            else i.adapter_name == bucket.adapter
        )
    if bucket.signal is not None:
        where.append(_signal_condition(bucket.signal))
    return where


def sample_query(
    business_line: str, bucket: BucketFilter, cursor: Cursor | None, limit: int
) -> Select[Any]:
    """The statement of one page: ``limit`` interactions of the bucket after ``cursor``."""
    i = interactions_table.c
    where = sample_conditions(business_line, bucket)
    if cursor is not None:
        # The first bound alone is an index range; the OR breaks ties on id.
        where.append(i.created_at <= cursor.created_at)
        where.append(
            or_(
                i.created_at < cursor.created_at,
                and_(i.created_at == cursor.created_at, i.id < cursor.id),
            )
        )
    query = select(interactions_table).where(*where)
    return query.order_by(i.created_at.desc(), i.id.desc()).limit(limit)


def sample_page(
    engine: Engine,
    business_line: str,
    bucket: BucketFilter,
    cursor: Cursor | None,
    limit: int,
) -> tuple[list[RawSample], Cursor | None]:
    """One page of a bucket, newest first, and the cursor of the next page (if any)."""
    query = sample_query(business_line, bucket, cursor, limit + 1)
    with engine.connect() as connection:
        rows = connection.execute(query).all()
        samples = _with_events(connection, rows[:limit])
    following = samples[-1].cursor() if len(rows) > limit and samples else None
    return samples, following


def sample(engine: Engine, business_line: str, request_id: str) -> RawSample | None:
    """One interaction of the line with its feedback, or ``None``."""
    i = interactions_table.c
    query = select(interactions_table).where(
        i.request_id == request_id, i.business_line == business_line
    )
    with engine.connect() as connection:
        rows = connection.execute(query).all()
        found = _with_events(connection, rows)
    return found[0] if found else None


def minute_counts(
    engine: Engine,
    business_line: str,
    since: datetime,
    until: datetime,
    adapter: str | None = None,
) -> list[RollupCount]:
    """The rollup's cells at minute resolution, counted from the raw rows of ``[since,
    until)``: for a window too short for hourly points to show a trend. Counted as the
    rollup counts (each request once per signal, under its own minute); the caller keeps
    the window small (a few thousand requests)."""
    i, f = interactions_table.c, feedback_table.c
    where = sample_conditions(
        business_line, BucketFilter(since=since, until=until, adapter=adapter)
    )
    served: dict[str, tuple[str, datetime]] = {}
    cells: list[RollupCount] = []
    with engine.connect() as connection:
        rows = connection.execute(
            select(i.request_id, i.adapter_name, i.created_at, i.status).where(*where)
        )
        for row in rows:
            minute = row.created_at.replace(second=0, microsecond=0)
            if minute.tzinfo is None:
                minute = minute.replace(tzinfo=UTC)
            name = row.adapter_name or BASE_ADAPTER
            served[row.request_id] = (name, minute)
            cells.append(RollupCount(business_line, name, minute, REQUESTS, 1))
            if row.status != "ok":
                cells.append(RollupCount(business_line, name, minute, ERRORS, 1))
        events = connection.execute(
            select(f.request_id, f.type, f.outcome)
            .select_from(feedback_table.join(interactions_table, i.request_id == f.request_id))
            .where(*where)
            .order_by(f.id)
        )
        seen: set[tuple[str, str, str | None]] = set()
        for event in events:
            signal = feedback_signal(event.type, event.outcome)
            key = (event.request_id, event.type, event.outcome)
            if signal not in FEEDBACK_SIGNALS or key in seen:
                continue
            seen.add(key)
            name, minute = served[event.request_id]
            cells.append(RollupCount(business_line, name, minute, signal, 1))
    return merge_counts(cells)


def _with_events(connection: Any, rows: Sequence[Any]) -> list[RawSample]:
    if not rows:
        return []
    f = feedback_table.c
    ids = [row.request_id for row in rows]
    events: dict[str, list[RawEvent]] = {rid: [] for rid in ids}
    query = (
        select(f.request_id, f.type, f.outcome, f.created_at, f.edited_text)
        .where(f.request_id.in_(ids))
        .order_by(f.created_at, f.id)
    )
    for row in connection.execute(query):
        events[row.request_id].append(
            RawEvent(row.type, row.outcome, row.created_at, row.edited_text)
        )
    return [
        RawSample(
            id=row.id,
            request_id=row.request_id,
            business_line=row.business_line,
            created_at=row.created_at,
            adapter=row.adapter_name or BASE_ADAPTER,
            status=row.status,
            latency_ms=row.latency_ms,
            user=(user_digest(row.user_id) or "")[:12] or None,
            messages=list(row.messages),
            response=row.response,
            events=tuple(events[row.request_id]),
        )
        for row in rows
    ]
