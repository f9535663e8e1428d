"""Behaviour every store backend must have: SQLite (unit tier) and PostgreSQL (integration)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from feedback.jsonl import iter_jsonl_lines
from feedback.schema import feedback_table, interactions_table
from feedback.store import FeedbackStore

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def interaction(request_id: str, line: str = "medical", **extra: Any) -> dict[str, Any]:
    return {
        "type": "interaction",
        "request_id": request_id,
        "session_id": f"s-{request_id}",
        "user_id": "u-1",
        "business_line": line,
        "base_model": "base",
        "messages": [{"role": "user", "content": f"question {request_id} 你好"}],
        "response": "answer",
        "created_at": T0.isoformat(),
        **extra,
    }


def feedback(kind: str, request_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "request_id": request_id, "created_at": T0.isoformat(), **extra}


class StoreContract:
    """Subclasses provide a ``store`` fixture."""

    def test_ingest_is_idempotent(self, store: FeedbackStore) -> None:
        records = [
            interaction("a"),
            interaction("b", line="legal"),
            feedback("thumbs_up", "a", idempotency_key="k1"),
            feedback("edit", "b", edited_text="better answer"),
            feedback("task_outcome", "a", outcome="success"),
        ]
        first = store.ingest(records, source="test")
        assert (first.interactions_added, first.feedback_added, first.quarantined) == (2, 3, 0)
        again = store.ingest(records, source="test")
        assert (again.added, again.duplicates) == (0, 5)
        counts = store.stats()
        assert counts["interactions"] == 2
        assert counts["events"]["thumbs_up"] == 1
        assert counts["business_lines"]["legal"]["events"]["edit"] == 1

    def test_duplicates_inside_one_batch_are_stored_once(self, store: FeedbackStore) -> None:
        records = [interaction("a"), interaction("a"), feedback("thumbs_up", "a")] * 2
        report = store.ingest(records, source="test")
        assert report.added == 2
        assert report.duplicates == 4

    def test_bad_records_are_quarantined_and_good_ones_kept(self, store: FeedbackStore) -> None:
        lines = [
            b'{"type": "interaction"}\n',
            b"not json\n",
            orjson_line(interaction("ok")),
            orjson_line(feedback("thumbs_down", "ghost")),
            orjson_line(feedback("thumbs_down", "ok")),
            b'{"type": "interaction", "response": "\xff"}\n',
            orjson_line(interaction("big", response="x" * (store.limits.max_text_chars + 1))),
        ]
        report = store.ingest(iter_jsonl_lines(lines), source="batch.jsonl")
        assert (report.interactions_added, report.feedback_added) == (1, 1)
        assert report.quarantined == 5
        rows = {row["line_number"]: row for row in store.quarantined(limit=10)}
        assert set(rows) == {1, 2, 4, 6, 7}
        assert "request_id (Field required)" in rows[1]["reason"]
        assert rows[4]["reason"] == "interaction 'ghost' does not exist"
        assert rows[6]["reason"] == "invalid UTF-8 at byte 37"
        assert rows[7]["field"] == "response"
        assert rows[2]["raw"] == b"not json\n"
        assert all(row["source"] == "batch.jsonl" for row in rows.values())
        assert any(
            r.startswith("batch.jsonl:4 (type=thumbs_down request_id=ghost)")
            for r in report.rejections
        )
        store.ingest(iter_jsonl_lines(lines), source="batch.jsonl")
        assert store.stats()["quarantined"] == 5

    def test_feedback_may_name_an_interaction_from_an_earlier_batch(
        self, store: FeedbackStore
    ) -> None:
        store.ingest([interaction("early")], source="day1")
        late = feedback("task_outcome", "early", outcome="failure")
        late["created_at"] = (T0 + timedelta(days=4)).isoformat()
        report = store.ingest([late], source="day5")
        assert report.feedback_added == 1
        with store.engine.connect() as connection:
            row = connection.execute(select(feedback_table)).one()
        assert row.business_line == "medical"
        assert row.created_at == T0 + timedelta(days=4)

    def test_times_come_back_in_utc(self, store: FeedbackStore) -> None:
        store.ingest([interaction("tz", created_at="2026-11-01T08:00:00+08:00")], source="t")
        with store.engine.connect() as connection:
            created = connection.execute(select(interactions_table.c.created_at)).scalar_one()
        assert created == datetime(2026, 11, 1, tzinfo=UTC)
        assert created.tzinfo is not None

    def test_a_batch_is_all_or_nothing(
        self, store: FeedbackStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def fail(*_args: Any, **_kwargs: Any) -> dict[str, Any]:
            raise RuntimeError("disk full")

        monkeypatch.setattr("feedback.store.feedback_row", fail)
        with pytest.raises(RuntimeError):
            store.ingest([interaction("x"), feedback("thumbs_up", "x")], source="t")
        monkeypatch.undo()
        assert store.stats()["interactions"] == 0

    def test_large_batches_take_the_bulk_path(self, store: FeedbackStore) -> None:
        records = []
        for i in range(500):
            records.append(interaction(f"r{i}", metadata={"n": i}))
            records.append(feedback("thumbs_up", f"r{i}"))
        report = store.ingest(records, source="bulk")
        assert report.added == 1000
        assert store.ingest(records, source="bulk").added == 0
        with store.engine.connect() as connection:
            row = connection.execute(
                select(interactions_table).where(interactions_table.c.request_id == "r7")
            ).one()
        assert row.metadata == {"n": 7}
        assert row.messages == [{"role": "user", "content": "question r7 你好"}]

    def test_a_users_newer_edit_of_an_answer_replaces_the_older(self, store: FeedbackStore) -> None:
        def edit(text: str, minutes: int, user: str = "u-1") -> dict[str, Any]:
            when = (T0 + timedelta(minutes=minutes)).isoformat()
            return feedback("edit", "a", edited_text=text, user_id=user, created_at=when)

        store.ingest([interaction("a")], source="t")
        # Thirty distinct edits of one answer by one user, in batches and within one.
        for minute in range(10):
            store.ingest([edit(f"take {minute} " + "x" * 2_000, minute)], source="t")
        report = store.ingest([edit(f"take {m}", m) for m in range(10, 30)], source="t")
        assert report.edits_replaced == 1
        # A late replay of an older edit, and of the live one, change nothing.
        assert store.ingest([edit("take 3", 3), edit("take 29", 29)], source="t").added == 0
        # Another user's edit of the same answer is theirs.
        store.ingest([edit("a reviewer's take", 31, user="u-2")], source="t")
        with store.engine.connect() as connection:
            rows = connection.execute(
                select(feedback_table.c.user_id, feedback_table.c.edited_text).order_by(
                    feedback_table.c.user_id
                )
            ).all()
        assert [tuple(row) for row in rows] == [("u-1", "take 29"), ("u-2", "a reviewer's take")]
        assert store.stats()["events"]["edit"] == 2

    def test_stats_shape(self, store: FeedbackStore) -> None:
        store.ingest([interaction("a"), feedback("abandon", "a")], source="t")
        counts = store.stats()
        signals = {"thumbs_up", "thumbs_down", "regenerate", "edit", "abandon", "task_outcome"}
        assert signals <= set(counts["events"])
        assert counts["business_lines"]["medical"] == {
            "interactions": 1,
            "events": {s: int(s == "abandon") for s in signals},
        }


def orjson_line(record: dict[str, Any]) -> bytes:
    import orjson

    return orjson.dumps(record) + b"\n"
