"""Raw-text retention: a line's prompts and answers older than its recipe's ``raw_days``
keep only their scrubbed text, or are deleted.

Scrubbing rewrites the raw columns (an interaction's messages and response, an edit's
text, a shadow answer) with the scrubber's output and stamps the row's metadata with
``scrubbed_at``, so the next night skips it; rows already stamped are never read again,
which keeps the task idempotent and its cost to the rows that crossed the line since.
Deleting removes old interactions with their feedback and shadow answers; the hourly
rollup keeps its counts (counts name nobody), datasets keep their scrubbed examples, and
an A/B experiment's numbers are those of the requests still stored (the tallies of the
line's experiments that started before the cutoff are counted again).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine, Table, delete, func, select, update

from feedback.schema import (
    feedback_table,
    interactions_table,
    require_declared,
    rows_about_requests,
    shadow_outputs_table,
)
from flywheel.database import recounted_after_erasure, recounted_rows

SCRUBBED_AT = "scrubbed_at"
# Rows scrubbed per transaction: a long night is resumable, a lock is short.
BATCH = 256

ScrubRecords = Callable[[list[dict[str, Any]], Sequence[str]], list[dict[str, Any]]]


class RetentionPolicy(BaseModel):
    """How long a line keeps raw prompts and answers in the store (``flywheel retention``).

    Older rows keep only their scrubbed text (``scrub``: PII replaced by placeholders,
    the row and its feedback kept for counts and lineage) or go entirely (``delete``: the
    interaction with its feedback and shadow answers; datasets keep their scrubbed
    examples, whose lineage then names requests no longer stored). Not part of the
    recipe's hash: it changes nothing about training.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    raw_days: float = Field(
        default=30, gt=0, le=3_650, description="Days raw text is kept before the action."
    )
    action: Literal["scrub", "delete"] = "scrub"


def retention_cutoff(policy: RetentionPolicy, now: datetime) -> datetime:
    """Rows created before this keep no raw text."""
    return now - timedelta(days=policy.raw_days)


@dataclass(slots=True)
class RetentionReport:
    """What one line's retention run did (or, dry, would do)."""

    business_line: str
    action: str
    cutoff: datetime
    dry_run: bool = False
    interactions: int = 0
    feedback_events: int = 0
    shadow_outputs: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (for the flow's report)."""
        return {
            "business_line": self.business_line,
            "action": self.action,
            "cutoff": self.cutoff.isoformat(),
            "dry_run": self.dry_run,
            "interactions": self.interactions,
            "feedback_events": self.feedback_events,
            "shadow_outputs": self.shadow_outputs,
        }


def _stamped(
    metadata: dict[str, Any] | None, when: datetime, pii: dict[str, int]
) -> dict[str, Any]:
    return {**(metadata or {}), SCRUBBED_AT: when.isoformat(), "retention_pii": pii}


def _unscrubbed(table: Table, line: str, cutoff: datetime) -> Any:
    metadata = table.c["metadata"]
    # Rows stamped by an earlier night are skipped (the stamp lives in the metadata JSON).
    return (
        (table.c.business_line == line)
        & (table.c.created_at < cutoff)
        & metadata[SCRUBBED_AT].as_string().is_(None)
    )


def _scrub_table(
    engine: Engine,
    table: Table,
    fields: tuple[str, ...],
    condition: Any,
    scrub: ScrubRecords,
    now: datetime,
) -> int:
    """Scrub ``fields`` of every row matching ``condition``, a batch per transaction."""
    columns = [table.c.id, table.c["metadata"], *(table.c[f] for f in fields)]
    done = last_id = 0
    while True:
        with engine.begin() as connection:
            # Past the last id: each batch moves on even if a stamp were not seen by the filter.
            query = select(*columns).where(condition, table.c.id > last_id)
            rows = connection.execute(query.order_by(table.c.id).limit(BATCH)).all()
            if not rows:
                return done
            last_id = rows[-1].id
            records = [{f: getattr(row, f) for f in fields} for row in rows]
            for row, scrubbed in zip(rows, scrub(records, fields), strict=True):
                values = {f: scrubbed[f] for f in fields}
                values["metadata"] = _stamped(
                    row._mapping["metadata"], now, scrubbed.get("pii", {})
                )
                connection.execute(update(table).where(table.c.id == row.id).values(values))
            done += len(rows)


def _count(engine: Engine, table: Table, condition: Any) -> int:
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).where(condition)).scalar_one())


def apply_retention(
    engine: Engine,
    business_line: str,
    policy: RetentionPolicy,
    scrub: ScrubRecords,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
) -> RetentionReport:
    """Scrub or delete ``business_line``'s raw text older than ``policy.raw_days``.

    ``scrub`` is a batch scrubber over record fields (``Scrubber.scrub_records``). A dry
    run counts the rows it would change and changes nothing.
    """
    now = now or datetime.now(UTC)
    cutoff = retention_cutoff(policy, now)
    report = RetentionReport(business_line, policy.action, cutoff, dry_run)
    i, f, s = interactions_table, feedback_table, shadow_outputs_table
    if policy.action == "delete":
        old = (i.c.business_line == business_line) & (i.c.created_at < cutoff)
        owned = select(i.c.request_id).where(old)
        if dry_run:
            report.interactions = _count(engine, i, old)
            report.feedback_events = _count(engine, f, f.c.request_id.in_(owned))
            report.shadow_outputs = _count(engine, s, s.c.request_id.in_(owned))
            return report
        with engine.begin() as connection:
            require_declared(connection)
            report.shadow_outputs = connection.execute(
                delete(s).where(s.c.request_id.in_(owned))
            ).rowcount
            report.feedback_events = connection.execute(
                delete(f).where(f.c.request_id.in_(owned))
            ).rowcount
            for table in rows_about_requests():
                connection.execute(delete(table).where(table.c.request_id.in_(owned)))
            report.interactions = connection.execute(delete(i).where(old)).rowcount
            if report.interactions:
                # Running counts only ever add (an experiment's tally): whatever may have
                # counted a deleted request counts again on its next read.
                for table in recounted_after_erasure():
                    counted = recounted_rows(table, business_line, cutoff)
                    connection.execute(delete(table).where(counted))
        return report
    targets = (
        (i, ("messages", "response"), _unscrubbed(i, business_line, cutoff)),
        (f, ("edited_text",), _unscrubbed(f, business_line, cutoff) & f.c.edited_text.is_not(None)),
        (s, ("response",), _unscrubbed(s, business_line, cutoff)),
    )
    counts = []
    for table, fields, condition in targets:
        if dry_run:
            counts.append(_count(engine, table, condition))
        else:
            counts.append(_scrub_table(engine, table, fields, condition, scrub, now))
    report.interactions, report.feedback_events, report.shadow_outputs = counts
    return report
