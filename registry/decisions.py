"""The log of rollout decisions (canary looks, champion watch), kept in the feedback store.

Every look of the canary flow is one row: the line, the adapter judged, its
share, the look number at that share, the action, the reasons and the numbers
the decision rested on. The page, ``flywheel canary status`` and the loop read
it back from here.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, func, insert, select

from registry.tables import canary_decisions_table as decisions

if TYPE_CHECKING:
    from feedback.store import FeedbackStore


def record_decision(
    engine: Engine,
    *,
    business_line: str,
    adapter: str,
    fraction: float,
    look: int,
    action: str,
    reasons: str,
    numbers: dict[str, Any],
    actor: str,
    when: datetime,
) -> None:
    """Append one decision."""
    with engine.begin() as connection:
        connection.execute(
            insert(decisions).values(
                business_line=business_line,
                adapter=adapter,
                canary_fraction=fraction,
                look=look,
                action=action,
                reasons=reasons,
                numbers=numbers,
                actor=actor,
                created_at=when,
            )
        )


def looks_since(engine: Engine, business_line: str, adapter: str, since: datetime) -> int:
    """Decisions on ``adapter`` after ``since`` (a decision made at a change belongs before)."""
    query = select(func.count()).where(
        decisions.c.business_line == business_line,
        decisions.c.adapter == adapter,
        decisions.c.created_at > since,
    )
    with engine.connect() as connection:
        return int(connection.execute(query).scalar_one())


def latest_decisions(engine: Engine, business_line: str, limit: int = 20) -> list[dict[str, Any]]:
    """The line's latest decisions with their numbers, newest first."""
    query = (
        select(decisions)
        .where(decisions.c.business_line == business_line)
        .order_by(decisions.c.id.desc())
        .limit(limit)
    )
    with engine.connect() as connection:
        return [dict(row._mapping) for row in connection.execute(query)]


def canary_decisions(store: FeedbackStore, line: str, limit: int = 20) -> list[dict[str, Any]]:
    """The line's latest canary decisions, newest first."""
    return latest_decisions(store.engine, line, limit)
