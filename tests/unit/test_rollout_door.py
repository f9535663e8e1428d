"""The operator's commands go through the rollout's one door (``registry.rollout``): a canary
or a shadow set by hand is probed and loaded before it is routed, one cleared by hand is
rolled back (unloaded, its version rejected with the operator's reason and name), and
``lifecycle check --repair`` makes MLflow's aliases follow the routing table. On two
stand-in vLLM replicas, the SQLite store and a local MLflow registry; on main these
commands moved the routing table alone."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from cli.main import app
from composition.clients import Clients, clients_in_use
from composition.recipes import packaged_recipes_dir
from composition.rollout import deploy_canary, judge_canary
from feedback.store import FeedbackStore
from flywheel.errors import UsageError
from flywheel.settings import Settings, load_settings
from registry.adapter_sync import lifecycle_check
from registry.canary import CanaryAction
from registry.routes import RouteStore
from registry.routing import RoutingTable
from registry.tracking import Registry
from tests.fake_clients import fake_clients
from tests.registered import fake_adapter, register_version
from tests.stub_vllm import BASE_MODEL, StubBehaviour, StubVllm, running_stub

LINE = "legal"
runner = CliRunner()


@dataclass
class World:
    settings: Settings
    store: FeedbackStore
    registry: Registry
    clients: Clients
    replicas: list[StubVllm]
    root: Path

    @property
    def urls(self) -> list[str]:
        return [r.base_url for r in self.replicas]

    def register(self) -> int:
        folder = fake_adapter(self.root / f"adapter-{time.monotonic_ns()}")
        return register_version(self.settings, self.registry, LINE, folder, self.root)

    def champion(self) -> int:
        """A version deployed and promoted: the line's champion, loaded everywhere."""
        version = self.register()
        deploy_canary(self.settings, self.clients, LINE, version, self.urls)
        judge_canary(self.settings, self.clients, LINE, force=CanaryAction.PROMOTE,
                     upstreams=self.urls)  # fmt: skip
        return version

    def table(self) -> RoutingTable:
        return RouteStore(self.store.engine).table(LINE)

    def loaded(self) -> list[set[str]]:
        return [set(r.behaviour.adapters) for r in self.replicas]

    def check(self) -> list[str]:
        problems: list[str] = lifecycle_check(self.settings, self.clients, self.urls)["problems"]
        return problems

    def flywheel(self, *args: str) -> Result:
        with clients_in_use(self.clients):
            return runner.invoke(app, list(args))


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    recipes = tmp_path / "recipes"
    shutil.copytree(packaged_recipes_dir(), recipes, ignore=shutil.ignore_patterns("demo"))
    path = recipes / f"{LINE}.yaml"
    recipe = yaml.safe_load(path.read_text())
    recipe.update(rollout={"soak_s": 0, "watch_s": 3600}, canary_steps=[0.05, 1.0])
    path.write_text(yaml.safe_dump(recipe))
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    monkeypatch.setenv("FLYWHEEL_RECIPES_DIR", str(recipes))
    with running_stub(StubBehaviour()) as first, running_stub(StubBehaviour()) as second:
        monkeypatch.setenv("FLYWHEEL_GATEWAY_UPSTREAMS", f"{first.base_url},{second.base_url}")
        settings = load_settings()
        store = FeedbackStore.open(settings)
        registry = Registry.for_home(settings.home, settings.mlflow_tracking_uri)
        clients = fake_clients(settings, store=store, registry=registry)
        yield World(settings, store, registry, clients, [first, second], tmp_path)
    store.close()


def test_canary_clear_rolls_the_canary_back_unloaded_and_rejected(world: World) -> None:
    champion, canary = world.champion(), world.register()
    deploy_canary(world.settings, world.clients, LINE, canary, world.urls)
    assert world.loaded() == [{f"{LINE}-v{champion}", f"{LINE}-v{canary}"}] * 2
    assert world.registry.aliases(LINE)["canary"] == canary

    cleared = world.flywheel("canary", "clear", LINE, "--reason", "users complain of tone")

    assert cleared.exit_code == 0, cleared.output
    assert world.table().canary is None
    assert world.loaded() == [{f"{LINE}-v{champion}"}] * 2
    tags = world.registry.version_tags(LINE, canary)
    assert tags["rolled_back"] == "users complain of tone"
    assert tags["rolled_back_by"].startswith("cli")
    aliases = world.registry.aliases(LINE)
    assert "canary" not in aliases
    assert aliases["champion"] == champion
    assert world.check() == []
    [change] = RouteStore(world.store.engine).history(LINE, limit=1)
    assert (change.action, change.reason) == ("canary_clear", "users complain of tone")
    assert change.actor.startswith("cli")


