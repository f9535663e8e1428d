"""feedback store: interactions, feedback events, quarantine

Revision ID: 0001
Revises:
Create Date: 2026-11-30 02:36:14.232457
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "interactions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=True),
        sa.Column("user_id", sa.String(length=128), nullable=True),
        sa.Column("business_line", sa.String(length=64), nullable=False),
        sa.Column("adapter_name", sa.String(length=128), nullable=True),
        sa.Column("adapter_version", sa.Integer(), nullable=True),
        sa.Column("base_model", sa.String(length=256), nullable=False),
        sa.Column("arm", sa.String(length=16), nullable=True),
        sa.Column(
            "messages",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("prompt_hash", sa.String(length=64), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=True),
        sa.Column(
            "metadata",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "ingested_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("request_id"),
    )
    op.create_index(
        "ix_interactions_line_created",
        "interactions",
        ["business_line", "created_at"],
        unique=False,
    )
    op.create_index(
        "ix_interactions_session_prompt",
        "interactions",
        ["session_id", "prompt_hash"],
        unique=False,
    )
    op.create_index("ix_interactions_user", "interactions", ["user_id"], unique=False)
    op.create_table(
        "quarantine",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=512), nullable=False),
        sa.Column("line_number", sa.Integer(), nullable=True),
        sa.Column("record_key", sa.String(length=256), nullable=True),
        sa.Column("field", sa.String(length=256), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("raw", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("fingerprint"),
    )
    op.create_index("ix_quarantine_created", "quarantine", ["created_at"], unique=False)
    op.create_table(
        "feedback_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("idempotency_key", sa.String(length=256), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("business_line", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=True),
        sa.Column("edited_text", sa.Text(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("replaced_by", sa.String(length=128), nullable=True),
        sa.Column(
            "metadata",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "ingested_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(["request_id"], ["interactions.request_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("idempotency_key"),
    )
    op.create_index(
        "ix_feedback_line_type_created",
        "feedback_events",
        ["business_line", "type", "created_at"],
        unique=False,
    )
    op.create_index("ix_feedback_request", "feedback_events", ["request_id"], unique=False)
    op.create_index("ix_feedback_user", "feedback_events", ["user_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_feedback_user", table_name="feedback_events")
    op.drop_index("ix_feedback_request", table_name="feedback_events")
    op.drop_index("ix_feedback_line_type_created", table_name="feedback_events")
    op.drop_table("feedback_events")
    op.drop_index("ix_quarantine_created", table_name="quarantine")
    op.drop_table("quarantine")
    op.drop_index("ix_interactions_user", table_name="interactions")
    op.drop_index("ix_interactions_session_prompt", table_name="interactions")
    op.drop_index("ix_interactions_line_created", table_name="interactions")
    op.drop_table("interactions")
