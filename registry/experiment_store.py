"""A/B experiments in the feedback store: their records, their looks, and each arm's
counts on every metric of ``registry.experiments`` (one query per arm).

An arm's requests are the line's interactions the gateway labelled with that arm
(``experiment_a`` / ``experiment_b``) while the experiment ran; their feedback counts
whenever it arrived (task outcomes come late).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    and_,
    case,
    func,
    insert,
    or_,
    select,
    update,
)

from feedback.contributions import Answer, LookBound, counted_requests
from feedback.schema import feedback_table, interactions_table
from registry.experiments import (
    FLAGS,
    METRICS,
    SATISFACTION,
    ArmCount,
    ArmLabel,
    ExperimentLook,
    ExperimentPolicy,
    Verdict,
    flag_mask,
    judge_experiment,
    metric_counts,
)
from registry.tables import experiment_looks_table as looks_table
from registry.tables import experiments_table as experiments

RUNNING = "running"
STOPPED = "stopped"
PROMOTED = "promoted"
FAILED = "failed"
ARM_LABELS: dict[ArmLabel, str] = {"a": "experiment_a", "b": "experiment_b"}


@dataclass(frozen=True, slots=True)
class ExperimentRecord:
    """One experiment as stored."""

    id: int
    business_line: str
    arm_a: str | None
    arm_b: str | None
    share: float
    metric: str
    policy: ExperimentPolicy
    status: str
    winner: ArmLabel | None
    decided_look: int | None
    decided_at: datetime | None
    started_at: datetime
    ended_at: datetime | None
    actor: str
    reason: str | None
    ended_reason: str | None
    mlflow_run_id: str | None

    def arm(self, label: ArmLabel) -> str | None:
        """The adapter on arm ``label`` (None: the base model)."""
        return self.arm_a if label == "a" else self.arm_b

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``flywheel experiment status --json``, the page)."""
        return {
            "id": self.id,
            "business_line": self.business_line,
            "arm_a": self.arm_a or "base",
            "arm_b": self.arm_b or "base",
            "share": self.share,
            "metric": self.metric,
            **self.policy.model_dump(),
            "status": self.status,
            "winner": self.winner,
            "winner_adapter": (self.arm(self.winner) or "base") if self.winner else None,
            "decided_look": self.decided_look,
            "decided_at": self.decided_at.isoformat() if self.decided_at else None,
            "started_at": self.started_at.isoformat(),
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "actor": self.actor,
            "reason": self.reason,
            "ended_reason": self.ended_reason,
            "mlflow_run_id": self.mlflow_run_id,
        }


def _record(row: Any) -> ExperimentRecord:
    return ExperimentRecord(
        id=int(row.id),
        business_line=row.business_line,
        arm_a=row.arm_a,
        arm_b=row.arm_b,
        share=float(row.share),
        metric=row.metric,
        policy=ExperimentPolicy(
            alpha=row.alpha, min_samples=row.min_samples, mixture_scale=row.mixture_scale
        ),
        status=row.status,
        winner=row.winner,
        decided_look=row.decided_look,
        decided_at=row.decided_at,
        started_at=row.started_at,
        ended_at=row.ended_at,
        actor=row.actor,
        reason=row.reason,
        ended_reason=row.ended_reason,
        mlflow_run_id=row.mlflow_run_id,
    )


def create_experiment(
    engine: Engine,
    *,
    business_line: str,
    arm_a: str | None,
    arm_b: str | None,
    share: float,
    metric: str,
    policy: ExperimentPolicy,
    actor: str,
    reason: str | None,
    when: datetime,
) -> int:
    """Insert a running experiment; its id."""
    with engine.begin() as connection:
        result = connection.execute(
            insert(experiments)
            .values(
                business_line=business_line,
                arm_a=arm_a,
                arm_b=arm_b,
                share=share,
                metric=metric,
                alpha=policy.alpha,
                min_samples=policy.min_samples,
                mixture_scale=policy.mixture_scale,
                status=RUNNING,
                started_at=when,
                actor=actor,
                reason=reason,
            )
            .returning(experiments.c.id)
        )
        return int(result.scalar_one())


def get_experiment(engine: Engine, experiment_id: int) -> ExperimentRecord | None:
    """The experiment with ``experiment_id``, if any."""
    with engine.connect() as connection:
        row = connection.execute(
            select(experiments).where(experiments.c.id == experiment_id)
        ).first()
    return _record(row) if row is not None else None


