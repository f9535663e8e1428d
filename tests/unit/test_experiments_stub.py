"""A/B experiments on real parts around a stand-in vLLM: the SQLite store, a local MLflow
registry, the real gateway and the ``flywheel`` command. The slow tier runs one on real
vLLM with simulated users (tests/integration/test_experiment_vllm.py)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import select

from composition.clients import Clients
from composition.experiments import (
    look_experiment,
    promote_experiment,
    start_experiment,
    stop_experiment,
)
from composition.rollout import deploy_canary, judge_canary
from dashboard.app import create_app as create_dashboard
from feedback.schema import interactions_table
from feedback.store import FeedbackStore
from flywheel.errors import UsageError
from flywheel.settings import Settings, load_settings
from flywheel.settings.dashboard import DashboardSettings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from registry.adapter_sync import lifecycle_check
from registry.canary import CanaryAction
from registry.experiment_store import experiment_looks, get_experiment
from registry.routes import RouteStore
from registry.routing import choose_arm
from registry.tracking import Registry
from registry.vllm_server import free_port
from tests.dashboard_store import shared_scrubber
from tests.fake_clients import fake_clients
from tests.registered import fake_adapter, register_version
from tests.routing import set_canary
from tests.servers import serving
from tests.stub_vllm import StubBehaviour, StubVllm, running_stub

LINE = "legal"
KEY = "fw-experiment-key"


@dataclass
class World:
    settings: Settings
    store: FeedbackStore
    registry: Registry
    replica: StubVllm
    root: Path

    @property
    def urls(self) -> list[str]:
        return [self.replica.base_url]

    @cached_property
    def clients(self) -> Clients:
        return fake_clients(self.settings, store=self.store, registry=self.registry)

    def register(self) -> str:
        folder = fake_adapter(self.root / f"adapter-{time.monotonic_ns()}")
        return f"{LINE}-v{register_version(self.settings, self.registry, LINE, folder, self.root)}"

    def table(self) -> Any:
        return RouteStore(self.store.engine).table(LINE)

    def start(self, a: str, b: str, **options: Any) -> Any:
        options = {"metric": "task_success", "min_samples": 20, **options}
        return start_experiment(self.settings, self.clients, LINE, a, b, self.urls, **options)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    settings = load_settings()
    store = FeedbackStore.open(settings)
    registry = Registry.for_home(settings.home, settings.mlflow_tracking_uri)
    with running_stub(StubBehaviour()) as replica:
        yield World(settings, store, registry, replica, tmp_path)
    store.close()


def _outcomes(world: World, arm: str, adapter: str | None, n: int, successes: int) -> None:
    """``n`` interactions served by ``arm`` just now, the first ``successes`` of them with a
    successful task outcome and the others with a failed one."""
    now = datetime.now(UTC)
    events: list[dict[str, Any]] = []
    for index in range(n):
        request_id = f"{arm}-{now.timestamp():.6f}-{index}"
        events += [
            {
                "type": "interaction",
                "request_id": request_id,
                "user_id": f"{arm}-user-{index}",
                "business_line": LINE,
                "adapter_name": adapter,
                "base_model": "stub-base",
                "arm": arm,
                "messages": [{"role": "user", "content": f"question {index}"}],
                "response": "an answer",
                "status": "ok",
                "created_at": now.isoformat(),
            },
            {
                "type": "task_outcome",
                "request_id": request_id,
                "outcome": "success" if index < successes else "failure",
                "idempotency_key": f"outcome-{request_id}",
                "created_at": now.isoformat(),
            },
        ]
    report = world.store.ingest(events, source="test")
    assert report.quarantined == 0, report.rejections


def test_one_rollout_at_a_time_and_the_arms_checked(world: World) -> None:
    v1, v2 = world.register(), world.register()
    with pytest.raises(UsageError, match="has no version 99"):
        world.start(v1, "v99")
    with pytest.raises(UsageError, match="nothing to compare"):
        world.start(v1, v1)
    with pytest.raises(UsageError, match="unknown metric"):
        world.start(v1, v2, metric="revenue")
    with pytest.raises(UsageError, match="--share"):
        world.start(v1, v2, share=1.0)
    assert deploy_canary(world.settings, world.clients, LINE, 1, world.urls).status == "canary"
    with pytest.raises(UsageError, match="canary legal-v1 is live"):
        world.start("champion", v2)
    judge_canary(world.settings, world.clients, LINE, force=CanaryAction.ROLLBACK,
                 reason="make room", upstreams=world.urls)  # fmt: skip

    record = world.start("base", v2, share=0.4)
    assert (record.arm_a, record.arm_b, record.share) == (None, v2, 0.4)
    assert record.policy.alpha == 0.05  # the recipe's canary alpha
    assert world.table().experiment.id == record.id
    assert v2 in world.replica.behaviour.adapters  # loaded and probed
    # The other rollouts wait: a canary deploy, a canary by hand, a second experiment.
    refused = deploy_canary(world.settings, world.clients, LINE, 1, world.urls)
    assert refused.status == "refused"
    assert "experiment" in refused.reason
    with pytest.raises(UsageError, match="one rollout at a time"):
        set_canary(RouteStore(world.store.engine), LINE, v1, 0.05, actor="test")
    with pytest.raises(UsageError, match="already live"):
        world.start(v1, v2)
    assert lifecycle_check(world.settings, world.clients, world.urls)["problems"] == []

    stopped = stop_experiment(world.settings, world.clients, LINE, world.urls, reason="enough")
    assert stopped.record.status == "stopped"
    assert stopped.record.ended_reason == "enough"
    assert world.table().experiment is None
    assert v2 not in world.replica.behaviour.adapters  # no route names it any more
    actions = [c.action for c in RouteStore(world.store.engine).history(LINE)]
    assert actions[:2] == ["experiment_stop", "experiment_start"]
    with pytest.raises(UsageError, match="no experiment is live"):
        stop_experiment(world.settings, world.clients, LINE, world.urls)


def test_the_gateway_splits_users_sticky_and_the_winner_is_promoted(world: World) -> None:
    v1, v2 = world.register(), world.register()
    record = world.start(v1, v2, share=0.3)
    table = world.table()
    keys = KeyRing([ApiKey(name="t", sha256=key_digest(KEY), business_lines=(LINE,))])
    config = GatewaySettings(upstreams=tuple(world.urls), routes_refresh_s=0.05, log_flush_s=0.05)
    app = create_app(
        world.settings, config, store=world.store, routes=RouteStore(world.store.engine), keys=keys
    )
    users = [f"shopper-{i}" for i in range(60)]
    served: dict[str, set[str]] = {}
    with serving(app, free_port()) as url:
        for _ in range(2):
            for user in users:
                answer = httpx.post(
                    f"{url}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {KEY}"},
                    json={"model": LINE, "user": user,
                          "messages": [{"role": "user", "content": "hello"}]},
                    timeout=10,
                )  # fmt: skip
                assert answer.status_code == 200, answer.text
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with world.store.engine.connect() as connection:
                rows = connection.execute(select(interactions_table)).all()
            if len(rows) == 2 * len(users):
                break
            time.sleep(0.05)
    # Which adapter answered is the store's to say (no answer tells its caller).
    for row in rows:
        served.setdefault(row.user_id, set()).add(row.adapter_name)
    # Sticky: each user got one adapter both times, the one the split gives them.
    assert all(len(adapters) == 1 for adapters in served.values())
    assert {u: next(iter(a)) for u, a in served.items()} == {
        u: choose_arm(table, u)[1] for u in users
    }
    on_b = sum(served[u] == {v2} for u in users)
    assert 0 < on_b < len(users)
    # Every interaction records its arm and adapter.
    assert len(rows) == 2 * len(users)
    assert {(r.arm, r.adapter_name) for r in rows} == {("experiment_a", v1), ("experiment_b", v2)}

    # Their task outcomes: B's users mostly succeed, A's mostly fail.
    rng = random.Random(5)
    events = []
    for row in rows:
        rate = 0.9 if row.arm == "experiment_b" else 0.3
        outcome = "success" if rng.random() < rate else "failure"
        events.append({"type": "task_outcome", "request_id": row.request_id, "outcome": outcome,
                       "idempotency_key": f"o-{row.request_id}",
                       "created_at": datetime.now(UTC).isoformat()})  # fmt: skip
    assert world.store.ingest(events, source="test").quarantined == 0
    status = look_experiment(world.settings, world.clients, LINE)
    assert status.look is not None
    assert status.look.winner == "b", status.look.reasons
    assert status.look.a.samples + status.look.b.samples == 2 * len(users)
    assert status.record.winner == "b"

    promoted, transition = promote_experiment(world.settings, world.clients, LINE, world.urls)
    assert promoted.record.status == "promoted"
    assert transition.table.champion == v2
    assert world.table().champion == v2
    assert world.table().experiment is None
    assert world.registry.aliases(LINE)["champion"] == int(v2.split("-v")[1])
    assert v1 not in world.replica.behaviour.adapters
    assert lifecycle_check(world.settings, world.clients, world.urls)["problems"] == []
    looks = experiment_looks(world.store.engine, record.id)
    assert [look["look"] for look in looks] == [1, 2]
    assert looks[0]["verdict"] == "b_better"
    run = world.registry.client.get_run(promoted.record.mlflow_run_id)
    assert run.data.tags["ab.winner_adapter"] == v2
    assert run.data.tags["ab.status"] == "promoted"
    assert run.info.status == "FINISHED"
    assert run.data.params["metric"] == "task_success"
    assert "p_value" in run.data.metrics
    # An A/B run trained nothing: the page's training runs leave it out.
    assert promoted.record.mlflow_run_id not in {r.run_id for r in world.registry.recent_runs(LINE)}
    _the_page_shows_it(world, record.id, v2)


def _page(world: World, lines: tuple[str, ...]) -> TestClient:
    keys = KeyRing([ApiKey(name="pm", sha256=key_digest("fw-pm"), business_lines=lines)])
    app = create_dashboard(
        world.settings,
        DashboardSettings(),
        store=world.store,
        routes=RouteStore(world.store.engine),
        scrubber_factory=shared_scrubber,
        keys=keys,
    )
    return TestClient(app, client=("203.0.113.9", 5000), headers={"Authorization": "Bearer fw-pm"})


def _the_page_shows_it(world: World, experiment_id: int, winner: str) -> None:
    with _page(world, (LINE,)) as page:
        listed = page.get(f"/lines/{LINE}/experiments")
        assert listed.status_code == 200, listed.text
        assert f"/lines/{LINE}/experiments/{experiment_id}" in listed.text
        shown = page.get(f"/lines/{LINE}/experiments/{experiment_id}")
        assert shown.status_code == 200, shown.text
        assert f"Decision: B ({winner}) is better" in shown.text
        assert 'id="confidence-sequence"' in shown.text
        data = page.get(f"/api/lines/{LINE}/experiments/{experiment_id}").json()
        assert (data["winner"], data["status"], data["winner_adapter"]) == ("b", "promoted", winner)
        assert [look["look"] for look in data["looks"]] == [1, 2]
        assert data["now"]["a_samples"] + data["now"]["b_samples"] == 120
        overview = page.get(f"/lines/{LINE}")
        assert f"/lines/{LINE}/experiments" in overview.text
        # Ids are scoped by line: this line has no experiment 999, another line none of ours.
        assert page.get(f"/lines/{LINE}/experiments/999").status_code == 404
        assert page.get(f"/lines/{LINE}/experiments/x1").status_code == 404
    with _page(world, ("medical",)) as other:
        assert other.get(f"/lines/{LINE}/experiments/{experiment_id}").status_code == 403
        assert other.get(f"/api/lines/{LINE}/experiments").status_code == 403
        assert other.get(f"/lines/medical/experiments/{experiment_id}").status_code == 404


def test_too_few_samples_refuse_a_promotion_unless_forced(world: World) -> None:
    v1, v2 = world.register(), world.register()
    record = world.start(v1, v2, min_samples=50)
    _outcomes(world, "experiment_a", v1, 30, 0)
    _outcomes(world, "experiment_b", v2, 30, 30)
    status = look_experiment(world.settings, world.clients, LINE)
    assert status.look is not None
    assert status.look.verdict.value == "waiting"
    assert status.look.p_value < 0.05  # a clear difference, on too few samples
    with pytest.raises(UsageError, match="has not decided"):
        promote_experiment(world.settings, world.clients, LINE, world.urls)
    with pytest.raises(UsageError, match="--force needs --reason"):
        promote_experiment(world.settings, world.clients, LINE, world.urls, force=True, arm="b")
    with pytest.raises(UsageError, match="--force needs --arm"):
        promote_experiment(world.settings, world.clients, LINE, world.urls, force=True,
                           reason="launch day")  # fmt: skip
    promoted, _ = promote_experiment(world.settings, world.clients, LINE, world.urls, force=True,
                                     arm="b", reason="launch day")  # fmt: skip
    assert promoted.record.status == "promoted"
    assert world.table().champion == v2
    ended = get_experiment(world.store.engine, record.id)
    assert ended is not None
    assert ended.winner is None  # the test never decided; the promotion was by hand
    assert "launch day" in (ended.ended_reason or "")
    tags = world.registry.version_tags(LINE, int(v2.split("-v")[1]))
    assert "launch day" in tags["promoted_reason"]


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLYWHEEL_HOME": str(home)}
    env.pop("FLYWHEEL_DATABASE_URL", None)
    flywheel = Path(sys.executable).with_name("flywheel")
    return subprocess.run(
        [str(flywheel), "experiment", *args], capture_output=True, text=True, env=env, check=False
    )


def test_bad_input_exits_2_with_a_message(tmp_path: Path) -> None:
    cases = [
        (("start", "legal", "v1", "v2", "--metric", "revenue"), "unknown --metric"),
        (("start", "nowhere", "v1", "v2", "--metric", "thumbs_up"), "unknown business line"),
        (("start", "legal", "v1", "v2", "--metric", "thumbs_up", "--share", "1.5"), "--share"),
        (("start", "legal", "base", "latest", "--metric", "thumbs_up"), "is not 'base'"),
        (("start", "legal", "base", "v4", "--metric", "thumbs_up"), "has no version 4"),
        (("stop", "legal"), "no experiment is live"),
        (("promote", "legal", "--arm", "C"), "--arm must be A or B"),
    ]
    for args, message in cases:
        result = _cli(tmp_path, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    listed = _cli(tmp_path, "status", "--json")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "[]"


def _reviewed(world: World, arm: str, adapter: str | None, passes: int, fails: int) -> None:
    """Answers served by ``arm`` just now, each reviewed blind: ``passes`` passed."""
    now = datetime.now(UTC)
    events: list[dict[str, Any]] = []
    for index in range(passes + fails):
        request_id = f"{arm}-reviewed-{now.timestamp():.6f}-{index}"
        events += [
            {
                "type": "interaction",
                "request_id": request_id,
                "user_id": f"{arm}-reviewed-user-{index}",
                "business_line": LINE,
                "adapter_name": adapter,
                "base_model": "stub-base",
                "arm": arm,
                "messages": [{"role": "user", "content": f"question {index}"}],
                "response": "an answer",
                "status": "ok",
                "created_at": now.isoformat(),
            },
            {
                "type": "review",
                "request_id": request_id,
                "outcome": "pass" if index < passes else "fail",
                "metadata": {"reason": "checked", "reviewer": "r1"},
                "created_at": now.isoformat(),
            },
        ]
    report = world.store.ingest(events, source="test")
    assert report.quarantined == 0, report.rejections


def test_an_experiment_on_satisfaction_waits_for_reviews_then_decides(world: World) -> None:
    """Judged on satisfaction estimated on every answer (here by the reviews alone: the line
    has no accepted satisfaction model), it waits for the recipe's reviews per arm, then
    shows the arm that satisfies more; the look's numbers are recorded."""
    v1, v2 = world.register(), world.register()
    record = world.start(v1, v2, metric="satisfaction", share=0.5)
    assert record.metric == "satisfaction"
    assert record.policy.min_reviews == 30  # the recipe's canary satisfaction test
    _reviewed(world, "experiment_a", v1, passes=3, fails=7)
    _reviewed(world, "experiment_b", v2, passes=8, fails=2)
    waiting = look_experiment(world.settings, world.clients, LINE)
    assert waiting.look.verdict.value == "waiting"
    assert "10" in waiting.look.reasons[0]
    assert "30 needed" in waiting.look.reasons[0]

    _reviewed(world, "experiment_a", v1, passes=6, fails=24)
    _reviewed(world, "experiment_b", v2, passes=24, fails=6)
    status = look_experiment(world.settings, world.clients, LINE)
    look = status.look
    assert look.verdict.value == "b_better", look.reasons
    assert look.a.reviews == 40
    assert look.b.reviews == 40
    assert look.a.rate == pytest.approx(9 / 40)
    assert look.b.rate == pytest.approx(32 / 40)
    assert look.lower > 0  # the interval over every look excludes no difference
    assert status.record.winner == "b"
    numbers = experiment_looks(world.store.engine, record.id)[-1]["numbers"]
    assert numbers["a_reviews"] == 40
    assert numbers["b_rate"] == pytest.approx(0.8)


def test_an_experiment_on_satisfaction_needs_a_review_block(world: World, tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    recipe = yaml.safe_load((Path(__file__).parents[2] / "recipes" / f"{LINE}.yaml").read_text())
    recipe.pop("review")
    recipe.pop("canary")  # its satisfaction test needs the review block too
    (recipes / f"{LINE}.yaml").write_text(yaml.safe_dump(recipe))
    world.settings = world.settings.model_copy(update={"recipes_dir": recipes})
    v1, v2 = world.register(), world.register()
    with pytest.raises(UsageError, match="no review block"):
        world.start(v1, v2, metric="satisfaction")
