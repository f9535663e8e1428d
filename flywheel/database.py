"""The one database every package keeps its tables in (PostgreSQL, or SQLite embedded).

Each package declares its own tables (``feedback.schema``, ``registry.tables``,
``dashboard.tables``) on :class:`Base`, whose one ``MetaData`` the one migration history
(``feedback/migrations``) runs and is compared against; ``composition.tables`` imports
every declaration, so a process that holds the store sees the database whole. Here are the
parts they share: the base, the column types both backends read alike, and the one
promise another package's table can make to the feedback store's erasures.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import JSON, BigInteger, ColumnElement, DateTime, Integer, Table, func, true
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

ID_LENGTH = 128
BUSINESS_LINE_LENGTH = 64
# An API key's name (gateway.keys.ApiKey.name), never its secret.
KEY_NAME_LENGTH = 64

# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias).
PrimaryKey = BigInteger().with_variant(Integer(), "sqlite")
JsonDocument = JSON().with_variant(JSONB(), "postgresql")
NOW = func.current_timestamp()

# ``Table.info`` key: the table holds running counts over stored requests that only ever
# add, so a deletion of requests (a forgotten user, retention's delete) drops the rows that
# may have counted them and the owner counts again on the next read. Its value is True, or
# a scope: which rows may count a business line's requests created before a time.
RECOUNTED_AFTER_ERASURE = "recounted_after_erasure"
CountedScope = Callable[[Table, str, datetime], ColumnElement[bool]]


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite keeps no offsets)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; convert to UTC first")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of every package's tables: one ``MetaData``, one migration history."""


def recounted_after_erasure() -> list[Table]:
    """The declared tables whose counts erasing stored requests drops, wholly (a forgotten
    user) or in their scope (:func:`recounted_rows`; :data:`RECOUNTED_AFTER_ERASURE`)."""
    return [
        table for table in Base.metadata.sorted_tables if table.info.get(RECOUNTED_AFTER_ERASURE)
    ]


def recounted_rows(table: Table, business_line: str, before: datetime) -> ColumnElement[bool]:
    """The rows of a :func:`recounted_after_erasure` table that may count a request of
    ``business_line`` created before ``before`` (every row where its owner gave no scope)."""
    scope: CountedScope | bool = table.info[RECOUNTED_AFTER_ERASURE]
    return scope(table, business_line, before) if callable(scope) else true()