def list_experiments(
    engine: Engine, business_line: str | None = None, *, limit: int = 50
) -> list[ExperimentRecord]:
    """Experiments, newest first (of one line, or of every line)."""
    query = select(experiments).order_by(experiments.c.id.desc()).limit(limit)
    if business_line is not None:
        query = query.where(experiments.c.business_line == business_line)
    with engine.connect() as connection:
        return [_record(row) for row in connection.execute(query)]


def live_experiment(engine: Engine, business_line: str) -> ExperimentRecord | None:
    """The line's running experiment, if any."""
    query = (
        select(experiments)
        .where(experiments.c.business_line == business_line, experiments.c.status == RUNNING)
        .order_by(experiments.c.id.desc())
        .limit(1)
    )
    with engine.connect() as connection:
        row = connection.execute(query).first()
    return _record(row) if row is not None else None


def set_run_id(engine: Engine, experiment_id: int, run_id: str) -> None:
    """Remember the experiment's MLflow run."""
    with engine.begin() as connection:
        connection.execute(
            update(experiments)
            .where(experiments.c.id == experiment_id)
            .values(mlflow_run_id=run_id)
        )


def decide(engine: Engine, experiment_id: int, winner: ArmLabel, look: int, when: datetime) -> bool:
    """Keep the first decision (compare-and-set on an undecided experiment); True when this
    call made it."""
    with engine.begin() as connection:
        result = connection.execute(
            update(experiments)
            .where(experiments.c.id == experiment_id, experiments.c.winner.is_(None))
            .values(winner=winner, decided_look=look, decided_at=when)
        )
        return bool(result.rowcount)


def end_experiment(
    engine: Engine, experiment_id: int, status: str, reason: str | None, when: datetime
) -> None:
    """Mark the experiment stopped, promoted or failed, with why."""
    with engine.begin() as connection:
        connection.execute(
            update(experiments)
            .where(experiments.c.id == experiment_id)
            .values(status=status, ended_reason=reason, ended_at=when)
        )


def record_look(
    engine: Engine,
    experiment_id: int,
    *,
    verdict: str,
    numbers: dict[str, Any],
    actor: str,
    when: datetime,
) -> int:
    """Append a look (numbered after the last one); its number."""
    with engine.begin() as connection:
        last = connection.execute(
            select(func.coalesce(func.max(looks_table.c.look), 0)).where(
                looks_table.c.experiment_id == experiment_id
            )
        ).scalar_one()
        look = int(last) + 1
        connection.execute(
            insert(looks_table).values(
                experiment_id=experiment_id,
                look=look,
                verdict=verdict,
                numbers=numbers,
                actor=actor,
                created_at=when,
            )
        )
    return look


def experiment_looks(engine: Engine, experiment_id: int) -> list[dict[str, Any]]:
    """The experiment's looks, oldest first."""
    query = (
        select(looks_table)
        .where(looks_table.c.experiment_id == experiment_id)
        .order_by(looks_table.c.look)
    )
    with engine.connect() as connection:
        return [dict(row._mapping) for row in connection.execute(query)]


def recorded_look(engine: Engine, record: ExperimentRecord) -> ExperimentLook:
    """The experiment's latest recorded look, rebuilt from its numbers (waiting, with no
    data, before the first)."""
    looks = experiment_looks(engine, record.id)
    n: dict[str, Any] = looks[-1]["numbers"] if looks else {}

    def arm(label: str) -> ArmCount:
        rate = n.get(f"{label}_rate")
        return ArmCount(
            int(n.get(f"{label}_samples") or 0),
            int(n.get(f"{label}_hits") or 0),
            estimate=rate if record.metric == SATISFACTION else None,
            reviews=n.get(f"{label}_reviews"),
        )

    return ExperimentLook(
        metric=record.metric,
        a=arm("a"),
        b=arm("b"),
        effect=n.get("effect"),
        lower=float(n.get("lower", -1.0)),
        upper=float(n.get("upper", 1.0)),
        p_value=float(n.get("p_value", 1.0)),
        verdict=Verdict(looks[-1]["verdict"]) if looks else Verdict.WAITING,
        reasons=tuple(n.get("reasons") or ("not looked at yet",)),
        alpha=float(n.get("alpha", record.policy.alpha)),
        min_samples=int(n.get("min_samples", record.policy.min_samples)),
    )


