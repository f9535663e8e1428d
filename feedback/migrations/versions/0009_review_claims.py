"""review queue claims

``review_claims`` records which answer the feedback page's review queue handed to which
reviewer (by key name) and until when it is kept from the others; the verdicts are
``review`` feedback events (``dashboard.review_queue``).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-20 08:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "review_claims",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("business_line", sa.String(length=64), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("reviewer", sa.String(length=64), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reviewed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["request_id"], ["interactions.request_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_review_claims_reviewer",
        "review_claims",
        ["business_line", "reviewer", "request_id"],
        unique=True,
    )
    op.create_index(
        "ix_review_claims_request",
        "review_claims",
        ["business_line", "request_id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_review_claims_request", table_name="review_claims")
    op.drop_index("ix_review_claims_reviewer", table_name="review_claims")
    op.drop_table("review_claims")
