"""The registry's tables: each line's routing table and its changes, the canary's looks,
A/B experiments (their looks and running tallies) and what each vLLM replica serves with.

They sit on the one database's base (:mod:`flywheel.database`); the one migration history
(``feedback/migrations``) creates them with every other package's tables. Only the
registry writes them. An experiment's tallies count stored requests, so the feedback
store's erasures drop those that may count an erased one
(:data:`~flywheel.database.RECOUNTED_AFTER_ERASURE`, scoped here) and
``registry.experiment_tally`` counts them again on the next view.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    select,
)
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.database import (
    BUSINESS_LINE_LENGTH,
    ID_LENGTH,
    RECOUNTED_AFTER_ERASURE,
    Base,
    JsonDocument,
    PrimaryKey,
    UTCDateTime,
)

URL_LENGTH = 512


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


def _tally_of_experiments_started_before(
    table: Table, business_line: str, before: datetime
) -> ColumnElement[bool]:
    """An experiment's tally rows that may count a request of ``business_line`` created
    before ``before``: those of the line's experiments that started before it."""
    experiments = Experiment.__table__.c
    started = select(experiments.id).where(
        experiments.business_line == business_line, experiments.started_at < before
    )
    return table.c.experiment_id.in_(started)


class ExperimentLookRecord(Base):
    """One look at an experiment: each arm's samples and hits on its metric, the effect
    (B - A), its confidence sequence, the always-valid p-value and the verdict."""

    __tablename__ = "experiment_looks"

    id: Mapped[int] = mapped_column(PrimaryKey, primary_key=True, autoincrement=True)
    experiment_id: Mapped[int] = mapped_column(
        PrimaryKey,
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
    __table_args__ = ({"info": {RECOUNTED_AFTER_ERASURE: _tally_of_experiments_started_before}},)

    experiment_id: Mapped[int] = mapped_column(
        PrimaryKey,
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
    __table_args__ = ({"info": {RECOUNTED_AFTER_ERASURE: _tally_of_experiments_started_before}},)

    experiment_id: Mapped[int] = mapped_column(
        PrimaryKey,
        ForeignKey("experiments.id", ondelete="CASCADE"),
        primary_key=True,
    )
    interaction_id: Mapped[int] = mapped_column(BigInteger)
    feedback_id: Mapped[int] = mapped_column(BigInteger)
    window_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    flag_names: Mapped[str] = mapped_column(String(256))
    version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ReplicaRow(Base):
    """One vLLM replica, by the URL gateways and flows reach it at, as it said at its start
    (``registry.replicas``): its base model, LoRA limits and whether it has the resolver."""

    __tablename__ = "replicas"

    url: Mapped[str] = mapped_column(String(URL_LENGTH), primary_key=True)
    base_name: Mapped[str] = mapped_column(String(256))
    base_digest: Mapped[str] = mapped_column(String(80))
    max_loras: Mapped[int] = mapped_column(Integer)
    max_lora_rank: Mapped[int] = mapped_column(Integer)
    resolver: Mapped[bool] = mapped_column(Boolean)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())


routes_table = cast(Table, Route.__table__)
route_changes_table = cast(Table, RouteChange.__table__)
canary_decisions_table = cast(Table, CanaryDecisionRecord.__table__)
experiments_table = cast(Table, Experiment.__table__)
experiment_looks_table = cast(Table, ExperimentLookRecord.__table__)
experiment_tallies_table = cast(Table, ExperimentTally.__table__)
experiment_tally_marks_table = cast(Table, ExperimentTallyMark.__table__)
replicas_table = cast(Table, ReplicaRow.__table__)