def flag_conditions(feedback_upto: int | None = None) -> dict[str, ColumnElement[bool]]:
    """Each of :data:`registry.experiments.FLAGS` as a condition on one row of an
    interaction outer-joined to its feedback; with ``feedback_upto``, only feedback events
    with ids up to it count (what a tally saw at that watermark)."""
    feedback = feedback_table
    outcome = feedback.c.outcome

    def typed(kind: str) -> ColumnElement[bool]:
        if feedback_upto is None:
            return feedback.c.type == kind
        return and_(feedback.c.id <= feedback_upto, feedback.c.type == kind)

    conditions = {
        "thumbs_up": typed("thumbs_up"),
        "thumbs_down": typed("thumbs_down"),
        "regenerate": typed("regenerate"),
        "edit": typed("edit"),
        # A request the client cancelled before its answer ended is abandoned too.
        "abandon": or_(typed("abandon"), interactions_table.c.status == "cancelled"),
        "task_success": and_(typed("task_outcome"), outcome == "success"),
        "task_failure": and_(typed("task_outcome"), outcome == "failure"),
        "review_pass": and_(typed("review"), outcome == "pass"),
        "review_fail": and_(typed("review"), outcome == "fail"),
    }
    assert tuple(conditions) == FLAGS
    return conditions


def arm_counts(
    engine: Engine,
    business_line: str,
    arm: ArmLabel,
    since: datetime,
    until: datetime,
    bound: LookBound | None = None,
) -> dict[str, ArmCount]:
    """The arm's samples and hits on every metric, over its requests in ``[since, until)``
    (with ``bound``, only those a look counts: each user's first few, each key within its
    share, ``feedback.contributions``)."""
    interactions, feedback = interactions_table, feedback_table
    flags = [
        func.max(case((condition, 1), else_=0)).label(name)
        for name, condition in flag_conditions().items()
    ]
    who = (
        interactions.c.created_at,
        interactions.c.user_id,
        interactions.c.session_id,
        interactions.c.key_name,
    )
    per_request = (
        select(interactions.c.request_id, *(who if bound is not None else ()), *flags)
        .select_from(
            interactions.outerjoin(feedback, feedback.c.request_id == interactions.c.request_id)
        )
        .where(
            interactions.c.business_line == business_line,
            interactions.c.arm == ARM_LABELS[arm],
            interactions.c.created_at >= since,
            interactions.c.created_at < until,
        )
        .group_by(interactions.c.request_id, *(who if bound is not None else ()))
        .subquery()
    )
    if bound is not None:
        return _bounded_counts(engine, per_request, bound)

    def any_of(names: tuple[str, ...]) -> ColumnElement[bool]:
        return or_(*(per_request.c[name] == 1 for name in names))

    def counted(condition: ColumnElement[bool] | None) -> Any:
        if condition is None:
            return func.count()
        return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)

    columns: list[Any] = []
    for metric in METRICS.values():
        among = any_of(metric.among) if metric.among else None
        hit_parts = [any_of(metric.hit_any)]
        if metric.hit_none:
            hit_parts.append(~any_of(metric.hit_none))
        if among is not None:
            hit_parts.append(among)
        columns += [counted(among), counted(and_(*hit_parts))]
    with engine.connect() as connection:
        row = connection.execute(select(*columns).select_from(per_request)).one()
    return {name: ArmCount(int(row[2 * i]), int(row[2 * i + 1])) for i, name in enumerate(METRICS)}


def _bounded_counts(engine: Engine, per_request: Any, bound: LookBound) -> dict[str, ArmCount]:
    """Every metric over the requests of ``per_request`` (one row per request: who sent it
    and its flags) that a look counts under ``bound``."""
    with engine.connect() as connection:
        rows = connection.execute(select(per_request)).all()
    counted = counted_requests(
        (Answer(r.request_id, r.created_at, r.user_id, r.session_id, r.key_name) for r in rows),
        bound,
    )
    masks = Counter(
        flag_mask(flag for flag in FLAGS if getattr(row, flag))
        for row in rows
        if row.request_id in counted
    )
    return metric_counts(masks)


def current_look(
    engine: Engine, record: ExperimentRecord, until: datetime, bound: LookBound | None = None
) -> ExperimentLook:
    """The verdict on ``record`` from each arm's requests since it started (to its end, or
    ``until``), without recording it; with ``bound``, on the requests a look counts. An
    experiment on satisfaction needs the satisfaction model to look again
    (``composition.experiments``): here it is its latest recorded look."""
    if record.metric == SATISFACTION:
        return recorded_look(engine, record)
    end = record.ended_at or until
    a = arm_counts(engine, record.business_line, "a", record.started_at, end, bound)
    b = arm_counts(engine, record.business_line, "b", record.started_at, end, bound)
    metric = METRICS[record.metric]
    return judge_experiment(metric, a[metric.name], b[metric.name], record.policy)
