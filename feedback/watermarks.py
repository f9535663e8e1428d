"""How far each business line's nightly run has consumed the store.

One run per line at a time: a run holds a lease on the line's row
(``locked_by``/``locked_until``), renewed while it works; a crashed run's lease
simply expires. Taking it is one conditional UPDATE, atomic on PostgreSQL and
SQLite alike, so every scheduler, worker and command agrees.

A run takes the window ``[watermark, until)``. ``until`` is fixed when the
line's run first starts and kept as ``pending_until`` until the run finishes,
so a run that crashed and is started again sees exactly the same window (and
rebuilds the same dataset, whose hash lets every later stage be reused). The
watermark moves to ``until`` only when the line's run finishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from feedback.schema import watermarks_table


@dataclass(frozen=True, slots=True)
class LineWindow:
    """The slice of the store one nightly run of a line works on."""

    business_line: str
    since: datetime | None
    until: datetime
    resumed: bool


class WatermarkStore:
    """Reads and moves the per-line watermarks."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def open_window(self, business_line: str, now: datetime) -> LineWindow:
        """The run's window: the pending one of an unfinished run, or ``[watermark, now)``."""
        table = watermarks_table
        with self.engine.begin() as connection:
            query = select(table).where(table.c.business_line == business_line)
            if connection.dialect.name == "postgresql":
                query = query.with_for_update()
            row = connection.execute(query).first()
            if row is None:
                connection.execute(
                    insert(table).values(
                        business_line=business_line,
                        watermark=None,
                        pending_until=now,
                        updated_at=now,
                    )
                )
                return LineWindow(business_line, None, now, resumed=False)
            if row.pending_until is not None:
                return LineWindow(business_line, row.watermark, row.pending_until, resumed=True)
            connection.execute(
                update(table)
                .where(table.c.business_line == business_line)
                .values(pending_until=now, updated_at=now)
            )
            return LineWindow(business_line, row.watermark, now, resumed=False)

    def close_window(
        self, window: LineWindow, *, run_id: str | None, outcome: str, now: datetime
    ) -> None:
        """The line's run finished: the watermark moves to the window's end."""
        table = watermarks_table
        with self.engine.begin() as connection:
            connection.execute(
                update(table)
                .where(table.c.business_line == window.business_line)
                .values(
                    watermark=window.until,
                    pending_until=None,
                    run_id=run_id,
                    outcome=outcome[:2000],
                    updated_at=now,
                )
            )

    def release_window(self, window: LineWindow, *, outcome: str, now: datetime) -> None:
        """The run ended without consuming its window (too few examples): the watermark
        stays, the next run takes a wider window."""
        table = watermarks_table
        with self.engine.begin() as connection:
            connection.execute(
                update(table)
                .where(table.c.business_line == window.business_line)
                .values(pending_until=None, outcome=outcome[:2000], updated_at=now)
            )

    def acquire(self, business_line: str, owner: str, ttl_s: float, now: datetime) -> bool:
        """Take the line's lease for ``owner`` unless another live run holds it."""
        table = watermarks_table
        with self.engine.begin() as connection:
            taken = connection.execute(
                update(table)
                .where(
                    table.c.business_line == business_line,
                    or_(
                        table.c.locked_until.is_(None),
                        table.c.locked_until < now,
                        table.c.locked_by == owner,
                    ),
                )
                .values(locked_by=owner, locked_until=now + timedelta(seconds=ttl_s))
            ).rowcount
        if taken:
            return True
        try:
            with self.engine.begin() as connection:
                connection.execute(
                    insert(table).values(
                        business_line=business_line,
                        locked_by=owner,
                        locked_until=now + timedelta(seconds=ttl_s),
                        updated_at=now,
                    )
                )
        except IntegrityError:
            return False  # the row exists, so the UPDATE above found it held
        return True

    def renew(self, business_line: str, owner: str, ttl_s: float, now: datetime) -> bool:
        """Extend ``owner``'s lease; False when it was lost (expired and taken)."""
        table = watermarks_table
        with self.engine.begin() as connection:
            return bool(
                connection.execute(
                    update(table)
                    .where(table.c.business_line == business_line, table.c.locked_by == owner)
                    .values(locked_until=now + timedelta(seconds=ttl_s))
                ).rowcount
            )

    def release(self, business_line: str, owner: str) -> None:
        """Give the lease back (a no-op when ``owner`` no longer holds it)."""
        table = watermarks_table
        with self.engine.begin() as connection:
            connection.execute(
                update(table)
                .where(table.c.business_line == business_line, table.c.locked_by == owner)
                .values(locked_by=None, locked_until=None)
            )

    def watermarks(self) -> dict[str, dict[str, object]]:
        """Every line's watermark, pending window and last outcome."""
        with self.engine.connect() as connection:
            rows = connection.execute(select(watermarks_table)).all()
        return {
            row.business_line: {
                "watermark": row.watermark,
                "pending_until": row.pending_until,
                "run_id": row.run_id,
                "outcome": row.outcome,
                "updated_at": row.updated_at,
            }
            for row in rows
        }
