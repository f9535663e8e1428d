"""Simulated reviewers in the loop, on the stub upstream: real gateway, store and page.

Users react to both arms alike (a thumbs-up now and then, whatever the answer), so
on their signals alone the canary is non-inferior and promoted. Reviewers on the
feedback page's review queue judge the answers by the users' hidden
``satisfied()`` with 10% noise, blind to the arm; the canary's answers miss what
users want, reviewers fail them, and the canary flow (the product's decision with
the recipe's pass-rate test) holds it back.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from composition.recipes import recipe_for
from feedback.online import adapter_windows
from feedback.store import FeedbackStore
from flywheel.settings import Settings, load_settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, add_key, key_digest
from lab.simulation.loop import CanaryResult, LoopPlan, LoopServices, NightlyResult, run_loop
from lab.simulation.protocol import LoadedUsers
from registry.canary import PASS_RATE, CanaryAction, CanaryPolicy, _arm, decide_canary
from registry.canary import RATES as CANARY_RATES
from registry.routes import RouteStore
from registry.vllm_server import free_port
from tests.review_world import write_recipe
from tests.routing import clear_canary, set_canary, set_champion
from tests.servers import serving
from tests.stub_vllm import BASE_MODEL, StubBehaviour, running_stub

KEY = "fw-loop-secret"
LINE = "customer_service"
ADAPTER = f"{LINE}-v1"
HELPFUL = "I am sorry for the trouble, here is the fix."
UNHELPFUL = "Please read the manual."
RATES = ("thumbs_down", "regenerate", "edit", "error", "abandon", "task_failure")


class IndifferentUsers:
    """Want an apology, but say nothing about it: a thumbs-up on 40% of any answer."""

    def prompts(self, business_line: str, n: int, seed: int) -> list[str]:
        return [f"Where is my parcel number {seed}-{i}?" for i in range(n)]

    def react(self, business_line: str, prompt: str, answer: str, seed: int) -> dict[str, Any]:
        return {"type": "thumbs_up"} if seed % 100 < 40 else {"type": "none"}

    def satisfied(self, business_line: str, prompt: str, answer: str) -> bool:
        return "sorry" in answer.lower()


class Stage:
    """Stand-ins for the nightly and canary flows over the real store and routes; the
    canary decision is the product's, with the recipe's pass-rate test."""

    def __init__(self, settings: Settings, store: FeedbackStore, app: Any) -> None:
        from composition.recipes import load_recipe

        self.store, self.app = store, app
        self.routes = RouteStore(store.engine)
        self.started: datetime | None = None
        assert settings.recipes_dir is not None
        recipe = load_recipe(LINE, settings.recipes_dir)
        self.policy = CanaryPolicy(
            min_requests=15, alpha=0.2, max_looks=5, margins=dict.fromkeys(CANARY_RATES, 0.15)
        ).model_copy(update={"reviews": recipe.canary_policy().reviews})
        self.checks: list[Any] = []

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
        decision = decide_canary(
            _arm(windows, table.champion), _arm(windows, table.canary), self.policy, look=1
        )
        self.checks.append({c.metric: c for c in decision.checks})
        if decision.action is CanaryAction.PROMOTE:
            set_champion(self.routes, line, ADAPTER, actor="test")
            clear_canary(self.routes, line, actor="test")
        elif decision.action is CanaryAction.ROLLBACK:
            clear_canary(self.routes, line, actor="test")
        return CanaryResult(decision.action.value, "; ".join(decision.reasons))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Any, Stage, LoopServices]]:
    from dashboard.app import create_app as create_page
    from flywheel.settings.dashboard import DashboardSettings
    from tests.dashboard_store import shared_scrubber

    home = tmp_path / "home"
    write_recipe(home / "recipes", LINE, share=1.0, min_reviews=0, margin=0.15)
    settings = load_settings(
        home=home, database_url=f"sqlite:///{home / 'flywheel.db'}", recipes_dir=home / "recipes"
    )
    store = FeedbackStore.open(settings)
    keys_file = home / "gateway-keys.yaml"
    reviewers = tuple(add_key(keys_file, f"reviewer-{n}", [LINE], [LINE]) for n in range(2))
    keys = KeyRing([ApiKey(name="ops", sha256=key_digest(KEY), business_lines=("*",))])
    page = create_page(
        settings,
        DashboardSettings(rollup_grace_s=0, rollup_interval_s=0),
        store=store,
        routes=RouteStore(store.engine),
        keys_file=keys_file,
        scrubber_factory=shared_scrubber,
        review_policy_of=lambda line: recipe_for(settings, line).review,
    )
    with running_stub(StubBehaviour(adapters={ADAPTER})) as stub:
        config = GatewaySettings(
            upstreams=(stub.base_url,), routes_refresh_s=0.02, log_flush_s=0.02
        )
        app = create_app(settings, config, store=store, routes=RouteStore(store.engine), keys=keys)
        with serving(app, free_port()) as url, serving(page, free_port()) as page_url:
            stage = Stage(settings, store, app)
            services = LoopServices(
                gateway_url=url,
                api_key=KEY,
                vllm_url=stub.base_url,
                base_model=BASE_MODEL,
                nightly=stage.nightly,
                canary=stage.canary,
                routes=stage.routes.table,
                review_url=page_url,
                reviewer_keys=reviewers,
                stored=lambda: app.state.gateway.recorder.flush(10),
            )
            yield stub, stage, services
    store.close()


def _plan(reviews: int) -> LoopPlan:
    return LoopPlan(
        LINE,
        nights=1,
        requests=20,
        eval_prompts=10,
        canary_users=40,
        champion_users=40,
        canary_rounds=2,
        canary_traffic="picked",
        reviews_per_round=reviews,
        review_noise=0.1,
    )


def _shared_day_plan(review_corrections: float = 0.0) -> LoopPlan:
    """One night on the canary's true share, 8 noiseless reviews per round."""
    return LoopPlan(
        LINE,
        nights=1,
        requests=20,
        eval_prompts=10,
        canary_rounds=2,
        canary_traffic="share",
        reviews_per_round=8,
        review_noise=0.0,
        review_corrections=review_corrections,
    )


