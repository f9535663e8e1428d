"""training history for dedup across windows

``trained_records`` keeps, per business line, the dedup signature of every record that went
into a window's dataset (request id, signal, scope, exact hash, LSH band keys, fingerprint;
never the text), so a later window does not train on the same interaction or text again and
near duplicates are capped over the nights (``feedback.dedup.history``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-14 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "trained_records",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("business_line", sa.String(length=64), nullable=False),
        sa.Column("window_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("signal", sa.String(length=16), nullable=False),
        sa.Column("signature_key", sa.String(length=16), nullable=False),
        sa.Column("scope_hash", sa.BigInteger(), nullable=False),
        sa.Column("exact_hash", sa.BigInteger(), nullable=True),
        sa.Column("band_keys", sa.LargeBinary(), nullable=True),
        sa.Column("fingerprint", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_trained_records_line_window",
        "trained_records",
        ["business_line", "window_until"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_trained_records_line_window", table_name="trained_records")
    op.drop_table("trained_records")
