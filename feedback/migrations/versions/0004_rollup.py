"""hourly signal rollup for the feedback page; sample indexes end in id

The feedback page pages samples by ``(created_at, id)``; with ``id`` in the index
PostgreSQL reads it in that order and stops at the page size instead of sorting a
whole line when its statistics are stale. Rebuilding ``ix_interactions_line_created``
locks writes to ``interactions`` for the time it takes (seconds per million rows).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "signal_rollup",
        sa.Column("business_line", sa.String(length=64), nullable=False),
        sa.Column("adapter", sa.String(length=128), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("signal", sa.String(length=16), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("business_line", "adapter", "hour", "signal"),
    )
    op.create_table(
        "rollup_watermarks",
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("last_id", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("source"),
    )
    op.create_index(
        "ix_interactions_line_adapter_created",
        "interactions",
        ["business_line", "adapter_name", "created_at", "id"],
        unique=False,
    )
    op.drop_index("ix_interactions_line_created", table_name="interactions")
    op.create_index(
        "ix_interactions_line_created",
        "interactions",
        ["business_line", "created_at", "id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_interactions_line_created", table_name="interactions")
    op.create_index(
        "ix_interactions_line_created",
        "interactions",
        ["business_line", "created_at"],
        unique=False,
    )
    op.drop_index("ix_interactions_line_adapter_created", table_name="interactions")
    op.drop_table("rollup_watermarks")
    op.drop_table("signal_rollup")
