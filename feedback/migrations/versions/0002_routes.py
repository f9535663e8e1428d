"""routing tables of the gateway and their change history

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 05:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "routes",
        sa.Column("business_line", sa.String(length=64), nullable=False),
        sa.Column("champion", sa.String(length=128), nullable=True),
        sa.Column("canary", sa.String(length=128), nullable=True),
        sa.Column("canary_fraction", sa.Float(), nullable=False),
        sa.Column("previous", sa.String(length=128), nullable=True),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("business_line"),
    )
    op.create_table(
        "route_changes",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("business_line", sa.String(length=64), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("champion", sa.String(length=128), nullable=True),
        sa.Column("canary", sa.String(length=128), nullable=True),
        sa.Column("canary_fraction", sa.Float(), nullable=False),
        sa.Column("previous", sa.String(length=128), nullable=True),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_route_changes_line_created",
        "route_changes",
        ["business_line", "created_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_route_changes_line_created", table_name="route_changes")
    op.drop_table("route_changes")
    op.drop_table("routes")
