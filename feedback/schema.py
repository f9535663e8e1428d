"""Tables of the feedback store (SQLAlchemy 2), shared by PostgreSQL and SQLite.

Alembic migrations in ``feedback/migrations`` create exactly these tables; a
test compares the two so they cannot drift.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

ID_LENGTH = 128
BUSINESS_LINE_LENGTH = 64
# An API key's name (gateway.keys.ApiKey.name), never its secret.
KEY_NAME_LENGTH = 64

# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias).
PrimaryKey = BigInteger().with_variant(Integer(), "sqlite")
JsonDocument = JSON().with_variant(JSONB(), "postgresql")
NOW = func.current_timestamp()


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
    """Declarative base of the store's tables."""


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


class Route(Base):
    """The routing table of one business line, as every gateway replica reads it."""

    __tablename__ = "routes"

    business_line: Mapped[str] = mapped_column(String(BUSINESS_LINE_LENGTH), primary_key=True)
    champion: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    canary: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    canary_fraction: Mapped[float] = mapped_column(Float)
    previous: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    shadow: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    shadow_fraction: Mapped[float | None] = mapped_column(Float)
    # The replicas (upstream URLs) that hold the line's adapters; NULL: every replica.
    replicas: Mapped[list[str] | None] = mapped_column(JsonDocument, nullable=True)
    # A live A/B experiment's split (registry.routing.ExperimentSplit); NULL: none.
    experiment: Mapped[dict[str, Any] | None] = mapped_column(JsonDocument, nullable=True)
    revision: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class RouteChange(Base):
    """One change of a routing table: who, why, and the table it left."""

    __tablename__ = "route_changes"

    id: Mapped[int] = mapped_column(PrimaryKey, primary_key=True, autoincrement=True)
    business_line: Mapped[str] = mapped_column(String(BUSINESS_LINE_LENGTH))
    revision: Mapped[int] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(32))
    champion: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    canary: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    canary_fraction: Mapped[float] = mapped_column(Float)
    previous: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    shadow: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    shadow_fraction: Mapped[float | None] = mapped_column(Float)
    replicas: Mapped[list[str] | None] = mapped_column(JsonDocument, nullable=True)
    experiment: Mapped[dict[str, Any] | None] = mapped_column(JsonDocument, nullable=True)
    actor: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_route_changes_line_created", "business_line", "created_at"),)


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


class CanaryDecisionRecord(Base):
    """One look of the canary flow at a canary: the action, why, and the numbers."""

    __tablename__ = "canary_decisions"

    id: Mapped[int] = mapped_column(PrimaryKey, primary_key=True, autoincrement=True)
    business_line: Mapped[str] = mapped_column(String(BUSINESS_LINE_LENGTH))
    adapter: Mapped[str] = mapped_column(String(ID_LENGTH))
    canary_fraction: Mapped[float] = mapped_column(Float)
    look: Mapped[int] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(16))
    reasons: Mapped[str] = mapped_column(Text)
    numbers: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    actor: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_canary_decisions_line_created", "business_line", "created_at"),)


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


class DashboardSession(Base):
    """A browser's login to the feedback page (``dashboard.sessions``): the digest of its
    session id (never the id), the API key it logged in with (by digest) and its end."""

    __tablename__ = "dashboard_sessions"

    id_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_sha256: Mapped[str] = mapped_column(String(64))
    key_name: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_dashboard_sessions_expires", "expires_at"),)


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


class Experiment(Base):
    """An A/B experiment of a business line (``registry.experiments``): its arms (NULL: the
    base model), B's share of the users, the metric and test settings it is judged by, and
    its decision (the first look that crossed, kept: the test is anytime-valid)."""

    __tablename__ = "experiments"

    id: Mapped[int] = mapped_column(PrimaryKey, primary_key=True, autoincrement=True)
    business_line: Mapped[str] = mapped_column(String(BUSINESS_LINE_LENGTH))
    arm_a: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    arm_b: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    share: Mapped[float] = mapped_column(Float)
    metric: Mapped[str] = mapped_column(String(32))
    alpha: Mapped[float] = mapped_column(Float)
    min_samples: Mapped[int] = mapped_column(Integer)
    mixture_scale: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16))
    winner: Mapped[str | None] = mapped_column(String(1))
    decided_look: Mapped[int | None] = mapped_column(Integer)
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    actor: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str | None] = mapped_column(Text)
    ended_reason: Mapped[str | None] = mapped_column(Text)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (Index("ix_experiments_line_started", "business_line", "started_at"),)


