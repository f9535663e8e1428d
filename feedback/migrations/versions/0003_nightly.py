"""nightly watermarks and leases per business line, canary decisions

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 06:15:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "line_watermarks",
        sa.Column("business_line", sa.String(length=64), nullable=False),
        sa.Column("watermark", sa.DateTime(timezone=True), nullable=True),
        sa.Column("pending_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("locked_by", sa.String(length=128), nullable=True),
        sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("run_id", sa.String(length=128), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("business_line"),
    )

    op.create_table(
        "canary_decisions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("business_line", sa.String(length=64), nullable=False),
        sa.Column("adapter", sa.String(length=128), nullable=False),
        sa.Column("canary_fraction", sa.Float(), nullable=False),
        sa.Column("look", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("reasons", sa.Text(), nullable=False),
        sa.Column(
            "numbers",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_canary_decisions_line_created",
        "canary_decisions",
        ["business_line", "created_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_canary_decisions_line_created", table_name="canary_decisions")
    op.drop_table("canary_decisions")
    op.drop_table("line_watermarks")