def test_a_canary_users_rate_non_inferior_but_reviewers_fail_is_held_back(world: Any) -> None:
    stub, stage, services = world
    stub.behaviour.answers.update({BASE_MODEL: HELPFUL, ADAPTER: UNHELPFUL})
    users = LoadedUsers("test:IndifferentUsers", IndifferentUsers())
    result = run_loop(_plan(reviews=60), users, services)
    (night,) = result.nights
    assert night.decision == "rolled back", night.canary_decisions
    assert night.champion is None
    # The users said the same of both arms; the reviewers told them apart.
    (checks,) = stage.checks
    assert all(checks[f"{rate}_rate"].verdict != "WORSE" for rate in RATES)
    assert checks[PASS_RATE].verdict == "WORSE"
    assert checks[PASS_RATE].canary < 0.3 < 0.7 < checks[PASS_RATE].champion
    assert night.reviews["passed"] + night.reviews["failed"] == 60
    assert "pass rate" in night.canary_decisions[0]["reason"]


def test_without_reviewers_the_same_canary_is_promoted(world: Any) -> None:
    stub, _stage, services = world
    stub.behaviour.answers.update({BASE_MODEL: HELPFUL, ADAPTER: UNHELPFUL})
    users = LoadedUsers("test:IndifferentUsers", IndifferentUsers())
    result = run_loop(_plan(reviews=0), users, services)
    (night,) = result.nights
    assert night.decision == "promoted", night.canary_decisions
    assert night.reviews == {}
    assert night.satisfied["canary"] == 0.0  # promoted though users are not served well


def test_reviewers_check_the_champion_on_a_day_without_a_canary(world: Any) -> None:
    """Spot checks are every day's work: on the first day (the base model alone, no
    canary) the reviewers check their sample too: their verdicts are the night's labels."""
    stub, _stage, services = world
    stub.behaviour.answers.update({BASE_MODEL: HELPFUL, ADAPTER: UNHELPFUL})
    users = LoadedUsers("test:IndifferentUsers", IndifferentUsers())
    result = run_loop(_shared_day_plan(), users, services)
    first_day = result.nights[0]
    assert first_day.canary is None
    assert first_day.reviews == {"passed": 16, "failed": 0}, first_day.reviews


class CorrectingUsers(IndifferentUsers):
    """The same users, whose review team can rewrite an answer as they wanted it."""

    def correct(self, business_line: str, prompt: str, answer: str) -> str:
        return HELPFUL


def test_reviewers_correct_the_answers_they_fail_and_the_page_stores_them_as_edits(
    world: Any,
) -> None:
    """A line whose users never edit still gets written examples: a reviewer's correction
    is stored on the review event as the edited answer, for the night's SFT set."""
    from sqlalchemy import select

    from feedback.schema import FeedbackEvent

    stub, stage, services = world
    stub.behaviour.answers.update({BASE_MODEL: UNHELPFUL, ADAPTER: UNHELPFUL})
    users = LoadedUsers("test:CorrectingUsers", CorrectingUsers())
    plan = _shared_day_plan(review_corrections=1.0)
    first_day = run_loop(plan, users, services).nights[0]
    assert first_day.reviews == {"passed": 0, "failed": 16, "corrected": 16}, first_day.reviews
    with stage.store.engine.connect() as connection:
        stored = connection.execute(
            select(FeedbackEvent.type, FeedbackEvent.edited_text).where(
                FeedbackEvent.type == "review"
            )
        ).all()
    assert len(stored) >= 16
    assert {text for _type, text in stored} == {HELPFUL}