class ExperimentLook(Base):
    """One look at an experiment: each arm's samples and hits on its metric, the effect
    (B - A), its confidence sequence, the always-valid p-value and the verdict."""

    __tablename__ = "experiment_looks"

    id: Mapped[int] = mapped_column(PrimaryKey, primary_key=True, autoincrement=True)
    experiment_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"),
        ForeignKey("experiments.id", ondelete="CASCADE"),
    )
    look: Mapped[int] = mapped_column(Integer)
    verdict: Mapped[str] = mapped_column(String(16))
    numbers: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    actor: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_experiment_looks_experiment", "experiment_id", "look"),)


class ExperimentTally(Base):
    """How many of an experiment arm's requests have each set of flags (a bit mask over
    ``registry.experiments.FLAGS``), as counted up to the experiment's tally marks
    (``registry.experiment_tally``): every metric is a sum over these few cells."""

    __tablename__ = "experiment_tallies"

    experiment_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"),
        ForeignKey("experiments.id", ondelete="CASCADE"),
        primary_key=True,
    )
    arm: Mapped[str] = mapped_column(String(1), primary_key=True)
    flag_mask: Mapped[int] = mapped_column(Integer, primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)


class ExperimentTallyMark(Base):
    """What an experiment's tally has counted: interactions and feedback events up to these
    ids, within its window up to ``window_until`` (NULL: still open), with the flags named
    in ``flag_names`` (in bit order). ``version`` moves by compare-and-set with each fold."""

    __tablename__ = "experiment_tally_marks"

    experiment_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"),
        ForeignKey("experiments.id", ondelete="CASCADE"),
        primary_key=True,
    )
    interaction_id: Mapped[int] = mapped_column(BigInteger)
    feedback_id: Mapped[int] = mapped_column(BigInteger)
    window_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    flag_names: Mapped[str] = mapped_column(String(256))
    version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ReviewClaim(Base):
    """An answer handed to a reviewer by the feedback page's review queue
    (``dashboard.review_queue``): kept from other reviewers until ``expires_at`` or the
    review, and never handed to the same reviewer (key name) again. The verdict itself
    is a ``review`` feedback event."""

    __tablename__ = "review_claims"

    id: Mapped[int] = mapped_column(PrimaryKey, primary_key=True, autoincrement=True)
    business_line: Mapped[str] = mapped_column(String(BUSINESS_LINE_LENGTH))
    request_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("interactions.request_id", ondelete="CASCADE")
    )
    reviewer: Mapped[str] = mapped_column(String(64))
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    reviewed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    __table_args__ = (
        Index("ix_review_claims_reviewer", "business_line", "reviewer", "request_id", unique=True),
        Index("ix_review_claims_request", "business_line", "request_id"),
    )


interactions_table = Interaction.__table__
feedback_table = FeedbackEvent.__table__
quarantine_table = QuarantinedRecord.__table__
routes_table = Route.__table__
route_changes_table = RouteChange.__table__
shadow_outputs_table = ShadowOutput.__table__
watermarks_table = LineWatermark.__table__
canary_decisions_table = CanaryDecisionRecord.__table__
signal_rollup_table = SignalRollup.__table__
rollup_watermarks_table = RollupWatermark.__table__
trained_records_table = TrainedRecord.__table__
dashboard_sessions_table = DashboardSession.__table__
forgotten_users_table = ForgottenUser.__table__
review_claims_table = ReviewClaim.__table__
experiments_table = Experiment.__table__
experiment_looks_table = ExperimentLook.__table__
experiment_tallies_table = ExperimentTally.__table__
experiment_tally_marks_table = ExperimentTallyMark.__table__
