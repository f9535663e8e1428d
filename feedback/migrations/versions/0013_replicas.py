"""replicas: each vLLM replica's base model and LoRA limits as it started

``replicas`` (declared by ``registry.replicas``) holds one row per replica URL, written
by ``flywheel serve vllm`` at its start: the base model it serves (name and digest), its
``--max-loras`` and ``--max-lora-rank``, and whether flywheel's LoRA resolver is
installed. It starts empty: the rollout falls back to what vLLM reports, then to the
settings, until each replica restarts once.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-30 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("url", sa.String(length=512), nullable=False),
        sa.Column("base_name", sa.String(length=256), nullable=False),
        sa.Column("base_digest", sa.String(length=80), nullable=False),
        sa.Column("max_loras", sa.Integer(), nullable=False),
        sa.Column("max_lora_rank", sa.Integer(), nullable=False),
        sa.Column("resolver", sa.Boolean(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("url"),
    )


def downgrade() -> None:
    op.drop_table("replicas")
