"""The loop runner on the stub upstream: real gateway, real store, reactions to real answers.

The nightly stage is a stand-in that puts a known adapter on a 5% canary; the
canary stage reads the gateway's logs from the store and applies the product's
pure canary decision. What the users say comes only from the answers the stub
gave each arm, so a good adapter is promoted and a bad one rolled back.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from feedback.online import adapter_windows
from feedback.schema import feedback_table, interactions_table
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from lab.simulation.loop import CanaryResult, LoopPlan, LoopServices, NightlyResult, run_loop
from lab.simulation.protocol import LoadedUsers
from registry.canary import CanaryAction, CanaryPolicy, decide_canary
from registry.routes import RouteStore
from registry.vllm_server import free_port
from tests.routing import clear_canary, set_canary, set_champion
from tests.servers import serving
from tests.stub_vllm import BASE_MODEL, StubBehaviour, running_stub

KEY = "fw-loop-secret"
LINE = "customer_service"
ADAPTER = f"{LINE}-v1"
HELPFUL = "I am sorry for the trouble, here is the fix."
UNHELPFUL = "Please read the manual."


class ApologyUsers:
    """Satisfied by an apology; say so (or not) with some noise."""

    def prompts(self, business_line: str, n: int, seed: int) -> list[str]:
        return [f"Where is my parcel number {seed}-{i}?" for i in range(n)]

    def react(self, business_line: str, prompt: str, answer: str, seed: int) -> dict[str, Any]:
        draw = (seed % 100) / 100
        if self.satisfied(business_line, prompt, answer):
            return {"type": "thumbs_up"} if draw < 0.4 else {"type": "none"}
        if draw < 0.5:
            return {"type": "thumbs_down"}
        if draw < 0.6:
            return {"type": "edit", "text": HELPFUL}
        if draw < 0.7:
            return {"type": "task_failure"}
        return {"type": "none"}

    def satisfied(self, business_line: str, prompt: str, answer: str) -> bool:
        return "sorry" in answer.lower()


class Stage:
    """Stand-ins for the nightly and canary flows over the real store and routes."""

    def __init__(self, store: FeedbackStore, app: Any) -> None:
        self.store, self.app = store, app
        self.routes = RouteStore(store.engine)
        self.started: datetime | None = None

    def nightly(self, line: str) -> NightlyResult:
        if self.routes.table(line).champion == ADAPTER:
            return NightlyResult("gated_out", "nothing better than the champion")
        self.started = datetime.now(UTC)
        set_canary(self.routes, line, ADAPTER, 0.05, actor="test")
        return NightlyResult("deployed", "v1 on a 5% canary", 1, ADAPTER)

    def canary(self, line: str) -> CanaryResult:
        assert self.app.state.gateway.recorder.flush(10)
        assert self.started is not None
        table = self.routes.table(line)
        windows = adapter_windows(
            self.store.engine,
            line,
            [table.champion, table.canary],
            self.started - timedelta(seconds=1),
            datetime.now(UTC) + timedelta(seconds=1),
        )
        from registry.canary import _arm

        rates = ("thumbs_down", "regenerate", "edit", "error", "abandon", "task_failure")
        policy = CanaryPolicy(
            min_requests=15, alpha=0.2, max_looks=5, margins=dict.fromkeys(rates, 0.15)
        )
        decision = decide_canary(
            _arm(windows, table.champion), _arm(windows, table.canary), policy, look=1
        )
        if decision.action is CanaryAction.PROMOTE:
            set_champion(self.routes, line, ADAPTER, actor="test")
            clear_canary(self.routes, line, actor="test")
        elif decision.action is CanaryAction.ROLLBACK:
            clear_canary(self.routes, line, actor="test")
        return CanaryResult(decision.action.value, "; ".join(decision.reasons))


@pytest.fixture
def world(settings: Settings) -> Iterator[tuple[Any, Stage, FeedbackStore]]:
    store = FeedbackStore.open(settings)
    keys = KeyRing([ApiKey(name="ops", sha256=key_digest(KEY), business_lines=("*",))])
    with running_stub(StubBehaviour(adapters={ADAPTER})) as stub:
        config = GatewaySettings(
            upstreams=(stub.base_url,), routes_refresh_s=0.02, log_flush_s=0.02
        )
        app = create_app(settings, config, store=store, routes=RouteStore(store.engine), keys=keys)
        with serving(app, free_port()) as url:
            stage = Stage(store, app)
            services = LoopServices(
                gateway_url=url,
                api_key=KEY,
                vllm_url=stub.base_url,
                base_model=BASE_MODEL,
                nightly=stage.nightly,
                canary=stage.canary,
                routes=stage.routes.table,
            )
            yield stub, stage, store, services


def _plan() -> LoopPlan:
    return LoopPlan(
        LINE,
        nights=2,
        requests=30,
        eval_prompts=20,
        canary_users=40,
        champion_users=40,
        canary_traffic="picked",
    )


def test_users_promote_an_adapter_whose_answers_they_like(world: Any) -> None:
    stub, stage, store, services = world
    stub.behaviour.answers.update({BASE_MODEL: UNHELPFUL, ADAPTER: HELPFUL})
    result = run_loop(_plan(), LoadedUsers("test:ApologyUsers", ApologyUsers()), services)
    first, second = result.nights
    assert first.canary == ADAPTER
    assert first.decision == "promoted", first.canary_decisions
    assert first.served["canary"] >= 40
    assert first.served["base"] >= 40
    assert first.satisfied["canary"] == 1.0
    assert first.satisfied["base"] == 0.0
    assert second.champion == ADAPTER
    assert second.satisfied == {"champion": 1.0}
    assert result.final["base"] == {**result.final["base"], "satisfied": 0.0, "n": 20}
    assert result.final["champion"]["name"] == ADAPTER
    assert result.final["champion"]["satisfied"] == 1.0
    assert result.final["gain"] == 1.0
    # 20 prompts, all won: the paired interval excludes 0 but not the whole way to 1.
    low, high = result.final["gain_interval"]
    assert 0.5 < low < 1.0
    assert high == 1.0
    # Every reaction went through the gateway against the request id it answered.
    assert stage.app.state.gateway.recorder.flush(10)
    with store.engine.connect() as connection:
        orphans = connection.execute(
            select(func.count())
            .select_from(feedback_table)
            .where(feedback_table.c.request_id.not_in(select(interactions_table.c.request_id)))
        ).scalar_one()
        kinds = dict(
            connection.execute(
                select(feedback_table.c.type, func.count()).group_by(feedback_table.c.type)
            ).all()
        )
    assert orphans == 0
    assert {"thumbs_up", "thumbs_down", "edit", "task_outcome"} <= set(kinds)


def test_users_roll_back_an_adapter_whose_answers_got_worse(world: Any) -> None:
    stub, _stage, _store, services = world
    stub.behaviour.answers.update({BASE_MODEL: HELPFUL, ADAPTER: UNHELPFUL})
    plan = LoopPlan(
        LINE,
        nights=1,
        requests=20,
        eval_prompts=10,
        canary_users=40,
        champion_users=40,
        canary_traffic="picked",
    )
    result = run_loop(plan, LoadedUsers("test:ApologyUsers", ApologyUsers()), services)
    (night,) = result.nights
    assert night.decision == "rolled back", night.canary_decisions
    assert night.champion is None
    assert result.final["champion"]["name"] is None
    assert night.satisfied["canary"] == 0.0
    assert night.satisfied["base"] == 1.0


def test_at_its_true_share_the_canary_sees_only_its_users_of_each_day(world: Any) -> None:
    """The default: a first day on the base model, then the night's canary meets the next
    day's users through the gateway's sticky 5% split, the canary flow looking after each
    part of the day; nobody is picked for it."""
    stub, _stage, store, services = world
    stub.behaviour.answers.update({BASE_MODEL: UNHELPFUL, ADAPTER: HELPFUL})
    plan = LoopPlan(LINE, nights=1, requests=800, eval_prompts=10, canary_rounds=4)
    result = run_loop(plan, LoadedUsers("test:ApologyUsers", ApologyUsers()), services)
    first_day, night = result.nights
    assert first_day.night == 0
    assert first_day.served == {"base": 800}, first_day.failures
    assert first_day.canary_decisions == []
    assert first_day.nightly["status"] == "none"
    assert night.nightly["status"] == "deployed"
    assert night.canary == ADAPTER
    served = night.served.get("canary", 0) + night.served.get("base", 0)
    assert served == 800, night.failures
    # 400 users a day, each asking twice: about 20 on a 5% canary (binomial 1%-99%: 10-30).
    assert 20 <= night.served.get("canary", 0) <= 60
    assert 1 <= len(night.canary_decisions) <= 4
    assert result.as_dict()["canary_traffic"].startswith("the canary's true share")
    with store.engine.connect() as connection:
        users = (
            connection.execute(
                select(interactions_table.c.user_id).where(
                    interactions_table.c.adapter_name == ADAPTER
                )
            )
            .scalars()
            .all()
        )
    assert len(users) == night.served["canary"]
    assert all("-n1-user-" in user for user in users)
