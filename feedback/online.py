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
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Engine, and_, func, or_, select

from feedback.events import FeedbackType, ReviewVerdict
from feedback.schema import feedback_table, interactions_table
from feedback.signals import ONLINE_SIGNALS, Signal
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


def adapter_windows(
    engine: Engine,
    business_line: str,
    adapters: Iterable[str | None],
    since: datetime,
    until: datetime,
) -> dict[str | None, AdapterWindow]:
    """Each adapter's numbers for requests made in ``[since, until)`` (None = the base model)."""
    wanted = list(dict.fromkeys(adapters))
    interactions = interactions_table
    feedback = feedback_table
    in_window = and_(
        interactions.c.business_line == business_line,
        interactions.c.created_at >= since,
        interactions.c.created_at < until,
    )
    joined = feedback.join(interactions, interactions.c.request_id == feedback.c.request_id)
    results: dict[str | None, AdapterWindow] = {}
    with engine.connect() as connection:
        for adapter in wanted:
            served = (
                interactions.c.adapter_name.is_(None)
                if adapter is None
                else interactions.c.adapter_name == adapter
            )
            rows = connection.execute(
                select(
                    interactions.c.request_id,
                    interactions.c.status,
                    interactions.c.latency_ms,
                    interactions.c.ttft_ms,
                    interactions.c.metadata,
                ).where(in_window, served)
            ).all()
            counts = connection.execute(
                select(feedback.c.type, func.count(func.distinct(feedback.c.request_id)))
                .select_from(joined)
                .where(in_window, served, feedback.c.type.in_(COUNTED_SIGNALS))
                .group_by(feedback.c.type)
            ).all()
            failed_task = and_(feedback.c.type == "task_outcome", feedback.c.outcome == "failure")

            def requests_with(condition: ColumnElement[bool], served: Any = served) -> set[str]:
                """This arm's requests in the window with feedback matching ``condition``."""
                return set(
                    connection.execute(
                        select(feedback.c.request_id)
                        .distinct()
                        .select_from(joined)
                        .where(in_window, served, condition)
                    ).scalars()
                )

            verdicts = dict(
                connection.execute(
                    select(feedback.c.outcome, func.count())
                    .select_from(joined)
                    .where(in_window, served, feedback.c.type == REVIEW)
                    .group_by(feedback.c.outcome)
                ).all()
            )
            cancelled = {r.request_id for r in rows if r.status == "cancelled"}
            abandoned = requests_with(feedback.c.type == Signal.ABANDON.value) | cancelled
            task_failures = requests_with(failed_task)
            dissatisfied = (
                requests_with(or_(feedback.c.type.in_(_NEGATIVE_TYPES), failed_task)) | cancelled
            )
            latencies = [r.latency_ms for r in rows if r.status == "ok" and r.latency_ms]
            results[adapter] = AdapterWindow(
                adapter=adapter,
                requests=len(rows),
                errors=sum(1 for r in rows if _model_side_error(r.status, r.metadata)),
                p99_latency_ms=observed_quantile(latencies, 0.99),
                latency_samples_ms=tuple(float(v) for v in latencies),
                signals=dict.fromkeys(COUNTED_SIGNALS, 0)
                | {k: int(n) for k, n in counts}
                | {
                    Signal.ABANDON.value: len(abandoned),
                    TASK_FAILURE: len(task_failures),
                    DISSATISFIED: len(dissatisfied),
                },
                answers=answer_stats(rows),
                reviews=sum(int(n) for n in verdicts.values()),
                review_failures=int(verdicts.get(ReviewVerdict.FAIL.value, 0)),
            )
    return results


@dataclass(frozen=True, slots=True)
class ArmAnswer:
    """One answer an arm gave in a window, with its reviewers' last verdict (None: unreviewed)."""

    request_id: str
    messages: list[dict[str, Any]]
    response: str
    passed: bool | None


def arm_answers(
    engine: Engine, business_line: str, adapter: str | None, since: datetime, until: datetime
) -> list[ArmAnswer]:
    """The answers ``adapter`` (None: the base model) gave on ``business_line`` in
    ``[since, until)``, successful ones only, each with its last review verdict."""
    interactions, feedback = interactions_table, feedback_table
    served = (
        interactions.c.adapter_name.is_(None)
        if adapter is None
        else interactions.c.adapter_name == adapter
    )
    where = and_(
        interactions.c.business_line == business_line,
        interactions.c.created_at >= since,
        interactions.c.created_at < until,
        interactions.c.status == "ok",
        served,
    )
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                interactions.c.request_id, interactions.c.messages, interactions.c.response
            ).where(where)
        ).all()
        verdicts: dict[str, bool] = {}
        for request_id, outcome in connection.execute(
            select(feedback.c.request_id, feedback.c.outcome)
            .select_from(
                feedback.join(interactions, interactions.c.request_id == feedback.c.request_id)
            )
            .where(where, feedback.c.type == REVIEW)
            .order_by(feedback.c.id)
        ):
            verdicts[request_id] = outcome == ReviewVerdict.PASS.value
    return [
        ArmAnswer(r.request_id, list(r.messages or []), r.response, verdicts.get(r.request_id))
        for r in rows
    ]
