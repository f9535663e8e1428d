"""Online numbers per served adapter over a time window, from what the gateway logged.

The canary flow compares the canary and the champion on the same window:
requests, errors, p99 latency, and how many of those requests drew a
thumbs-down, a regenerate, an edit, a thumbs-up, an abandon or a failed task
outcome (``task_failure``; each request counted once per signal, however many
times it got one), and how many drew any of those negative signals at all
(``dissatisfied``: one count per request, whatever mix of them it got — the
rate with the most events, so the first to show a canary that is worse all round).

Errors are the model side's only (vLLM down, failed, a broken stream, an adapter
missing): a request vLLM refused as malformed is the caller's, and is not counted.
A request the client cancelled before its answer ended counts as an abandon.

Reviews (the feedback page's spot checks, ``review`` events) are counted per
review, not per request: how many of the arm's answers in the window were
reviewed, and how many of those reviews failed them (the pass rate's test).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Engine, and_, select

from feedback.contributions import Answer, LookBound, counted_requests
from feedback.events import ONLINE_SIGNALS, SIGNAL_TYPES, FeedbackType, ReviewVerdict, Signal
from feedback.schema import feedback_table, interactions_table
from feedback.signals import signal_of
from flywheel.quantiles import observed_quantile

COUNTED_SIGNALS = tuple(
    s.value for s in (*ONLINE_SIGNALS, Signal.THUMBS_UP) if s is not Signal.TASK_FAILURE
)
TASK_FAILURE = Signal.TASK_FAILURE.value
DISSATISFIED = "dissatisfied"
# Error kinds the caller caused (the gateway's interaction metadata "error_kind").
CLIENT_ERROR_KINDS = frozenset({"rejected_by_model_server"})
REVIEW = FeedbackType.REVIEW.value
_NEGATIVE_TYPES = tuple(s.value for s in ONLINE_SIGNALS if s is not Signal.TASK_FAILURE)
# The feedback a look reads: the counted signals, task outcomes and reviews.
_LOOKED_AT = (*COUNTED_SIGNALS, "task_outcome", REVIEW)


@dataclass(frozen=True, slots=True)
class AnswerStats:
    """What the answers themselves show, over the arm's answered requests: refusals,
    output length (mean and standard deviation, in tokens), TTFT and time per token."""

    answered: int = 0
    refusals: int = 0
    output_tokens_mean: float | None = None
    output_tokens_sd: float | None = None
    p99_ttft_ms: float | None = None
    p50_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    # The timed answers (ms), for the canary's confidence bounds on their quantiles.
    ttft_samples_ms: tuple[float, ...] = ()
    tpot_samples_ms: tuple[float, ...] = ()


def answer_stats(rows: Iterable[Any]) -> AnswerStats:
    """An arm's :class:`AnswerStats` from its interactions (status, ttft_ms, metadata)."""
    tokens: list[float] = []
    ttfts: list[float] = []
    tpots: list[float] = []
    refusals = 0
    for row in rows:
        if row.status != "ok":
            continue
        if row.ttft_ms is not None:
            ttfts.append(float(row.ttft_ms))
        meta = row.metadata if isinstance(row.metadata, dict) else {}
        count = meta.get("output_tokens")
        if isinstance(count, int):
            tokens.append(float(count))
        tpot = meta.get("tpot_ms")
        if isinstance(tpot, int | float):
            tpots.append(float(tpot))
        refusals += bool(meta.get("refusal"))
    mean = sd = None
    if tokens:
        mean = statistics.fmean(tokens)
        sd = statistics.stdev(tokens) if len(tokens) > 1 else 0.0
    return AnswerStats(
        answered=len(tokens),
        refusals=refusals,
        output_tokens_mean=mean,
        output_tokens_sd=sd,
        p99_ttft_ms=observed_quantile(ttfts, 0.99),
        p50_tpot_ms=observed_quantile(tpots, 0.5),
        p99_tpot_ms=observed_quantile(tpots, 0.99),
        ttft_samples_ms=tuple(ttfts),
        tpot_samples_ms=tuple(tpots),
    )


@dataclass(frozen=True, slots=True)
class AdapterWindow:
    """One adapter's online numbers over a window."""

    adapter: str | None
    requests: int
    errors: int
    p99_latency_ms: float | None
    signals: dict[str, int]
    latency_samples_ms: tuple[float, ...] = ()
    answers: AnswerStats = field(default_factory=AnswerStats)
    reviews: int = 0
    review_failures: int = 0


def _model_side_error(status: str, metadata: Any) -> bool:
    """An error the model side caused (the caller's refused requests and cancels are not)."""
    if status != "error":
        return False
    kind = metadata.get("error_kind") if isinstance(metadata, dict) else None
    return kind not in CLIENT_ERROR_KINDS


def _served(adapter: str | None) -> ColumnElement[bool]:
    column = interactions_table.c.adapter_name
    return column.is_(None) if adapter is None else column == adapter


def _bounded(rows: list[Any], bound: LookBound | None) -> list[Any]:
    """The rows a look counts: every one, or within ``bound`` (``feedback.contributions``)."""
    if bound is None:
        return rows
    counted = counted_requests(
        (Answer(r.request_id, r.created_at, r.user_id, r.session_id, r.key_name) for r in rows),
        bound,
    )
    return [r for r in rows if r.request_id in counted]


