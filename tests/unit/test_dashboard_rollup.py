"""The hourly signal rollup on SQLite: exact against a recount, incremental, race-safe."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from feedback.rollup import RollupQuery, SignalRollup, floor_hour, rebuild_rollup
from feedback.schema import interactions_table
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator
from tests.dashboard_store import recount
from tests.served_traffic import ServingPlan, served_events

START = datetime(2026, 11, 1, tzinfo=UTC)


def traffic(requests: int, seed: int = 5) -> list[dict[str, object]]:
    simulator = TrafficSimulator(
        SimulationSettings(requests=requests, seed=seed, start=START, span=timedelta(days=2))
    )
    return list(served_events(simulator, ServingPlan()))


def as_counter(
    rollup: SignalRollup, query: RollupQuery | None = None
) -> Counter[tuple[str, str, datetime, str]]:
    return Counter(
        {
            (c.business_line, c.adapter, c.hour, c.signal): c.count
            for c in rollup.counts(query or RollupQuery())
        }
    )


@pytest.fixture
def store(settings: Settings) -> Iterator[FeedbackStore]:
    opened = FeedbackStore.open(settings)
    yield opened
    opened.close()


def test_folded_and_live_counts_both_match_a_recount(store: FeedbackStore) -> None:
    store.ingest(traffic(800), source="test")
    expected = recount(store)
    assert sum(v for k, v in expected.items() if k[3] == "requests") >= 800

    live = SignalRollup(store.engine, grace=timedelta(days=365))  # nothing old enough to fold
    assert as_counter(live) == expected
    assert live.watermarks() == {"interactions": 0, "feedback_events": 0}

    folded = SignalRollup(store.engine, grace=timedelta(0))
    assert folded.refresh(force=True) > 800
    assert as_counter(folded) == expected
    assert min(folded.watermarks().values()) > 0
    assert folded.refresh(force=True) == 0  # nothing new


def test_new_rows_are_folded_incrementally(store: FeedbackStore) -> None:
    events = traffic(900)
    rollup = SignalRollup(store.engine, grace=timedelta(0), min_fold_interval_s=0, tail_ttl_s=0)
    store.ingest(events[:700], source="test")
    assert as_counter(rollup) == recount(store)
    before = rollup.watermarks()
    store.ingest(events[700:], source="test")
    assert rollup.refresh(force=True) == len(events) - 700  # only the new rows
    assert rollup.watermarks()["interactions"] > before["interactions"]
    assert as_counter(rollup) == recount(store)


def test_filters_select_a_line_an_adapter_and_hours(store: FeedbackStore) -> None:
    store.ingest(traffic(600), source="test")
    rollup = SignalRollup(store.engine, grace=timedelta(0))
    since, until = START + timedelta(hours=6), START + timedelta(hours=30)
    query = RollupQuery("legal", since, until, "legal-v2")
    got = as_counter(rollup, query)
    want = Counter(
        {
            key: n
            for key, n in recount(store).items()
            if key[0] == "legal" and key[1] == "legal-v2" and since <= key[2] < until
        }
    )
    assert got == want
    assert got
    assert rollup.adapters("legal") == ["legal-v1", "legal-v2", "legal-v3"]
    assert rollup.lines() == ["customer_service", "legal", "medical"]
    first, last = rollup.span("legal")
    assert first == START
    assert last <= START + timedelta(days=2, hours=1)


def test_two_folds_at_once_count_each_row_once(store: FeedbackStore) -> None:
    store.ingest(traffic(1500), source="test")
    expected = recount(store)
    rollups = [SignalRollup(store.engine, grace=timedelta(0)) for _ in range(3)]
    threads = [threading.Thread(target=r.refresh, kwargs={"force": True}) for r in rollups]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert as_counter(rollups[0]) == expected


def test_forgetting_a_user_recounts_and_a_rebuild_changes_nothing(store: FeedbackStore) -> None:
    store.ingest(traffic(400), source="test")
    rollup = SignalRollup(store.engine, grace=timedelta(0), tail_ttl_s=0)
    before = as_counter(rollup)
    with store.engine.connect() as connection:
        someone = connection.execute(select(interactions_table.c.user_id).limit(1)).scalar_one()
    store.forget_user(someone)
    after = as_counter(rollup)
    assert after == recount(store)
    assert sum(after.values()) < sum(before.values())
    rebuild_rollup(store.engine)
    assert as_counter(rollup) == after


def test_a_late_outcome_counts_for_the_hour_of_its_answer(store: FeedbackStore) -> None:
    at = START + timedelta(hours=3, minutes=20)
    interaction = {
        "type": "interaction",
        "request_id": "r-late",
        "business_line": "legal",
        "adapter_name": "legal-v2",
        "base_model": "m",
        "messages": [{"role": "user", "content": "Is this contract valid?"}],
        "response": "It depends.",
        "created_at": at.isoformat(),
    }
    outcome = {
        "type": "task_outcome",
        "request_id": "r-late",
        "outcome": "success",
        "created_at": (at + timedelta(days=3)).isoformat(),
    }
    store.ingest([interaction, outcome], source="test")
    cells = SignalRollup(store.engine, grace=timedelta(0)).counts(RollupQuery("legal"))
    assert {(c.hour, c.signal) for c in cells} == {
        (floor_hour(at), "requests"),
        (floor_hour(at), "task_success"),
    }
