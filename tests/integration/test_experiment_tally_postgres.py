"""An A/B experiment's running tally on real PostgreSQL: equal to a recount through rounds
of late feedback and an end, and racing folds count each row once (the plans on a big
store are lab/bench/dashboard_bench.py's: a small table is scanned whatever the indexes)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

from feedback.store import FeedbackStore, create_store_engine, upgrade_schema
from registry.experiment_store import STOPPED, end_experiment, get_experiment
from registry.experiment_tally import fold_tally
from tests.experiment_traffic import START, Traffic, recounted, start, tallied

pytestmark = pytest.mark.integration
FOREVER = timedelta(days=36_500)


@pytest.fixture
def store(postgres_url: str) -> Iterator[FeedbackStore]:
    engine = create_store_engine(postgres_url)
    upgrade_schema(engine)
    opened = FeedbackStore(engine)
    yield opened
    engine.dispose()


def test_the_tally_on_postgres(store: FeedbackStore) -> None:
    record = start(store)
    traffic = Traffic(store, rng=random.Random(21))
    for number in range(4):
        traffic.round(requests=300, late=150)
        expected = recounted(store.engine, record)
        assert tallied(store.engine, record, FOREVER) == expected
        if number % 2 == 0:
            fold_tally(store.engine, record, grace=timedelta(0))
        assert tallied(store.engine, record) == expected

    traffic.round(requests=300, late=300)
    threads = [
        threading.Thread(
            target=fold_tally, args=(store.engine, record), kwargs={"grace": timedelta(0)}
        )
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tallied(store.engine, record) == recounted(store.engine, record)

    end_experiment(store.engine, record.id, STOPPED, "enough", START + timedelta(days=1))
    ended = get_experiment(store.engine, record.id)
    assert ended is not None
    assert tallied(store.engine, ended) == recounted(store.engine, ended)
