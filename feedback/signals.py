"""Signals per interaction: pull an interaction with its feedback, and name its main signal.

A *feedback record* (:class:`feedback.records.FeedbackRecord`) is one interaction
joined with every feedback event about it: the unit that cleaning, dedup and
dataset building work on. Edited text is lifted to the record's ``edit`` field
(the newest edit wins) so scrubbing sees every user-written text in one place,
and the feedback notes keep only ids, types, payloads and times.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Engine, func, or_, select, true

from feedback.events import EDIT_TYPES, SIGNAL_PRIORITY, FeedbackType, Signal, TaskOutcome
from feedback.records import FeedbackNote, FeedbackRecord
from feedback.schema import feedback_table, interactions_table

_OUTCOMES = frozenset(outcome.value for outcome in TaskOutcome)


def signals_of(feedback: Iterable[FeedbackNote]) -> set[Signal]:
    """The signals in a record's feedback events (task outcomes split by result)."""
    found = (signal_of(event.type, event.outcome) for event in feedback)
    return {signal for signal in found if signal is not None}


def signal_of(kind: str, outcome: str | None) -> Signal | None:
    """The signal one stored feedback event carries (a task outcome's by its result); None
    for an event that carries none (a review, an unknown outcome)."""
    if kind == FeedbackType.TASK_OUTCOME:
        return Signal(f"task_{outcome}") if outcome in _OUTCOMES else None
    return Signal(kind) if kind in _VALUES and kind != FeedbackType.REVIEW else None


_VALUES = frozenset(s.value for s in Signal)


def primary_signal(feedback: Iterable[FeedbackNote], has_edit: bool) -> Signal:
    """The record's main signal, used to scope dedup and to report buckets (an edit counts
    only with its edited text)."""
    present = signals_of(feedback) - {Signal.EDIT}
    if has_edit:
        present.add(Signal.EDIT)
    return next((s for s in SIGNAL_PRIORITY if s in present), Signal.NONE)


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def to_record(interaction: Any, events: list[Any]) -> FeedbackRecord:
    """One feedback record from an interaction row and its feedback rows (the store's edge:
    SQL rows in, a typed record out)."""
    events = sorted(events, key=lambda e: (e.created_at, e.id))
    # A reviewer's corrected answer is an edit too (a review never counts as a user signal).
    edits = [e for e in events if e.type in EDIT_TYPES and e.edited_text]
    feedback = tuple(
        FeedbackNote(
            id=event.id,
            type=event.type,
            outcome=event.outcome,
            rank=event.rank,
            replaced_by=event.replaced_by,
            user_id=event.user_id,
            created_at=_iso(event.created_at),
        )
        for event in events
    )
    return FeedbackRecord(
        request_id=interaction.request_id,
        session_id=interaction.session_id,
        user_id=interaction.user_id,
        key_name=interaction.key_name,
        business_line=interaction.business_line,
        adapter_name=interaction.adapter_name,
        adapter_version=interaction.adapter_version,
        base_model=interaction.base_model,
        messages=tuple(interaction.messages),
        response=interaction.response,
        prompt_hash=interaction.prompt_hash,
        status=interaction.status,
        source=interaction.source,
        created_at=_iso(interaction.created_at),
        feedback=feedback,
        edit=edits[-1].edited_text if edits else None,
        edit_by_reviewer=bool(edits) and edits[-1].type == FeedbackType.REVIEW.value,
        signal=primary_signal(feedback, bool(edits)),
    )


def window_conditions(
    business_line: str, since: datetime | None, until: datetime | None
) -> list[ColumnElement[bool]]:
    """Which interactions belong to a line's window (see :func:`pull_records`)."""
    i, f = interactions_table.c, feedback_table.c
    conditions: list[ColumnElement[bool]] = [i.business_line == business_line]
    if since is not None or until is not None:
        in_window = [
            (column >= since if since is not None else true())
            & (column < until if until is not None else true())
            for column in (i.created_at, f.created_at)
        ]
        late = select(f.request_id).where(f.business_line == business_line, in_window[1])
        conditions.append(or_(in_window[0], i.request_id.in_(late)))
    return conditions


def id_partitions(
    engine: Engine,
    business_line: str,
    parts: int,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[tuple[int, int]]:
    """Split a line's window into at most ``parts`` ranges of interaction ids, in order.

    The ranges are even in ids, not in records: lines share the id sequence
    and arrive interleaved, so each range holds about the same share of a line.
    """
    i = interactions_table.c
    with engine.connect() as connection:
        low, high = connection.execute(
            select(func.min(i.id), func.max(i.id)).where(
                *window_conditions(business_line, since, until)
            )
        ).one()
    if low is None:
        return []
    span = high + 1 - low
    parts = max(1, min(parts, span))
    cuts = [low + span * k // parts for k in range(parts + 1)]
    return list(itertools.pairwise(cuts))


def pull_records(
    engine: Engine,
    business_line: str,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    ids: tuple[int, int] | None = None,
    page_size: int = 5_000,
) -> Iterator[FeedbackRecord]:
    """Feedback records of one line in ingest order, streamed a page at a time.

    With a window (``since`` inclusive, ``until`` exclusive), a record is pulled
    when its interaction or any of its feedback falls inside it: a task outcome
    that arrives days after the answer brings the answer back in. ``ids``
    (first inclusive, last exclusive) keeps one partition of the interactions.
    """
    i, f = interactions_table.c, feedback_table.c
    conditions = window_conditions(business_line, since, until)
    if ids is not None:
        conditions += [i.id >= ids[0], i.id < ids[1]]
    last_id = 0
    with engine.connect() as connection:
        while True:
            page = connection.execute(
                select(interactions_table)
                .where(*conditions, i.id > last_id)
                .order_by(i.id)
                .limit(page_size)
            ).all()
            if not page:
                return
            last_id = page[-1].id
            request_ids = [row.request_id for row in page]
            events: dict[str, list[Any]] = {rid: [] for rid in request_ids}
            for event in connection.execute(
                select(feedback_table).where(f.request_id.in_(request_ids))
            ):
                events[event.request_id].append(event)
            for row in page:
                yield to_record(row, events[row.request_id])
