"""the API key's name on each interaction

``interactions.key_name`` names the API key a request came with (its name, never the
secret), so that training examples and canary looks can cap what one key contributes
as well as what one user does. Rows logged before are left NULL: their key is unknown.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-29 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("interactions") as batch:
        batch.add_column(sa.Column("key_name", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("interactions") as batch:
        batch.drop_column("key_name")
