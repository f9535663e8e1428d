"""Forget and retention on real PostgreSQL: the JSONB stamp filter, the forgotten-users
table and the spool-replay filter behave as on SQLite."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from feedback.retention import RetentionPolicy, apply_retention
from feedback.schema import interactions_table
from feedback.store import FeedbackStore, create_store_engine, upgrade_schema

pytestmark = pytest.mark.integration
NOW = datetime(2026, 12, 10, 3, 0, tzinfo=UTC)


def _interaction(request_id: str, user: str, created_at: datetime) -> dict[str, Any]:
    return {
        "type": "interaction",
        "request_id": request_id,
        "user_id": user,
        "business_line": "legal",
        "base_model": "base",
        "messages": [{"role": "user", "content": "Mail jane.roe1987@example.org now."}],
        "response": "Done.",
        "created_at": created_at.isoformat(),
    }


def _upper(records: list[dict[str, Any]], fields: Any) -> list[dict[str, Any]]:
    return [{**r, "response": "<SCRUBBED>", "pii": {"X": 1}} for r in records]


def test_retention_and_forget_on_postgres(postgres_url: str) -> None:
    engine = create_store_engine(postgres_url)
    upgrade_schema(engine)
    store = FeedbackStore(engine)
    store.ingest(
        [
            _interaction("req-old", "alice", NOW - timedelta(days=40)),
            _interaction("req-young", "alice", NOW - timedelta(days=1)),
        ],
        source="test",
    )
    policy = RetentionPolicy(raw_days=30)
    first = apply_retention(engine, "legal", policy, _upper, now=NOW)
    second = apply_retention(engine, "legal", policy, _upper, now=NOW)
    assert (first.interactions, second.interactions) == (1, 0)
    with engine.connect() as connection:
        responses = dict(
            connection.execute(
                select(interactions_table.c.request_id, interactions_table.c.response)
            ).all()
        )
    assert responses == {"req-old": "<SCRUBBED>", "req-young": "Done."}

    erased = store.forget_user("alice", now=NOW)
    assert erased.total("interactions") == 2
    replay = store.ingest(
        [
            _interaction("req-late", "alice", NOW - timedelta(minutes=1)),
            _interaction("req-back", "alice", NOW + timedelta(minutes=1)),
        ],
        source="spool",
    )
    assert (replay.forgotten, replay.interactions_added) == (1, 1)
    store.close()