def test_canary_set_by_hand_probes_and_loads_before_it_routes(world: World) -> None:
    champion, v2, v3 = world.champion(), world.register(), world.register()
    first, second = f"{LINE}-v{v2}", f"{LINE}-v{v3}"
    assert world.loaded() == [{f"{LINE}-v{champion}"}] * 2

    done = world.flywheel("canary", "set", LINE, first, "--fraction", "0.2")

    assert done.exit_code == 0, done.output
    assert "20.0% of users" in done.output
    assert world.loaded() == [{f"{LINE}-v{champion}", first}] * 2
    assert (world.table().canary, world.table().canary_fraction) == (first, 0.2)
    assert world.registry.aliases(LINE)["canary"] == v2
    for replica in world.replicas:  # probed: asked as itself and as the base model
        asked = {body["model"] for body in replica.received}
        assert {first, BASE_MODEL} <= asked
    assert world.check() == []
    # Another canary by hand replaces it: the first is rolled back and unloaded.
    replaced = world.flywheel("canary", "set", LINE, second, "--reason", "a better one")
    assert replaced.exit_code == 0, replaced.output
    assert world.loaded() == [{f"{LINE}-v{champion}", second}] * 2
    assert "rolled back by hand" in world.registry.version_tags(LINE, v2)["rolled_back"]
    assert world.registry.aliases(LINE)["canary"] == v3
    assert world.check() == []


def test_a_canary_set_by_hand_that_fails_its_probe_is_refused_and_leaves_nothing(
    world: World,
) -> None:
    world.champion()
    version = world.register()
    adapter = f"{LINE}-v{version}"
    before = world.table()
    # The second replica answers like the base model for it: its probe there fails.
    world.replicas[1].behaviour.answers.update({adapter: "same", BASE_MODEL: "same"})

    refused = world.flywheel("canary", "set", LINE, adapter)

    assert isinstance(refused.exception, UsageError)
    assert f"probe failed on {world.urls[1]}" in str(refused.exception)
    assert world.table() == before
    assert all(adapter not in loaded for loaded in world.loaded())
    assert world.registry.version_tags(LINE, version).get("rolled_back")
    assert world.check() == []


def test_shadow_set_and_clear_by_hand_load_then_unload_and_reject(world: World) -> None:
    champion, version = world.champion(), world.register()
    adapter = f"{LINE}-v{version}"

    started = world.flywheel("canary", "shadow", "set", LINE, adapter, "--share", "0.3")

    assert started.exit_code == 0, started.output
    assert (world.table().shadow, world.table().shadow_fraction) == (adapter, 0.3)
    assert world.loaded() == [{f"{LINE}-v{champion}", adapter}] * 2
    assert world.check() == []

    stopped = world.flywheel("canary", "shadow", "clear", LINE, "--reason", "answers too long")

    assert stopped.exit_code == 0, stopped.output
    assert world.table().shadow is None
    assert world.loaded() == [{f"{LINE}-v{champion}"}] * 2
    tags = world.registry.version_tags(LINE, version)
    assert tags["rolled_back"] == "answers too long"
    assert tags["rolled_back_by"].startswith("cli")
    assert world.check() == []


def test_lifecycle_check_repair_makes_the_aliases_follow_the_routing_table(
    world: World,
) -> None:
    champion, stray = world.champion(), world.register()
    # MLflow moved behind the routing table's back: the champion alias on another version
    # and a canary alias with no canary routed.
    world.registry.set_alias(LINE, "champion", stray)
    world.registry.set_alias(LINE, "canary", stray)
    drifted = world.flywheel("lifecycle", "check")
    assert drifted.exit_code == 1
    assert "MLflow @champion" in drifted.output

    repaired = world.flywheel("lifecycle", "check", "--repair", "--json")

    assert repaired.exit_code == 0, repaired.output
    body = json.loads(repaired.stdout)
    assert body["ok"] is True
    assert {(m["alias"], m["version"]) for m in body["repaired"]} == {
        ("champion", champion),
        ("canary", None),
    }
    aliases = world.registry.aliases(LINE)
    assert aliases["champion"] == champion
    assert "canary" not in aliases
    assert world.table().champion == f"{LINE}-v{champion}"  # the routing is the truth
    again = world.flywheel("lifecycle", "check", "--repair", "--json")
    assert json.loads(again.stdout)["repaired"] == []
