"""Replica records in the store: what each vLLM replica serves with, as it started."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from feedback.store import FeedbackStore
from flywheel.settings import Settings
from registry.replicas import ReplicaRecord, ReplicaStore

STARTED = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)


@pytest.fixture
def replicas(settings: Settings) -> Iterator[ReplicaStore]:
    store = FeedbackStore.open(settings)
    yield ReplicaStore(store.engine)
    store.close()


def _record(url: str, max_loras: int = 4, **changes: object) -> ReplicaRecord:
    values: dict[str, object] = {
        "url": url,
        "base_name": "SmolLM2-135M-Instruct",
        "base_digest": "sha256:" + "ab" * 32,
        "max_loras": max_loras,
        "max_lora_rank": 16,
        "resolver": True,
        "started_at": STARTED,
        **changes,
    }
    return ReplicaRecord(**values)  # type: ignore[arg-type]


def test_a_replica_records_itself_and_is_read_back(replicas: ReplicaStore) -> None:
    assert replicas.get("http://127.0.0.1:8001") is None
    assert replicas.all() == []
    replicas.record(_record("http://127.0.0.1:8001/"))
    assert replicas.get("http://127.0.0.1:8001/") == _record("http://127.0.0.1:8001")
    assert replicas.get("http://127.0.0.1:8001") == _record("http://127.0.0.1:8001")


def test_a_restart_replaces_the_record_of_its_url(replicas: ReplicaStore) -> None:
    replicas.record(_record("http://b:8000"))
    replicas.record(_record("http://a:8000", max_loras=4))
    later = STARTED + timedelta(hours=1)
    replicas.record(
        _record("http://a:8000", max_loras=2, resolver=False, started_at=later, base_digest="x")
    )
    assert [r.url for r in replicas.all()] == ["http://a:8000", "http://b:8000"]
    restarted = replicas.get("http://a:8000")
    assert restarted is not None
    assert (restarted.max_loras, restarted.resolver, restarted.base_digest) == (2, False, "x")
    assert restarted.started_at == later
