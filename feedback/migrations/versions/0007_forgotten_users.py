"""users erased by flywheel forget

``forgotten_users`` keeps the digest of each erased user's stored id (the digest dataset
manifests use, never the id) and when they were erased, so a spooled batch replayed after
the erasure drops the user's older records instead of storing them again.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-10 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "forgotten_users",
        sa.Column("user_key", sa.String(length=64), nullable=False),
        sa.Column("forgotten_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("user_key"),
    )


def downgrade() -> None:
    op.drop_table("forgotten_users")
