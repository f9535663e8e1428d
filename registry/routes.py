"""The routing tables in the feedback store: read by every gateway replica, written through
the rollout's one door (``registry.rollout``), which :meth:`RouteStore.change` serves.

Each change bumps the line's revision and appends a row to ``route_changes`` in
the same transaction, so the history says who moved traffic, when and why.
Writers lock the line's row (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite
serialises writers itself) so two concurrent changes cannot lose one another.

The product writes a table only through ``registry.rollout`` (whose transitions
load, probe, move MLflow's aliases and unload alongside); ``tests/unit/test_layers.py``
holds every other package to that, and holds :class:`RouteStore` to its one write.
Tests arrange tables by hand with ``tests/routing.py``, itself a caller of
:meth:`RouteStore.change`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, Engine, insert, select, update

from flywheel.errors import UsageError
from registry.routing import ExperimentSplit, RoutingTable
from registry.tables import route_changes_table, routes_table


@dataclass(frozen=True, slots=True)
class RouteSnapshot:
    """Every line's table as stored, with the revision each is at."""

    tables: dict[str, RoutingTable]
    revisions: dict[str, int]

    def table(self, business_line: str) -> RoutingTable:
        """The line's table; a line nobody routed yet serves the base model."""
        return self.tables.get(business_line) or RoutingTable(business_line=business_line)


@dataclass(frozen=True, slots=True)
class RouteChangeRecord:
    """One entry of a line's routing history."""

    business_line: str
    revision: int
    action: str
    table: RoutingTable
    actor: str
    reason: str | None
    created_at: datetime


def _table_of(row: Any) -> RoutingTable:
    return RoutingTable(
        business_line=row.business_line,
        champion=row.champion,
        canary=row.canary,
        canary_fraction=row.canary_fraction,
        previous=row.previous,
        shadow=row.shadow,
        shadow_fraction=row.shadow_fraction or 0.0,
        replicas=tuple(row.replicas) if row.replicas else None,
        experiment=ExperimentSplit.model_validate(row.experiment) if row.experiment else None,
    )


def _columns(table: RoutingTable) -> dict[str, Any]:
    """The stored columns of ``table`` (both in ``routes`` and in ``route_changes``)."""
    return {
        "champion": table.champion,
        "canary": table.canary,
        "canary_fraction": table.canary_fraction,
        "previous": table.previous,
        "shadow": table.shadow,
        "shadow_fraction": table.shadow_fraction,
        "replicas": list(table.replicas) if table.replicas is not None else None,
        "experiment": table.experiment.model_dump() if table.experiment is not None else None,
    }


class RouteStore:
    """Reads and changes the routing tables kept in the feedback store."""

    def __init__(self, engine: Engine, clock: Callable[[], datetime] | None = None) -> None:
        self.engine = engine
        self._clock = clock or (lambda: datetime.now(UTC))

    def snapshot(self) -> RouteSnapshot:
        """Every stored table (one small query: the gateway polls this)."""
        with self.engine.connect() as connection:
            rows = connection.execute(select(routes_table)).all()
        return RouteSnapshot(
            tables={row.business_line: _table_of(row) for row in rows},
            revisions={row.business_line: row.revision for row in rows},
        )

    def table(self, business_line: str) -> RoutingTable:
        """One line's table (the base model for a line never routed)."""
        return self.snapshot().table(business_line)

    def change(
        self,
        business_line: str,
        edit: Callable[[RoutingTable], RoutingTable],
        *,
        action: str,
        actor: str,
        reason: str | None = None,
    ) -> RoutingTable:
        """Apply ``edit`` to the line's table atomically and record the change (the one
        write the rollout's door makes)."""
        with self.engine.begin() as connection:
            current, revision = self._locked(connection, business_line)
            try:
                changed = edit(current).checked()
            except ValidationError as exc:
                reason = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
                raise UsageError(f"cannot {action} on {business_line}: {reason}") from None
            now = self._clock()
            values = {
                **_columns(changed),
                "revision": revision + 1,
                "updated_at": now,
            }
            if revision == 0:
                connection.execute(
                    insert(routes_table).values(business_line=business_line, **values)
                )
            else:
                connection.execute(
                    update(routes_table)
                    .where(routes_table.c.business_line == business_line)
                    .values(**values)
                )
            connection.execute(
                insert(route_changes_table).values(
                    business_line=business_line,
                    revision=revision + 1,
                    action=action,
                    **_columns(changed),
                    actor=actor,
                    reason=reason,
                    created_at=now,
                )
            )
        return changed

    def _locked(self, connection: Connection, business_line: str) -> tuple[RoutingTable, int]:
        query = select(routes_table).where(routes_table.c.business_line == business_line)
        if connection.dialect.name == "postgresql":
            query = query.with_for_update()
        row = connection.execute(query).first()
        if row is None:
            return RoutingTable(business_line=business_line), 0
        return _table_of(row), int(row.revision)

    def history(self, business_line: str, *, limit: int = 20) -> list[RouteChangeRecord]:
        """The line's latest changes, newest first."""
        query = (
            select(route_changes_table)
            .where(route_changes_table.c.business_line == business_line)
            .order_by(route_changes_table.c.id.desc())
            .limit(limit)
        )
        with self.engine.connect() as connection:
            rows = connection.execute(query).all()
        return [
            RouteChangeRecord(
                business_line=row.business_line,
                revision=row.revision,
                action=row.action,
                table=_table_of(row),
                actor=row.actor,
                reason=row.reason,
                created_at=row.created_at,
            )
            for row in rows
        ]
