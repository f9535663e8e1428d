"""The feedback package's tables (SQLAlchemy 2): interactions, feedback events, quarantine,
shadow answers, watermarks, the hourly rollup, forgotten users and the training history.

They sit on the one database's base (:mod:`flywheel.database`) beside the registry's
(``registry.tables``) and the feedback page's (``dashboard.tables``); the one migration
history in ``feedback/migrations`` creates them all, and a test compares the two so they
cannot drift. Erasing a user or old requests reaches the other packages' rows through
their declarations, never their modules (they sit above this one).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Connection,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    inspect,
)
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.database import (
    BUSINESS_LINE_LENGTH,
    ID_LENGTH,
    KEY_NAME_LENGTH,
    NOW,
    Base,
    JsonDocument,
    PrimaryKey,
    UTCDateTime,
)


class Interaction(Base):
    """One request to the LLM service and the answer it got."""

    __tablename__ = "interactions"

    id: Mapped[int] = mapped_column(PrimaryKey, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(ID_LENGTH), unique=True)
    session_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    user_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    # The name of the API key the request came with (NULL: imported, or logged before keys
    # were recorded): contributions are capped per key as well as per user.
    key_name: Mapped[str | None] = mapped_column(String(KEY_NAME_LENGTH))
    business_line: Mapped[str] = mapped_column(String(BUSINESS_LINE_LENGTH))
    adapter_name: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    adapter_version: Mapped[int | None] = mapped_column(Integer)
    base_model: Mapped[str] = mapped_column(String(256))
    arm: Mapped[str | None] = mapped_column(String(16))
    messages: Mapped[list[dict[str, Any]]] = mapped_column(JsonDocument)
    response: Mapped[str] = mapped_column(Text)
    prompt_hash: Mapped[str] = mapped_column(String(64))
    latency_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16))
    source: Mapped[str | None] = mapped_column(String(32))
    meta: Mapped[dict[str, Any] | None] = mapped_column("metadata", JsonDocument, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ingested_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=NOW)

    __table_args__ = (
        # id last: pages ordered by (created_at, id) read the index in order and stop
        # at the page size, whatever the planner's statistics say (no sort of the line).
        Index("ix_interactions_line_created", "business_line", "created_at", "id"),
        Index("ix_interactions_session_prompt", "session_id", "prompt_hash"),
        Index("ix_interactions_user", "user_id"),
        # The feedback page's samples filtered by adapter version, newest first.
        Index(
            "ix_interactions_line_adapter_created",
            "business_line",
            "adapter_name",
            "created_at",
            "id",
        ),
    )


class FeedbackEvent(Base):
    """A signal about one interaction: thumbs, regenerate, edit, abandon, outcome, rank."""

    __tablename__ = "feedback_events"

    id: Mapped[int] = mapped_column(PrimaryKey, primary_key=True, autoincrement=True)
    idempotency_key: Mapped[str] = mapped_column(String(256), unique=True)
    request_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("interactions.request_id", ondelete="CASCADE")
    )
    type: Mapped[str] = mapped_column(String(16))
    business_line: Mapped[str] = mapped_column(String(BUSINESS_LINE_LENGTH))
    user_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    edited_text: Mapped[str | None] = mapped_column(Text)
    outcome: Mapped[str | None] = mapped_column(String(16))
    rank: Mapped[int | None] = mapped_column(Integer)
    replaced_by: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    meta: Mapped[dict[str, Any] | None] = mapped_column("metadata", JsonDocument, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ingested_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=NOW)

    __table_args__ = (
        Index("ix_feedback_request", "request_id"),
        Index("ix_feedback_line_type_created", "business_line", "type", "created_at"),
        Index("ix_feedback_user", "user_id"),
    )


class QuarantinedRecord(Base):
    """An input record that was refused, kept whole with the reason."""

    __tablename__ = "quarantine"

    id: Mapped[int] = mapped_column(PrimaryKey, primary_key=True, autoincrement=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    source: Mapped[str] = mapped_column(String(512))
    line_number: Mapped[int | None] = mapped_column(Integer)
    record_key: Mapped[str | None] = mapped_column(String(256))
    field: Mapped[str | None] = mapped_column(String(256))
    reason: Mapped[str] = mapped_column(Text)
    raw: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=NOW)

    __table_args__ = (Index("ix_quarantine_created", "created_at"),)


class ShadowOutput(Base):
    """A shadow adapter's answer to a request a user was answered by another adapter:
    never shown, kept to compare with the answer that was (lineage: ``request_id``)."""

    __tablename__ = "shadow_outputs"

    id: Mapped[int] = mapped_column(PrimaryKey, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("interactions.request_id", ondelete="CASCADE")
    )
    business_line: Mapped[str] = mapped_column(String(BUSINESS_LINE_LENGTH))
    adapter_name: Mapped[str] = mapped_column(String(ID_LENGTH))
    adapter_version: Mapped[int | None] = mapped_column(Integer)
    response: Mapped[str] = mapped_column(Text)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    output_tokens: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    meta: Mapped[dict[str, Any] | None] = mapped_column("metadata", JsonDocument, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_shadow_outputs_request", "request_id", "adapter_name", unique=True),
        Index(
            "ix_shadow_outputs_line_adapter_created", "business_line", "adapter_name", "created_at"
        ),
    )


class LineWatermark(Base):
    """How far the nightly run of a business line has consumed the store."""

    __tablename__ = "line_watermarks"

    business_line: Mapped[str] = mapped_column(String(BUSINESS_LINE_LENGTH), primary_key=True)
    watermark: Mapped[datetime | None] = mapped_column(UTCDateTime())
    pending_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    locked_by: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    locked_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    run_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    outcome: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class SignalRollup(Base):
    """Counts per business line, served adapter, hour and signal (``feedback.rollup``).

    ``requests`` and ``errors`` count interactions; every other signal counts feedback
    events, filed under the hour and adapter of the interaction they are about.
    """

    __tablename__ = "signal_rollup"

    business_line: Mapped[str] = mapped_column(String(BUSINESS_LINE_LENGTH), primary_key=True)
    adapter: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    signal: Mapped[str] = mapped_column(String(16), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)


class RollupWatermark(Base):
    """The highest row id of a source table already counted in ``signal_rollup``."""

    __tablename__ = "rollup_watermarks"

    source: Mapped[str] = mapped_column(String(32), primary_key=True)
    last_id: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ForgottenUser(Base):
    """A user whose data was erased (``flywheel forget``), by the digest manifests use
    (:func:`feedback.examples.user_digest` of the stored id, never the id): records of the
    user created before ``forgotten_at`` are dropped when a spool is replayed."""

    __tablename__ = "forgotten_users"

    user_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    forgotten_at: Mapped[datetime] = mapped_column(UTCDateTime())


class TrainedRecord(Base):
    """A record that went into a line's dataset, reduced to its dedup signature (never its
    text): the training history that later windows are deduplicated against
    (``feedback.dedup.history``). ``window_until`` names the window it was trained in; rows
    of a window that was not consumed are replaced by the next run's."""

    __tablename__ = "trained_records"

    id: Mapped[int] = mapped_column(PrimaryKey, primary_key=True, autoincrement=True)
    business_line: Mapped[str] = mapped_column(String(BUSINESS_LINE_LENGTH))
    window_until: Mapped[datetime] = mapped_column(UTCDateTime())
    request_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    signal: Mapped[str] = mapped_column(String(16))
    signature_key: Mapped[str] = mapped_column(String(16))
    scope_hash: Mapped[int] = mapped_column(BigInteger)
    # None for a record without text; band keys None when its text had no shingles.
    exact_hash: Mapped[int | None] = mapped_column(BigInteger)
    band_keys: Mapped[bytes | None] = mapped_column(LargeBinary)
    fingerprint: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_trained_records_line_window", "business_line", "window_until"),)


