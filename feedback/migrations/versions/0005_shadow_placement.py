"""shadow adapters and replica placement in the routing tables; shadow outputs

A line's routing table may name a shadow adapter that answers a sampled share of
the line's requests after the user got the champion's answer (never shown), and
the replicas that hold the line's adapters (adapter-affinity placement; NULL
means every replica). The shadow's answers are kept in ``shadow_outputs``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    for table in ("routes", "route_changes"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("shadow", sa.String(length=128), nullable=True))
            batch.add_column(sa.Column("shadow_fraction", sa.Float(), nullable=True))
            batch.add_column(sa.Column("replicas", _JSON, nullable=True))
    op.create_table(
        "shadow_outputs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("business_line", sa.String(length=64), nullable=False),
        sa.Column("adapter_name", sa.String(length=128), nullable=False),
        sa.Column("adapter_version", sa.Integer(), nullable=True),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("metadata", _JSON, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["request_id"], ["interactions.request_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_shadow_outputs_request",
        "shadow_outputs",
        ["request_id", "adapter_name"],
        unique=True,
    )
    op.create_index(
        "ix_shadow_outputs_line_adapter_created",
        "shadow_outputs",
        ["business_line", "adapter_name", "created_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_shadow_outputs_line_adapter_created", table_name="shadow_outputs")
    op.drop_index("ix_shadow_outputs_request", table_name="shadow_outputs")
    op.drop_table("shadow_outputs")
    for table in ("route_changes", "routes"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("replicas")
            batch.drop_column("shadow_fraction")
            batch.drop_column("shadow")
