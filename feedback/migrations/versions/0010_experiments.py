"""A/B experiments: the routing tables' experiment split, experiments and their looks

A line's routing table may carry a live A/B experiment (``experiment``: its id, arms and
B's share of the users). ``experiments`` holds each experiment of a line (arms, metric,
test settings, status, decision) and ``experiment_looks`` every look at it with its
numbers (``registry.experiments``).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-20 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    for table in ("routes", "route_changes"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("experiment", _JSON, nullable=True))
    op.create_table(
        "experiments",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("business_line", sa.String(length=64), nullable=False),
        sa.Column("arm_a", sa.String(length=128), nullable=True),
        sa.Column("arm_b", sa.String(length=128), nullable=True),
        sa.Column("share", sa.Float(), nullable=False),
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("alpha", sa.Float(), nullable=False),
        sa.Column("min_samples", sa.Integer(), nullable=False),
        sa.Column("mixture_scale", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("winner", sa.String(length=1), nullable=True),
        sa.Column("decided_look", sa.Integer(), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("ended_reason", sa.Text(), nullable=True),
        sa.Column("mlflow_run_id", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_experiments_line_started", "experiments", ["business_line", "started_at"])
    op.create_table(
        "experiment_looks",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("experiment_id", _ID, nullable=False),
        sa.Column("look", sa.Integer(), nullable=False),
        sa.Column("verdict", sa.String(length=16), nullable=False),
        sa.Column("numbers", _JSON, nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_experiment_looks_experiment", "experiment_looks", ["experiment_id", "look"])


def downgrade() -> None:
    op.drop_index("ix_experiment_looks_experiment", table_name="experiment_looks")
    op.drop_table("experiment_looks")
    op.drop_index("ix_experiments_line_started", table_name="experiments")
    op.drop_table("experiments")
    for table in ("route_changes", "routes"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("experiment")