def window_numbers(adapter: str | None, rows: list[Any], events: list[Any]) -> AdapterWindow:
    """One adapter's numbers from its requests in a window (request_id, status, latency_ms,
    ttft_ms, metadata) and the feedback on them (request_id, type, outcome) (pure)."""
    kinds: dict[str, set[str]] = defaultdict(set)
    verdicts: Counter[str] = Counter()
    for event in events:
        if event.type == REVIEW:
            verdicts[event.outcome] += 1
            continue
        kinds[event.type].add(event.request_id)
        if event.type == "task_outcome" and event.outcome == "failure":
            kinds[TASK_FAILURE].add(event.request_id)
    cancelled = {r.request_id for r in rows if r.status == "cancelled"}
    dissatisfied = set(kinds[TASK_FAILURE]).union(*(kinds[t] for t in _NEGATIVE_TYPES))
    latencies = [r.latency_ms for r in rows if r.status == "ok" and r.latency_ms]
    return AdapterWindow(
        adapter=adapter,
        requests=len(rows),
        errors=sum(1 for r in rows if _model_side_error(r.status, r.metadata)),
        p99_latency_ms=observed_quantile(latencies, 0.99),
        latency_samples_ms=tuple(float(v) for v in latencies),
        signals={name: len(kinds[name]) for name in COUNTED_SIGNALS}
        | {
            Signal.ABANDON.value: len(kinds[Signal.ABANDON.value] | cancelled),
            TASK_FAILURE: len(kinds[TASK_FAILURE]),
            DISSATISFIED: len(dissatisfied | cancelled),
        },
        answers=answer_stats(rows),
        reviews=sum(verdicts.values()),
        review_failures=verdicts[ReviewVerdict.FAIL.value],
    )


def adapter_windows(
    engine: Engine,
    business_line: str,
    adapters: Iterable[str | None],
    since: datetime,
    until: datetime,
    bound: LookBound | None = None,
) -> dict[str | None, AdapterWindow]:
    """Each adapter's numbers for requests made in ``[since, until)`` (None = the base
    model); with ``bound``, only the answers a look counts (each user's first few, each
    key within its share: ``feedback.contributions``), so a few hyperactive users or one
    key's invented users cannot swing a canary's look."""
    interactions, feedback = interactions_table, feedback_table
    in_window = and_(
        interactions.c.business_line == business_line,
        interactions.c.created_at >= since,
        interactions.c.created_at < until,
    )
    joined = feedback.join(interactions, interactions.c.request_id == feedback.c.request_id)
    results: dict[str | None, AdapterWindow] = {}
    with engine.connect() as connection:
        for adapter in dict.fromkeys(adapters):
            served = _served(adapter)
            rows = connection.execute(
                select(
                    interactions.c.request_id,
                    interactions.c.status,
                    interactions.c.latency_ms,
                    interactions.c.ttft_ms,
                    interactions.c.metadata,
                    interactions.c.created_at,
                    interactions.c.user_id,
                    interactions.c.session_id,
                    interactions.c.key_name,
                ).where(in_window, served)
            ).all()
            events = connection.execute(
                select(feedback.c.request_id, feedback.c.type, feedback.c.outcome)
                .select_from(joined)
                .where(in_window, served, feedback.c.type.in_(_LOOKED_AT))
            ).all()
            counted = _bounded(list(rows), bound)
            if len(counted) < len(rows):
                kept = {r.request_id for r in counted}
                events = [e for e in events if e.request_id in kept]
            results[adapter] = window_numbers(adapter, counted, list(events))
    return results


@dataclass(frozen=True, slots=True)
class ArmAnswer:
    """One answer an arm gave in a window, with its reviewers' last verdict (None: unreviewed)
    and the signals its user gave (a review is none of them)."""

    request_id: str
    messages: list[dict[str, Any]]
    response: str
    passed: bool | None
    signals: frozenset[Signal] = frozenset()


def arm_answers(
    engine: Engine,
    business_line: str,
    adapter: str | None,
    since: datetime,
    until: datetime,
    bound: LookBound | None = None,
    *,
    arm: str | None = None,
) -> list[ArmAnswer]:
    """The answers ``adapter`` (None: the base model) gave on ``business_line`` in
    ``[since, until)``, successful ones only (within ``bound``, when given, as
    :func:`adapter_windows` counts them; with ``arm``, only those the gateway recorded on
    that arm, as an experiment's), each with its last review verdict."""
    interactions, feedback = interactions_table, feedback_table
    where = and_(
        interactions.c.business_line == business_line,
        interactions.c.created_at >= since,
        interactions.c.created_at < until,
        interactions.c.status == "ok",
        _served(adapter),
        *([interactions.c.arm == arm] if arm is not None else []),
    )
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                interactions.c.request_id,
                interactions.c.messages,
                interactions.c.response,
                interactions.c.created_at,
                interactions.c.user_id,
                interactions.c.session_id,
                interactions.c.key_name,
            ).where(where)
        ).all()
        rows = _bounded(list(rows), bound)
        # One pass over the window's feedback: each answer's last review verdict and its
        # user's signals.
        verdicts: dict[str, bool] = {}
        signals: defaultdict[str, set[Signal]] = defaultdict(set)
        for request_id, kind, outcome in connection.execute(
            select(feedback.c.request_id, feedback.c.type, feedback.c.outcome)
            .select_from(
                feedback.join(interactions, interactions.c.request_id == feedback.c.request_id)
            )
            .where(where, feedback.c.type.in_((REVIEW, *SIGNAL_TYPES)))
            .order_by(feedback.c.id)
        ):
            if kind == REVIEW:
                verdicts[request_id] = outcome == ReviewVerdict.PASS.value
            elif (signal := signal_of(kind, outcome)) is not None:
                signals[request_id].add(signal)
    return [
        ArmAnswer(
            r.request_id,
            list(r.messages or []),
            r.response,
            verdicts.get(r.request_id),
            frozenset(signals.get(r.request_id, ())),
        )
        for r in rows
    ]
