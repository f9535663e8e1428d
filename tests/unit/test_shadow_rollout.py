"""The shadow stage of a rollout: the pure transitions, then the flow on stand-in replicas
(candidate → shadow → canary on a good comparison, → rejected on a bad one)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import yaml

from composition.clients import Clients
from composition.recipes import packaged_recipes_dir
from composition.rollout import deploy_canary, judge_canary, judge_shadow_stage
from feedback.store import FeedbackStore
from flywheel.settings import Settings, load_settings
from registry.adapter_sync import lifecycle_check
from registry.canary import CanaryAction
from registry.decisions import latest_decisions
from registry.lifecycle import (
    CandidateReady,
    ChampionJudged,
    LineState,
    Load,
    ProbesDone,
    Reject,
    RolloutPolicy,
    Route,
    SetAlias,
    ShadowLooked,
    Unload,
    advance,
    shadow_since,
)
from registry.routes import RouteChangeRecord, RouteStore
from registry.routing import RoutingTable
from registry.shadow import ShadowAction, ShadowPolicy
from registry.tracking import Registry
from tests.fake_clients import fake_clients
from tests.registered import fake_adapter, register_version
from tests.stub_vllm import StubBehaviour, StubVllm, running_stub

LINE = "legal"
STEPS = (0.05, 1.0)
T0 = datetime(2026, 12, 1, tzinfo=UTC)
SHADOWED = RolloutPolicy(soak_s=0, watch_s=3600, shadow=ShadowPolicy(fraction=0.1))


def _table(**roles: Any) -> RoutingTable:
    return RoutingTable(business_line=LINE, **roles)


def _step(table: RoutingTable, event: Any, policy: RolloutPolicy = SHADOWED) -> Any:
    return advance(LineState(table), event, policy=policy, steps=STEPS)


def test_with_a_shadow_stage_a_probed_candidate_becomes_the_shadow_not_the_canary() -> None:
    before = _table(champion="legal-v1")
    shadowed = _step(before, ProbesDone("legal-v2", ("http://a",)))
    assert shadowed.action == "shadow"
    assert (shadowed.table.shadow, shadowed.table.shadow_fraction) == ("legal-v2", 0.1)
    assert shadowed.table.canary is None
    assert shadowed.effects == (Route(shadowed.table, "shadow_set"),)
    # Without one (the default), straight to the canary as before.
    direct = _step(before, ProbesDone("legal-v2", ("http://a",)), RolloutPolicy())
    assert direct.action == "canary"
    assert direct.table.shadow is None


def test_a_shadow_judged_good_goes_on_the_first_canary_share() -> None:
    live = _table(champion="legal-v1", shadow="legal-v2", shadow_fraction=0.1)
    moved = _step(live, ShadowLooked(ShadowAction.ADVANCE, ("fine",), T0))
    assert moved.action == "shadow_advance"
    assert (moved.table.canary, moved.table.canary_fraction) == ("legal-v2", 0.05)
    assert moved.table.shadow is None
    assert moved.effects == (Route(moved.table, "canary_set"), SetAlias("canary", 2))


def test_a_shadow_judged_bad_is_rolled_back_and_unloaded() -> None:
    live = _table(champion="legal-v1", shadow="legal-v2", shadow_fraction=0.1)
    gone = _step(live, ShadowLooked(ShadowAction.REJECT, ("refuses",), T0))
    assert gone.action == "shadow_reject"
    assert gone.table == _table(champion="legal-v1")
    assert gone.effects == (Route(gone.table, "shadow_clear"), Reject(2), Unload("legal-v2"))
    waiting = _step(live, ShadowLooked(ShadowAction.WAIT, ("more pairs",), T0))
    assert (waiting.action, waiting.effects, waiting.table) == ("shadow_wait", (), live)
    # A canary someone set by hand meanwhile: the shadow waits for it to be decided.
    busy = live.with_canary("legal-v3")
    held = _step(busy, ShadowLooked(ShadowAction.ADVANCE, ("fine",), T0))
    assert (held.action, held.table) == ("shadow_wait", busy)
    assert _step(_table(), ShadowLooked(ShadowAction.ADVANCE, (), T0)).action == "none"


def test_a_candidate_waits_behind_a_live_shadow_or_replaces_it() -> None:
    live = _table(champion="legal-v1", shadow="legal-v2", shadow_fraction=0.1)
    assert _step(live, CandidateReady("legal-v2")).action == "none"
    assert _step(live, CandidateReady("legal-v3")).action == "kept_shadow"
    replace = SHADOWED.model_copy(update={"on_live_canary": "replace"})
    assert _step(live, CandidateReady("legal-v3"), replace).effects == (Load("legal-v3"),)
    swapped = _step(live, ProbesDone("legal-v3", ("http://a",)), replace)
    assert swapped.table.shadow == "legal-v3"
    assert swapped.effects[1:] == (Reject(2), Unload("legal-v2"))


def test_a_revert_keeps_the_shadow() -> None:
    state = LineState(
        _table(champion="legal-v2", previous="legal-v1", shadow="legal-v3", shadow_fraction=0.1),
        champion_since=T0,
    )
    event = ChampionJudged(True, ("worse",), T0 + timedelta(minutes=5))
    reverted = advance(state, event, policy=SHADOWED, steps=STEPS)
    assert reverted.action == "revert"
    assert (reverted.table.shadow, reverted.table.shadow_fraction) == ("legal-v3", 0.1)


def test_the_shadow_started_when_the_history_first_names_it() -> None:
    def change(minutes: int, shadow: str | None) -> RouteChangeRecord:
        table = _table(shadow=shadow, shadow_fraction=0.1 if shadow else 0.0)
        when = T0 + timedelta(minutes=minutes)
        return RouteChangeRecord(LINE, 1, "x", table, "t", None, when)

    table = _table(shadow="legal-v2", shadow_fraction=0.1)
    history = [change(30, "legal-v2"), change(20, "legal-v2"), change(10, None)]
    assert shadow_since(history, table) == T0 + timedelta(minutes=20)
    assert shadow_since(history, _table()) is None


# ------------------------------------------------------------------ on stand-in replicas


@dataclass
class World:
    settings: Settings
    store: FeedbackStore
    registry: Registry
    replicas: list[StubVllm]
    root: Path

    @property
    def urls(self) -> list[str]:
        return [r.base_url for r in self.replicas]

    @cached_property
    def clients(self) -> Clients:
        return fake_clients(self.settings, store=self.store, registry=self.registry)

    def register(self) -> int:
        folder = fake_adapter(self.root / f"adapter-{time.monotonic_ns()}")
        return register_version(self.settings, self.registry, LINE, folder, self.root)

    def table(self) -> RoutingTable:
        return RouteStore(self.store.engine).table(LINE)

    def loaded(self) -> list[set[str]]:
        return [set(r.behaviour.adapters) for r in self.replicas]

    def pairs(self, adapter: str, count: int, *, shadow_answer: str) -> None:
        """``count`` requests the champion answered, each answered again by ``adapter``."""
        now = datetime.now(UTC)
        table = self.table()
        interactions, shadows = [], []
        for i in range(count):
            request_id = f"req-{adapter}-{time.monotonic_ns()}-{i}"
            interactions.append(
                {
                    "type": "interaction",
                    "request_id": request_id,
                    "business_line": LINE,
                    "adapter_name": table.champion,
                    "base_model": "stub-base",
                    "messages": [{"role": "user", "content": f"question {i}"}],
                    "response": f"Here is the answer to question {i}, in a few words.",
                    "status": "ok",
                    "created_at": now.isoformat(),
                }
            )
            shadows.append(
                {
                    "request_id": request_id,
                    "business_line": LINE,
                    "adapter_name": adapter,
                    "response": shadow_answer.format(i=i),
                    "status": "ok",
                    "created_at": now.isoformat(),
                }
            )
        self.store.ingest(interactions, source="test")
        assert self.store.add_shadow_outputs(shadows).added == count


def _recipes(root: Path) -> Path:
    folder = root / "recipes"
    shutil.copytree(packaged_recipes_dir(), folder, ignore=shutil.ignore_patterns("demo"))
    path = folder / f"{LINE}.yaml"
    recipe = yaml.safe_load(path.read_text())
    recipe.update(
        rollout={"soak_s": 0, "watch_s": 0, "shadow": {"fraction": 0.2, "min_pairs": 30}},
        canary_steps=[0.05, 1.0],
    )
    path.write_text(yaml.safe_dump(recipe))
    return folder


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    monkeypatch.setenv("FLYWHEEL_RECIPES_DIR", str(_recipes(tmp_path)))
    settings = load_settings()
    store = FeedbackStore.open(settings)
    registry = Registry.for_home(settings.home, settings.mlflow_tracking_uri)
    with running_stub(StubBehaviour()) as first, running_stub(StubBehaviour()) as second:
        yield World(settings, store, registry, [first, second], tmp_path)
    store.close()


def test_a_candidate_goes_shadow_then_canary_and_a_bad_one_is_rejected(world: World) -> None:
    v1, v2, v3 = world.register(), world.register(), world.register()
    good, bad = f"{LINE}-v{v1}", f"{LINE}-v{v2}"
    deployed = deploy_canary(world.settings, world.clients, LINE, v1, world.urls)
    assert deployed.status == "shadow", deployed.reason
    assert (world.table().shadow, world.table().shadow_fraction) == (good, 0.2)
    assert world.table().canary is None
    assert world.loaded() == [{good}] * 2
    assert "canary" not in world.registry.aliases(LINE)
    assert lifecycle_check(world.settings, world.clients, world.urls)["problems"] == []

    world.pairs(good, 20, shadow_answer="Here is the answer to question {i}, briefly put.")
    early = judge_shadow_stage(world.settings, world.clients, LINE, upstreams=world.urls)
    assert early.action == "shadow_wait"
    assert "30 pairs needed" in early.reason
    world.pairs(good, 15, shadow_answer="Here is an answer to question {i}, in few words.")
    moved = judge_shadow_stage(world.settings, world.clients, LINE, upstreams=world.urls)
    assert moved.action == "shadow_advance", moved.reason
    assert moved.numbers["shadow"]["pairs"] == 35
    table = world.table()
    assert (table.canary, table.canary_fraction, table.shadow) == (good, 0.05, None)
    assert world.registry.aliases(LINE)["canary"] == v1
    [latest, first] = latest_decisions(world.store.engine, LINE, limit=2)
    assert (latest["action"], latest["look"], first["look"]) == ("shadow_advance", 2, 1)

    promoted = judge_canary(world.settings, world.clients, LINE, force=CanaryAction.PROMOTE,
                            upstreams=world.urls)  # fmt: skip
    assert promoted.action == "promote"
    assert deploy_canary(world.settings, world.clients, LINE, v2, world.urls).status == "shadow"
    waiting = deploy_canary(world.settings, world.clients, LINE, v3, world.urls)
    assert waiting.status == "kept_shadow"
    world.pairs(bad, 40, shadow_answer="I'm sorry, but I can't help with that.")
    rejected = judge_shadow_stage(world.settings, world.clients, LINE, upstreams=world.urls)
    assert rejected.action == "shadow_reject", rejected.reason
    assert rejected.reason.startswith("refusal: shadow 100.0% vs champion 0.0%")
    table = world.table()
    assert (table.champion, table.shadow, table.canary) == (good, None, None)
    assert world.loaded() == [{good}] * 2
    assert "refusal" in world.registry.version_tags(LINE, v2)["rolled_back"]
    none = judge_shadow_stage(world.settings, world.clients, LINE, upstreams=world.urls)
    assert none.action == "none"
    assert lifecycle_check(world.settings, world.clients, world.urls)["problems"] == []


def test_the_shadow_commands_set_report_and_clear(world: World) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    runner = CliRunner()
    version = world.register()
    adapter = f"{LINE}-v{version}"
    assert (
        deploy_canary(world.settings, world.clients, LINE, version, world.urls).status == "shadow"
    )
    world.pairs(adapter, 35, shadow_answer="Here is the answer to question {i}, in a few words.")
    shown = runner.invoke(app, ["canary", "shadow", "report", LINE, "--json"])
    assert shown.exit_code == 0, shown.output
    body = json.loads(shown.output)
    assert (body["shadow"], body["share"], body["decision"]) == (adapter, 0.2, "advance")
    assert (body["report"]["pairs"], body["report"]["identical"]) == (35, 35)
    assert world.table().shadow == adapter  # a report applies nothing
    judge_shadow_stage(world.settings, world.clients, LINE, upstreams=world.urls)
    status = runner.invoke(app, ["canary", "status", LINE])
    assert status.exit_code == 0, status.output
    assert "35 pairs" in status.output
    cleared = runner.invoke(app, ["canary", "shadow", "clear", LINE])
    assert cleared.exit_code == 0, cleared.output
    assert runner.invoke(app, ["canary", "shadow", "report", LINE]).exit_code != 0
    hand = runner.invoke(
        app, ["canary", "shadow", "set", LINE, f"{LINE}-v9", "--share", "0.3", "--no-check"]
    )
    assert hand.exit_code == 0, hand.output
    assert (world.table().shadow, world.table().shadow_fraction) == (f"{LINE}-v9", 0.3)


def test_the_shadow_report_scores_both_answers_with_a_user_model(
    world: World, tmp_path: Path
) -> None:
    """``--users`` judges each pair's two answers with the model's satisfied(): these users
    want the question's number quoted back, which only the shadow does."""
    from typer.testing import CliRunner

    from cli.main import app
    from flywheel.errors import UsageError

    judge = tmp_path / "judge.py"
    judge.write_text(
        "class Judge:\n"
        "    def react(self, line, prompt, answer, seed):\n"
        "        return {'type': 'none'}\n"
        "    def satisfied(self, line, prompt, answer):\n"
        "        return prompt.split()[-1] in answer.split()\n",
        encoding="utf-8",
    )
    version = world.register()
    adapter = f"{LINE}-v{version}"
    assert (
        deploy_canary(world.settings, world.clients, LINE, version, world.urls).status == "shadow"
    )
    world.pairs(adapter, 30, shadow_answer="The answer is {i} .")
    runner = CliRunner()
    shown = runner.invoke(
        app, ["canary", "shadow", "report", LINE, "--json", "--users", f"{judge}:Judge"]
    )
    assert shown.exit_code == 0, shown.output
    satisfied = json.loads(shown.output)["satisfied"]
    assert (satisfied["pairs"], satisfied["champion"], satisfied["shadow"]) == (30, 0.0, 1.0)
    assert satisfied["low"] > 0.5
    assert satisfied["p_value"] < 1e-6
    text = runner.invoke(app, ["canary", "shadow", "report", LINE, "--users", f"{judge}:Judge"])
    assert "champion 0.0%, shadow 100.0%" in text.output
    bad = runner.invoke(app, ["canary", "shadow", "report", LINE, "--users", "nope.py:X"])
    assert isinstance(bad.exception, UsageError)
    assert "nope.py" in str(bad.exception)
