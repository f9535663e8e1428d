"""What one user and one key may move in a look: the pure bound, and the canary's and the
experiments' looks counting within it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from composition.rollout import deploy_canary, judge_canary
from feedback.contributions import Answer, LookBound, counted_requests
from feedback.online import adapter_windows
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from registry.canary import CanaryAction, CanaryPolicy
from registry.experiment_store import current_look
from tests.experiment_traffic import START, interaction, start
from tests.reactions import arm_events
from tests.unit.test_rollout_stub import LINE, World, world  # noqa: F401 (the fixture)

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _answer(n: int, user: str | None = None, key: str | None = "app", **extra: Any) -> Answer:
    return Answer(f"r{n}", T0 + timedelta(seconds=n), user, key_name=key, **extra)


def test_each_user_counts_their_earliest_answers_up_to_the_bound() -> None:
    heavy = [_answer(n, "heavy") for n in range(50)]
    others = [_answer(100 + n, f"u{n}") for n in range(10)]
    counted = counted_requests([*reversed(heavy), *others], LookBound(per_user=5))
    assert counted == {f"r{n}" for n in range(5)} | {f"r{100 + n}" for n in range(10)}


def test_anonymous_answers_count_by_session_else_as_their_keys_one_owner() -> None:
    sessions = [_answer(n, session_id=f"s{n % 3}") for n in range(30)]
    bare = [_answer(100 + n) for n in range(30)]
    imported = [_answer(200 + n, key=None) for n in range(30)]
    counted = counted_requests(sessions + bare + imported, LookBound(per_user=2))
    assert len([r for r in counted if int(r[1:]) < 100]) == 6  # two per session
    assert {r for r in counted if 100 <= int(r[1:]) < 200} == {"r100", "r101"}  # the key's
    assert len([r for r in counted if int(r[1:]) >= 200]) == 30  # each its own


def test_a_key_holds_at_most_its_share_when_other_keys_sent_answers() -> None:
    real = [_answer(n, f"real-{n}", key="app") for n in range(20)]
    sybils = [_answer(100 + n, f"sybil-{n}", key="mallory") for n in range(60)]
    counted = counted_requests(real + sybils, LookBound(key_share=0.5))
    assert len(counted) == 40
    assert sum(r.startswith("r1") and len(r) == 4 for r in counted) == 20  # r100..r119
    # A key alone on a line holds what it holds.
    assert len(counted_requests(sybils, LookBound(key_share=0.5))) == 60


def test_what_a_look_counts_only_grows_as_answers_arrive() -> None:
    answers = [_answer(n, f"u{n % 7}", key=("app", "other", "third")[n % 3]) for n in range(300)]
    bound = LookBound(per_user=10, key_share=0.4)
    earlier: set[str] = set()
    for seen in range(0, 301, 25):
        now = counted_requests(answers[:seen], bound)
        assert earlier <= now
        earlier = now


def test_a_bound_needs_sane_numbers() -> None:
    with pytest.raises(ValueError, match="per_user"):
        LookBound(per_user=0)
    with pytest.raises(ValueError, match="key_share"):
        LookBound(key_share=0)


def _heavy_user(adapter: str, answers: int, when: datetime) -> list[dict[str, Any]]:
    """One user's ``answers`` answers on ``adapter``, every one thumbed down."""
    events: list[dict[str, Any]] = []
    for index in range(answers):
        request_id = f"heavy-{adapter}-{index}"
        created = (when + timedelta(milliseconds=10 * index)).isoformat()
        events += [
            {
                "type": "interaction",
                "request_id": request_id,
                "user_id": "heavy",
                "key_name": "app",
                "business_line": LINE,
                "adapter_name": adapter,
                "base_model": "base",
                "messages": [{"role": "user", "content": f"again {index}"}],
                "response": "an answer",
                "latency_ms": 100.0,
                "status": "ok",
                "created_at": created,
            },
            {"type": "thumbs_down", "request_id": request_id, "created_at": created},
        ]
    return events


def test_a_canary_look_counts_a_hyperactive_users_first_answers_only(world: World) -> None:  # noqa: F811
    champion, canary = world.register(), world.register()
    deploy_canary(world.settings, world.clients, LINE, champion, world.urls)
    judge_canary(world.settings, world.clients, LINE, force=CanaryAction.PROMOTE,
                 upstreams=world.urls)  # fmt: skip
    deploy_canary(world.settings, world.clients, LINE, canary, world.urls)
    now = datetime.now(UTC)
    events = arm_events(LINE, f"{LINE}-v{champion}", 60, 3, now)
    events += arm_events(LINE, f"{LINE}-v{canary}", 60, 3, now)
    events += _heavy_user(f"{LINE}-v{canary}", 100, now)
    assert world.store.ingest(events, source="t").quarantined == 0

    outcome = judge_canary(world.settings, world.clients, LINE, upstreams=world.urls,
                           now=now + timedelta(minutes=5))  # fmt: skip

    per_user = CanaryPolicy().max_answers_per_user
    counted = outcome.numbers["canary"]
    assert counted["requests"] == 60 + per_user
    assert counted["signals"]["thumbs_down"] == 3 + per_user
    assert outcome.numbers["champion"]["requests"] == 60


def test_adapter_windows_count_every_answer_unless_bounded(settings: Settings) -> None:
    store = FeedbackStore.open(settings)
    store.ingest(_heavy_user(f"{LINE}-v1", 30, T0), source="t")
    until = T0 + timedelta(hours=1)
    every = adapter_windows(store.engine, LINE, [f"{LINE}-v1"], T0, until)
    bounded = adapter_windows(store.engine, LINE, [f"{LINE}-v1"], T0, until, LookBound(per_user=4))
    store.close()
    assert (every[f"{LINE}-v1"].requests, bounded[f"{LINE}-v1"].requests) == (30, 4)
    assert bounded[f"{LINE}-v1"].signals["dissatisfied"] == 4


def test_an_experiment_look_counts_each_users_first_answers(settings: Settings) -> None:
    store = FeedbackStore.open(settings)
    record = start(store)
    events = []
    for index in range(40):
        at = START + timedelta(minutes=index)
        user = "heavy" if index < 30 else f"user-{index}"
        events.append(interaction(f"req-{index}", "experiment_b", at, user=user))
        events.append(interaction(f"req-a-{index}", "experiment_a", at, user=f"a-{index}"))
    store.ingest(events, source="t")
    until = START + timedelta(days=1)
    every = current_look(store.engine, record, until)
    bounded = current_look(store.engine, record, until, LookBound(per_user=5))
    store.close()
    assert (every.b.samples, every.a.samples) == (40, 40)
    assert (bounded.b.samples, bounded.a.samples) == (15, 40)