interactions_table = cast(Table, Interaction.__table__)
feedback_table = cast(Table, FeedbackEvent.__table__)
quarantine_table = cast(Table, QuarantinedRecord.__table__)
shadow_outputs_table = cast(Table, ShadowOutput.__table__)
watermarks_table = cast(Table, LineWatermark.__table__)
signal_rollup_table = cast(Table, SignalRollup.__table__)
rollup_watermarks_table = cast(Table, RollupWatermark.__table__)
trained_records_table = cast(Table, TrainedRecord.__table__)
forgotten_users_table = cast(Table, ForgottenUser.__table__)
FEEDBACK_TABLES = frozenset(
    table.name
    for table in (
        interactions_table,
        feedback_table,
        quarantine_table,
        shadow_outputs_table,
        watermarks_table,
        signal_rollup_table,
        rollup_watermarks_table,
        trained_records_table,
        forgotten_users_table,
    )
)


def rows_about_requests() -> list[Table]:
    """Other packages' declared tables whose rows are about one stored request (a foreign
    key to ``interactions.request_id``): erased with the request, whoever wrote them."""
    request_id = interactions_table.c.request_id
    return [
        table
        for table in Base.metadata.sorted_tables
        if table.name not in FEEDBACK_TABLES
        and any(key.column is request_id for key in table.foreign_keys)
    ]


class UndeclaredTablesError(RuntimeError):
    """The database holds tables this process has not declared: an erasure would miss them."""


def require_declared(connection: Connection) -> None:
    """Refuse to erase while the database holds a table no loaded package declared: the
    erasure reaches other packages' tables through their declarations
    (:func:`rows_about_requests`, :func:`flywheel.database.recounted_after_erasure`), which
    ``composition.tables`` loads in every process that builds a store."""
    stored = set(inspect(connection).get_table_names()) - {"alembic_version"}
    missing = sorted(stored - set(Base.metadata.tables))
    if missing:
        raise UndeclaredTablesError(
            f"the database holds tables this process has not declared ({', '.join(missing)}):"
            " import composition.tables before erasing, so no table is left out"
        )
