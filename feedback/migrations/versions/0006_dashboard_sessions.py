"""login sessions of the feedback page

The feedback page's login cookie holds a random session id instead of the API key;
``dashboard_sessions`` maps the id's SHA-256 digest to the key's digest and the
session's end, so every worker sees a login, a logout and an expiry at once.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-09 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("id_sha256", sa.String(length=64), nullable=False),
        sa.Column("key_sha256", sa.String(length=64), nullable=False),
        sa.Column("key_name", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id_sha256"),
    )
    op.create_index("ix_dashboard_sessions_expires", "dashboard_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_dashboard_sessions_expires", table_name="dashboard_sessions")
    op.drop_table("dashboard_sessions")
