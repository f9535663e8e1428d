"""An A/B experiment's running tally on SQLite: equal to a recount of the raw tables after
every fold, with late feedback, an end, racing folds and deletions; what the page shows."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from feedback.retention import RetentionPolicy, apply_retention
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from registry.experiment_store import (
    STOPPED,
    current_look,
    end_experiment,
    get_experiment,
)
from registry.experiment_tally import arm_tallies, fold_tally
from registry.experiments import FLAGS, METRICS, flag_mask, metric_counts
from registry.tables import experiment_tallies_table, experiment_tally_marks_table
from tests.experiment_traffic import (
    FAR,
    START,
    Traffic,
    feedback,
    interaction,
    recounted,
    start,
    tallied,
)

HOUR = timedelta(hours=1)
FOREVER = timedelta(days=36_500)  # nothing is old enough to fold: everything is the live tail


@pytest.fixture
def store(settings: Settings) -> Iterator[FeedbackStore]:
    opened = FeedbackStore.open(settings)
    yield opened
    opened.close()


def _marks(store: FeedbackStore, experiment_id: int) -> tuple[int, int]:
    table = experiment_tally_marks_table.c
    with store.engine.connect() as connection:
        row = connection.execute(
            select(table.interaction_id, table.feedback_id).where(
                table.experiment_id == experiment_id
            )
        ).one()
    return int(row.interaction_id), int(row.feedback_id)


def test_the_tally_equals_a_recount_through_rounds_of_late_feedback(store: FeedbackStore) -> None:
    record = start(store)
    traffic = Traffic(store)
    marks = []
    for number in range(6):
        traffic.round(requests=120, late=60)
        expected = recounted(store.engine, record)
        assert tallied(store.engine, record, FOREVER) == expected  # counted live
        if number % 2 == 0:
            assert fold_tally(store.engine, record, grace=timedelta(0))
            marks.append(_marks(store, record.id))
        assert tallied(store.engine, record, FOREVER) == expected  # folded + the tail
        assert tallied(store.engine, record) == expected  # folded to the last row
    assert marks == sorted(marks)
    assert marks[0] < marks[-1]
    assert not fold_tally(store.engine, record, grace=timedelta(0))  # nothing new
    # The numbers are not trivial: every metric has samples on both arms.
    final = recounted(store.engine, record)
    assert all(final[arm][name].samples > 0 for arm in ("a", "b") for name in METRICS)
    # And the page's verdict is the look's.
    assert arm_tallies(store.engine, record).look() == current_look(store.engine, record, FAR)


def test_late_feedback_moves_a_counted_request(store: FeedbackStore) -> None:
    record = start(store)
    request_id, at, arm = "req-late", START + HOUR, "b"
    rng = random.Random(0)
    store.ingest([interaction(request_id, "experiment_b", at),
                  feedback(rng, request_id, at, 1, "thumbs_up")], source="test")  # fmt: skip
    fold_tally(store.engine, record, grace=timedelta(0))
    before = tallied(store.engine, record)
    assert before[arm]["satisfied"].hits == 1
    # A day later the user comes back and marks the answer down: no longer satisfied.
    store.ingest([feedback(rng, request_id, at + timedelta(days=1), 2, "thumbs_down")],
                 source="test")  # fmt: skip
    assert tallied(store.engine, record, FOREVER)[arm]["satisfied"].hits == 0  # live
    assert fold_tally(store.engine, record, grace=timedelta(0))
    after = tallied(store.engine, record)
    assert (after[arm]["satisfied"].samples, after[arm]["satisfied"].hits) == (1, 0)
    assert after[arm]["thumbs_up"].hits == 1
    assert after == recounted(store.engine, record)


def test_an_ended_experiment_drops_what_it_counted_past_its_end(store: FeedbackStore) -> None:
    record = start(store)
    traffic = Traffic(store, rng=random.Random(5))
    traffic.round(requests=200, late=0, until=timedelta(days=2))
    fold_tally(store.engine, record, grace=timedelta(0))  # counted while running: no end yet
    end_experiment(store.engine, record.id, STOPPED, "enough", START + timedelta(days=1))
    ended = get_experiment(store.engine, record.id)
    assert ended is not None
    assert ended.ended_at is not None
    expected = recounted(store.engine, ended)
    assert expected != recounted(store.engine, record)  # the end leaves requests out
    assert tallied(store.engine, ended, FOREVER) == expected  # window closed in the tail
    assert tallied(store.engine, ended) == expected  # and by the fold
    # Late feedback still counts for requests inside the window, never for those past it.
    traffic.round(requests=30, late=80, until=timedelta(days=2))
    assert tallied(store.engine, ended) == recounted(store.engine, ended)


def test_racing_folds_count_each_row_once(store: FeedbackStore) -> None:
    record = start(store)
    traffic = Traffic(store, rng=random.Random(7))
    traffic.round(requests=300, late=0)
    fold_tally(store.engine, record, grace=timedelta(0))
    traffic.round(requests=300, late=200)
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


def test_deletions_make_the_tally_count_again(store: FeedbackStore) -> None:
    record = start(store)
    traffic = Traffic(store, rng=random.Random(9))
    traffic.round(requests=200, late=50, until=timedelta(days=6))
    fold_tally(store.engine, record, grace=timedelta(0))
    store.forget_user("user-3")
    assert tallied(store.engine, record) == recounted(store.engine, record)

    now = START + timedelta(days=8)
    policy = RetentionPolicy(raw_days=5, action="delete")
    report = apply_retention(store.engine, "legal", policy, lambda records, _: records, now=now)
    assert report.interactions > 0
    with store.engine.connect() as connection:
        left = connection.execute(select(func.count()).select_from(experiment_tallies_table))
        assert left.scalar_one() == 0  # started before the cutoff: counted again on next view
    assert tallied(store.engine, record) == recounted(store.engine, record)


def test_each_metric_from_flag_masks_follows_its_rule() -> None:
    # Two flags per request over every pair: the rule of registry.experiments by hand.
    tally = {flag_mask((x, y)): 1 for i, x in enumerate(FLAGS) for y in FLAGS[i:]}
    for name, count in metric_counts(tally).items():
        metric = METRICS[name]
        samples = hits = 0
        for mask in tally:
            flags = {f for bit, f in enumerate(FLAGS) if mask >> bit & 1}
            if metric.among and not flags & set(metric.among):
                continue
            samples += 1
            hits += bool(flags & set(metric.hit_any)) and not flags & set(metric.hit_none)
        assert (count.samples, count.hits) == (samples, hits), name


def test_the_page_shows_the_tally_and_when_it_was_counted(store: FeedbackStore,
                                                          settings: Settings) -> None:  # fmt: skip
    from fastapi.testclient import TestClient

    from dashboard.app import create_app
    from feedback.pii import build_scrubber
    from flywheel.settings.dashboard import DashboardSettings
    from gateway.keys import ApiKey, KeyRing, key_digest
    from registry.routes import RouteStore

    record = start(store)
    Traffic(store, rng=random.Random(13)).round(requests=150, late=0, until=HOUR)
    keys = KeyRing([ApiKey(name="pm", sha256=key_digest("fw-pm"), business_lines=("legal",))])
    app = create_app(
        settings,
        DashboardSettings(rollup_grace_s=0),
        store=store,
        routes=RouteStore(store.engine),
        scrubber_factory=build_scrubber,  # loads on a first sample: never here
        keys=keys,
    )
    expected = current_look(store.engine, record, datetime.now(UTC))
    headers = {"Authorization": "Bearer fw-pm"}
    with TestClient(app, client=("203.0.113.9", 5000), headers=headers) as page:
        data = page.get(f"/api/lines/legal/experiments/{record.id}").json()
        shown = page.get(f"/lines/legal/experiments/{record.id}").text
        listed = page.get("/api/lines/legal/experiments").json()
    assert (data["now"]["a_samples"], data["now"]["b_samples"]) == (
        expected.a.samples,
        expected.b.samples,
    )
    assert data["now"]["p_value"] == expected.p_value
    # Its metric counts every request: the samples are the arms' requests.
    assert (data["now"]["a_requests"], data["now"]["b_requests"]) == (
        expected.a.samples,
        expected.b.samples,
    )
    assert datetime.fromisoformat(data["now"]["counted_at"]) <= datetime.now(UTC)
    assert 'id="counted"' in shown
    assert "Numbers as of" in shown
    assert listed[0]["now"]["a_samples"] == expected.a.samples


def test_another_line_s_retention_keeps_the_tally(store: FeedbackStore) -> None:
    record = start(store)
    Traffic(store, rng=random.Random(5)).round(requests=100, late=20)
    fold_tally(store.engine, record, grace=timedelta(0))
    old = START - timedelta(days=30)
    medical = [interaction(f"medical-{n}", None, old, line="medical") for n in range(3)]
    store.ingest(medical, source="test")

    policy = RetentionPolicy(raw_days=5, action="delete")
    report = apply_retention(store.engine, "medical", policy, lambda records, _: records, now=START)

    assert report.interactions == 3
    with store.engine.connect() as connection:
        left = connection.execute(select(func.count()).select_from(experiment_tallies_table))
        assert left.scalar_one() > 0  # no request of the legal line went: nothing to recount
    assert tallied(store.engine, record) == recounted(store.engine, record)
