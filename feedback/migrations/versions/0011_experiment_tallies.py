"""experiment tallies: each arm's requests by flag set, and what the tally has counted

``experiment_tallies`` keeps, per experiment and arm, how many requests have each set of
flags (a bit mask); ``experiment_tally_marks`` the last interaction and feedback ids it
has counted (``registry.experiment_tally``). Both start empty: an experiment's first
view after the upgrade counts its requests once.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-28 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "experiment_tallies",
        sa.Column("experiment_id", _ID, nullable=False),
        sa.Column("arm", sa.String(length=1), nullable=False),
        sa.Column("flag_mask", sa.Integer(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("experiment_id", "arm", "flag_mask"),
    )
    op.create_table(
        "experiment_tally_marks",
        sa.Column("experiment_id", _ID, nullable=False),
        sa.Column("interaction_id", sa.BigInteger(), nullable=False),
        sa.Column("feedback_id", sa.BigInteger(), nullable=False),
        sa.Column("window_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("flag_names", sa.String(length=256), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("experiment_id"),
    )


def downgrade() -> None:
    op.drop_table("experiment_tally_marks")
    op.drop_table("experiment_tallies")
