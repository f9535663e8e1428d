"""The rollout on real parts around two stand-in vLLM replicas: the SQLite store, a local
MLflow registry, the real gateway. Each test is a case that wedged, leaked or split the
champion on main; the slow tier repeats the replica cases on real vLLM."""

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

import httpx
import pytest
import yaml
from mlflow.entities import LoggedModelStatus

from composition.clients import Clients
from composition.recipes import packaged_recipes_dir
from composition.rollout import deploy_canary, judge_canary, set_champion, watch_champion
from feedback.store import FeedbackStore
from flywheel.settings import Settings, load_settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from registry.adapter_sync import lifecycle_check, sync_adapters
from registry.canary import CanaryAction
from registry.delivery import TAG_ADAPTER_DIGEST, adapter_digest
from registry.names import model_name
from registry.routes import RouteStore
from registry.tracking import Registry
from registry.vllm_server import free_port
from tests.fake_clients import fake_clients
from tests.reactions import arm_events
from tests.registered import fake_adapter, register_version
from tests.routing import set_canary
from tests.servers import serving
from tests.stub_vllm import BASE_MODEL, StubBehaviour, StubVllm, running_stub

LINE = "legal"
KEY = "fw-rollout-key"


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

    def register(self, rank: int = 8) -> int:
        """A registered version of the line's adapter, as the nightly flow leaves it."""
        folder = fake_adapter(self.root / f"adapter-{time.monotonic_ns()}", rank)
        return register_version(self.settings, self.registry, LINE, folder, self.root)

    def table(self) -> Any:
        return RouteStore(self.store.engine).table(LINE)

    def loaded(self) -> list[set[str]]:
        return [set(r.behaviour.adapters) for r in self.replicas]

    def check(self) -> list[str]:
        return lifecycle_check(self.settings, self.clients, self.urls)["problems"]


def _recipes(root: Path, **rollout: object) -> Path:
    """The packaged recipes, the line's with this rollout policy and a two-step canary."""
    folder = root / "recipes"
    shutil.copytree(packaged_recipes_dir(), folder, ignore=shutil.ignore_patterns("demo"))
    path = folder / f"{LINE}.yaml"
    recipe = yaml.safe_load(path.read_text())
    recipe.update(
        rollout=rollout,
        canary_steps=[0.05, 1.0],
        canary={"min_requests": 20, "alpha": 0.2, "max_looks": 3},
    )
    path.write_text(yaml.safe_dump(recipe))
    return folder


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    monkeypatch.setenv("FLYWHEEL_RECIPES_DIR", str(_recipes(tmp_path, soak_s=0, watch_s=3600)))
    settings = load_settings()
    store = FeedbackStore.open(settings)
    registry = Registry.for_home(settings.home, settings.mlflow_tracking_uri)
    with running_stub(StubBehaviour()) as first, running_stub(StubBehaviour()) as second:
        yield World(settings, store, registry, [first, second], tmp_path)
    store.close()


def test_a_rerun_of_a_deploy_keeps_the_canary_where_it_is(world: World) -> None:
    v1 = world.register()
    assert deploy_canary(world.settings, world.clients, LINE, v1, world.urls).status == "canary"
    set_canary(RouteStore(world.store.engine), LINE, f"{LINE}-v{v1}", 0.3, actor="t")
    again = deploy_canary(world.settings, world.clients, LINE, v1, world.urls)
    assert again.status == "none"
    assert world.table().canary_fraction == 0.3
    forced = judge_canary(world.settings, world.clients, LINE, force=CanaryAction.PROMOTE,
                          upstreams=world.urls)  # fmt: skip
    assert forced.action == "promote"
    # On main: "canary must differ from champion", raised on every later night.
    assert deploy_canary(world.settings, world.clients, LINE, v1, world.urls).status == "none"
    assert world.check() == []


def test_a_probe_failing_on_the_second_replica_leaves_nothing_loaded(world: World) -> None:
    version = world.register()
    adapter = f"{LINE}-v{version}"
    # The second replica answers like the base model for it: the probe there fails.
    world.replicas[1].behaviour.answers.update({adapter: "same", BASE_MODEL: "same"})
    deployed = deploy_canary(world.settings, world.clients, LINE, version, world.urls)
    assert deployed.status == "failed"
    assert world.urls[1] in deployed.reason
    assert world.loaded() == [set(), set()]
    assert world.table().canary is None
    assert world.registry.version_tags(LINE, version).get("rolled_back")
    assert "candidate" not in world.registry.aliases(LINE)


def test_an_adapter_above_the_servers_rank_fails_cleanly(world: World) -> None:
    version = world.register(rank=64)
    deployed = deploy_canary(world.settings, world.clients, LINE, version, world.urls)
    assert deployed.status == "failed"
    assert "max_lora_rank" in deployed.reason
    assert world.loaded() == [set(), set()]
    assert world.check() == []


def test_a_live_canary_is_kept_and_a_replacement_is_recorded(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    v1, v2 = world.register(), world.register()
    deploy_canary(world.settings, world.clients, LINE, v1, world.urls)
    kept = deploy_canary(world.settings, world.clients, LINE, v2, world.urls)
    assert kept.status == "kept_canary"
    assert world.table().canary == f"{LINE}-v{v1}"
    assert world.loaded() == [{f"{LINE}-v{v1}"}] * 2
    monkeypatch.setenv(
        "FLYWHEEL_RECIPES_DIR", str(_recipes(world.root / "replace", on_live_canary="replace"))
    )
    settings = load_settings()
    replaced = deploy_canary(
        settings, fake_clients(settings, store=world.store), LINE, v2, world.urls
    )
    assert replaced.status == "canary"
    assert world.table().canary == f"{LINE}-v{v2}"
    assert world.loaded() == [{f"{LINE}-v{v2}"}] * 2
    assert "a newer candidate" in world.registry.version_tags(LINE, v1)["rolled_back"]
    assert world.registry.aliases(LINE)["canary"] == v2


def test_promotions_unload_what_leaves_and_routes_and_aliases_agree(world: World) -> None:
    versions = [world.register() for _ in range(3)]
    for version in versions:
        assert deploy_canary(world.settings, world.clients, LINE, version, world.urls).status == (
            "canary"
        )
        outcome = judge_canary(world.settings, world.clients, LINE, force=CanaryAction.PROMOTE,
                               upstreams=world.urls)  # fmt: skip
        assert outcome.action == "promote"
        assert world.check() == [], world.check()
    v1, v2, v3 = (f"{LINE}-v{v}" for v in versions)
    table = world.table()
    assert (table.champion, table.previous) == (v3, v2)
    assert world.loaded() == [{v2, v3}] * 2  # v1 left `previous` and was unloaded
    aliases = world.registry.aliases(LINE)
    assert (aliases["champion"], aliases["previous"]) == (versions[2], versions[1])
    # By hand, the alias moves with the routing (on main only the routing moved).
    set_champion(world.settings, world.clients, LINE, v1, world.urls, reason="hotfix", actor="t")
    assert world.registry.aliases(LINE)["champion"] == versions[0]
    assert world.table().champion == v1
    assert world.check() == [], world.check()
    # Versions are MLflow 3 LoggedModels: the champion alias leads to the adapter's files,
    # the folder vLLM loads.
    champion = world.registry.client.get_model_version_by_alias(model_name(LINE), "champion")
    model_id = world.registry.logged_model_id(champion.run_id)
    assert champion.source == f"models:/{model_id}"
    logged = world.registry.client.get_logged_model(model_id)
    assert logged.status.to_proto() == LoggedModelStatus.READY.to_proto()
    folder = world.registry.adapter_path(LINE, versions[0])
    assert (folder / "adapter_config.json").is_file()
    # The folder is the version's files fetched into the cache, checked by their digest.
    assert adapter_digest(folder) == champion.tags[TAG_ADAPTER_DIGEST]
    assert logged.tags[TAG_ADAPTER_DIGEST] == champion.tags[TAG_ADAPTER_DIGEST]
    assert world.replicas[0].behaviour.roots[v1] == str(folder)


def _traffic(world: World, adapter: str, requests: int, unhappy: int, when: datetime) -> None:
    report = world.store.ingest(arm_events(LINE, adapter, requests, unhappy, when), source="t")
    assert report.quarantined == 0, report


def test_a_champion_that_regresses_after_promotion_is_reverted(world: World) -> None:
    v1, v2 = world.register(), world.register()
    start = datetime.now(UTC) - timedelta(hours=2)
    for version, at in ((v1, start), (v2, start + timedelta(minutes=30))):
        deploy_canary(world.settings, world.clients, LINE, version, world.urls)
        judge_canary(world.settings, world.clients, LINE, force=CanaryAction.PROMOTE,
                     upstreams=world.urls, now=at)  # fmt: skip
    old, new = f"{LINE}-v{v1}", f"{LINE}-v{v2}"
    promoted = start + timedelta(minutes=30)
    _traffic(world, old, 60, 3, promoted - timedelta(minutes=20))
    _traffic(world, new, 60, 40, promoted + timedelta(minutes=5))
    outcome = watch_champion(world.settings, world.clients, LINE, upstreams=world.urls,
                             now=promoted + timedelta(minutes=20))  # fmt: skip
    assert outcome.action == "revert", outcome.reason
    assert "higher on the new champion" in outcome.reason
    assert "previous champion requests" in outcome.reason
    table = world.table()
    assert (table.champion, table.previous) == (old, None)
    assert world.registry.aliases(LINE)["champion"] == v1
    assert world.registry.version_tags(LINE, v2)["rolled_back"]
    assert world.loaded() == [{old}] * 2
    assert world.check() == []
    client = world.registry.client
    run = client.get_run(client.get_model_version(model_name(LINE), str(v2)).run_id)
    assert run.data.tags["canary.decision"] == "promote"
    assert run.data.tags["watch.decision"] == "revert"
    assert run.data.tags["watch.reason"] == outcome.reason
    assert run.data.metrics["watch.dissatisfied_rate.champion"] == pytest.approx(40 / 60)
    assert run.data.metrics["watch.dissatisfied_rate.previous"] == pytest.approx(3 / 60)


def test_the_canarys_decision_and_its_numbers_are_logged_on_the_run_that_trained_it(
    world: World,
) -> None:
    champion, canary = world.register(), world.register()
    deploy_canary(world.settings, world.clients, LINE, champion, world.urls)
    judge_canary(world.settings, world.clients, LINE, force=CanaryAction.PROMOTE,
                 upstreams=world.urls)  # fmt: skip
    deploy_canary(world.settings, world.clients, LINE, canary, world.urls)
    now = datetime.now(UTC)
    _traffic(world, f"{LINE}-v{champion}", 60, 3, now)
    _traffic(world, f"{LINE}-v{canary}", 60, 40, now)

    outcome = judge_canary(world.settings, world.clients, LINE, upstreams=world.urls,
                           now=now + timedelta(minutes=5))  # fmt: skip

    assert outcome.action == "rollback", outcome.reason
    versions = world.registry.client
    run = versions.get_run(versions.get_model_version(model_name(LINE), str(canary)).run_id)
    assert run.data.tags["canary.decision"] == "rollback"
    assert run.data.tags["canary.reason"] == outcome.reason
    assert run.data.tags["canary.adapter"] == f"{LINE}-v{canary}"
    metrics = run.data.metrics
    assert metrics["canary.canary_requests"] == metrics["canary.champion_requests"] == 60
    assert metrics["canary.dissatisfied_rate.canary"] == pytest.approx(40 / 60)
    assert metrics["canary.dissatisfied_rate.champion"] == pytest.approx(3 / 60)
    assert metrics["canary.dissatisfied_rate.worse_p"] <= 0.2
    assert run.data.tags["canary.dissatisfied_rate.verdict"] == "WORSE"
    saved = versions.download_artifacts(run.info.run_id, "canary/rollback.json", str(world.root))
    assert json.loads(Path(saved).read_text())["canary"]["requests"] == 60
    first = versions.get_run(versions.get_model_version(model_name(LINE), str(champion)).run_id)
    assert first.data.tags["canary.decision"] == "promote"
    assert first.data.tags["canary.reason"] == "by hand (promote)"


def test_a_restarted_replica_gets_its_adapters_back(world: World) -> None:
    version = world.register()
    adapter = f"{LINE}-v{version}"
    deploy_canary(world.settings, world.clients, LINE, version, world.urls)
    judge_canary(world.settings, world.clients, LINE, force=CanaryAction.PROMOTE,
                 upstreams=world.urls)  # fmt: skip
    # The first replica restarts: it comes back with no adapter at all.
    world.replicas[0].behaviour.adapters.clear()
    assert any("not loaded" in p for p in world.check())
    keys = KeyRing([ApiKey(name="ops", sha256=key_digest(KEY), business_lines=("*",))])
    config = GatewaySettings(
        upstreams=tuple(world.urls), routes_refresh_s=0.02, log_flush_s=0.02, replica_watch_s=0
    )
    app = create_app(
        world.settings, config, store=world.store, routes=RouteStore(world.store.engine), keys=keys
    )
    with serving(app, free_port()) as url:
        for i in range(4):  # round robin: at least one lands on the restarted replica first
            answer = httpx.post(
                f"{url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {KEY}"},
                json={
                    "model": LINE,
                    "messages": [{"role": "user", "content": f"hi {i}"}],
                    "user": f"u{i}",
                },
                timeout=10,
            )
            assert answer.status_code == 200, answer.text
            assert adapter in answer.text
        deadline = time.monotonic() + 5
        while adapter not in world.replicas[0].behaviour.adapters and time.monotonic() < deadline:
            time.sleep(0.05)
    # The gateway reloaded it from the folder the other replica serves it from.
    assert world.loaded() == [{adapter}] * 2
    assert world.check() == []
    # The reconciler does the same without traffic.
    world.replicas[1].behaviour.adapters.clear()
    summary = sync_adapters(world.settings, world.clients, world.urls)
    assert summary[world.urls[1]]["loaded"] == [adapter]
    assert world.check() == []


def test_the_gateways_replica_watch_reloads_routed_adapters_without_traffic(world: World) -> None:
    champion, gone, canary = (world.register() for _ in range(3))
    deploy_canary(world.settings, world.clients, LINE, champion, world.urls)
    judge_canary(world.settings, world.clients, LINE, force=CanaryAction.PROMOTE,
                 upstreams=world.urls)  # fmt: skip
    deploy_canary(world.settings, world.clients, LINE, gone, world.urls)
    judge_canary(world.settings, world.clients, LINE, force=CanaryAction.ROLLBACK,
                 upstreams=world.urls)  # fmt: skip
    deploy_canary(world.settings, world.clients, LINE, canary, world.urls)
    routed = world.table().adapters
    assert routed == {f"{LINE}-v{champion}", f"{LINE}-v{canary}"}
    world.replicas[0].behaviour.adapters.clear()  # a restart: nothing loaded
    keys = KeyRing([ApiKey(name="ops", sha256=key_digest(KEY), business_lines=("*",))])
    config = GatewaySettings(
        upstreams=tuple(world.urls), routes_refresh_s=0.02, log_flush_s=0.02, replica_watch_s=0.1
    )
    app = create_app(
        world.settings, config, store=world.store, routes=RouteStore(world.store.engine), keys=keys
    )
    with serving(app, free_port()):
        deadline = time.monotonic() + 10
        while world.loaded()[0] != world.loaded()[1] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # a few more rounds: nothing else is loaded
    # Everything routed is back; what the rollout unloaded stays unloaded.
    assert world.loaded()[0] == world.loaded()[1] == set(routed)
    assert world.check() == []


def test_a_placed_line_is_loaded_only_on_its_replica_and_checked_there(world: World) -> None:
    home, other = world.urls
    routes = RouteStore(world.store.engine)
    routes.change(LINE, lambda t: t.placed_on((home,)), action="placement_set", actor="t")
    v1, v2 = world.register(), world.register()
    for version in (v1, v2):
        assert deploy_canary(world.settings, world.clients, LINE, version, world.urls).status == (
            "canary"
        )
        judge_canary(world.settings, world.clients, LINE, force=CanaryAction.PROMOTE,
                     upstreams=world.urls)  # fmt: skip
    routed = {f"{LINE}-v{v1}", f"{LINE}-v{v2}"}
    assert world.loaded() == [routed, set()]
    assert world.table().replicas == (home,)
    assert world.check() == []
    # An adapter where the line is not placed is drift, and the reconciler unloads it.
    world.replicas[1].behaviour.adapters.add(f"{LINE}-v{v2}")
    assert any("not placed" in p for p in world.check())
    summary = sync_adapters(world.settings, world.clients, world.urls)
    assert summary[other]["unloaded"] == [f"{LINE}-v{v2}"]
    assert world.loaded() == [routed, set()]
    # Placed elsewhere: the reconciler loads it there and takes it off the first.
    routes.change(LINE, lambda t: t.placed_on((other,)), action="placement_set", actor="t")
    sync_adapters(world.settings, world.clients, world.urls)
    assert world.loaded() == [set(), routed]
    assert world.check() == []


def test_placement_plan_packs_a_cold_line_and_moves_its_adapters(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from cli.main import app
    from flywheel.errors import UsageError

    runner = CliRunner()
    version = world.register()
    adapter = f"{LINE}-v{version}"
    deploy_canary(world.settings, world.clients, LINE, version, world.urls)
    judge_canary(world.settings, world.clients, LINE, force=CanaryAction.PROMOTE,
                 upstreams=world.urls)  # fmt: skip
    assert world.loaded() == [{adapter}] * 2
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    _traffic(world, adapter, 10, 0, hour_ago)
    report = world.store.ingest(arm_events("medical", None, 90, 0, hour_ago), source="t")
    assert report.quarantined == 0
    monkeypatch.setenv("FLYWHEEL_GATEWAY_UPSTREAMS", ",".join(world.urls))
    shown = runner.invoke(app, ["placement", "plan", "--json"])
    assert shown.exit_code == 0, shown.output
    rows = {row["business_line"]: row for row in json.loads(shown.stdout)}
    assert (rows[LINE]["requests"], rows[LINE]["share"]) == (10, 0.1)
    assert rows["medical"]["planned"] is None  # 90%: hot, on every replica
    recent = runner.invoke(app, ["placement", "plan", "--hours", "0.5", "--json"])
    assert {row["requests"] for row in json.loads(recent.stdout)} == {0}  # all an hour ago
    [home] = rows[LINE]["planned"]
    other = next(url for url in world.urls if url != home)
    applied = runner.invoke(app, ["placement", "plan", "--apply"])
    assert applied.exit_code == 0, applied.output
    assert f"unloaded from {other}" in applied.output
    assert world.table().replicas == (home,)
    assert world.loaded()[world.urls.index(home)] == {adapter}
    assert world.loaded()[world.urls.index(other)] == set()
    assert world.check() == []
    # By hand: onto the other replica (loaded there before it leaves the first), then back
    # on every replica.
    moved = runner.invoke(app, ["placement", "set", LINE, other + "/"])
    assert moved.exit_code == 0, moved.output
    assert world.table().replicas == (other,)
    assert world.loaded()[world.urls.index(other)] == {adapter}
    assert world.loaded()[world.urls.index(home)] == set()
    unknown = runner.invoke(app, ["placement", "set", LINE, "http://127.0.0.1:9"])
    assert isinstance(unknown.exception, UsageError)
    assert "not a configured replica" in str(unknown.exception)
    assert runner.invoke(app, ["placement", "clear", LINE]).exit_code == 0
    assert world.table().replicas is None
    assert world.loaded() == [{adapter}] * 2
    assert world.check() == []
    history = [c.action for c in RouteStore(world.store.engine).history(LINE, limit=3)]
    assert history == ["placement_set"] * 3


def _reviews(world: World, adapter: str, start: datetime, answers: int, failed: int) -> None:
    """Reviewers' verdicts on the first ``answers`` answers of ``adapter`` from ``start``."""
    tag = f"{adapter}-{start.timestamp():.3f}"
    events = [
        {
            "type": "review",
            "request_id": f"{tag}-{index}",
            "idempotency_key": f"rv-{tag}-{index}",
            "outcome": "fail" if index < failed else "pass",
            "metadata": {"reason": "off the point" if index < failed else "helpful",
                         "reviewer": "rev-1"},
            "created_at": (start + timedelta(seconds=index)).isoformat(),
        }
        for index in range(answers)
    ]  # fmt: skip
    report = world.store.ingest(events, source="t")
    assert report.quarantined == 0, report


class _LengthReader:
    """Stands in for the base model reading answers (a unit test loads no model): one
    feature, the answer's length."""

    def features(self, items: list[tuple[Any, str]]) -> Any:
        import numpy as np

        return np.array([[float(len(answer))] for _, answer in items])


@pytest.mark.parametrize("with_model", [False, True], ids=["reviews-alone", "with-model"])
def test_satisfaction_decides_the_canary_on_reviews_when_no_model_is_accepted(
    world: World, monkeypatch: pytest.MonkeyPatch, with_model: bool
) -> None:
    """With canary.satisfaction set and no accepted satisfaction model, the canary's
    satisfaction is the reviews' alone: reviewers failing most canary answers roll it back,
    though the users' quiet signals could not tell the arms apart. With an accepted model in
    the registry, every answer is scored by it (cached for the window only), the users'
    signals folded in, and the reviews still decide."""
    folder = world.root / "ppi-recipes"
    shutil.copytree(Path(world.settings.recipes_dir or ""), folder)
    path = folder / f"{LINE}.yaml"
    recipe = yaml.safe_load(path.read_text())
    recipe["canary"]["satisfaction"] = {"margin": 0.1, "min_reviews": 20}
    recipe["review"] = {"rubric": ["helpful", "off the point"]}
    path.write_text(yaml.safe_dump(recipe))
    monkeypatch.setenv("FLYWHEEL_RECIPES_DIR", str(folder))
    settings = load_settings()
    clients = fake_clients(settings, store=world.store, registry=world.registry)
    v1, v2 = world.register(), world.register()
    start = datetime.now(UTC) - timedelta(hours=2)
    deploy_canary(settings, clients, LINE, v1, world.urls)
    judge_canary(settings, clients, LINE, force=CanaryAction.PROMOTE, upstreams=world.urls,
                 now=start)  # fmt: skip
    deploy_canary(settings, clients, LINE, v2, world.urls)
    since = datetime.now(UTC) + timedelta(minutes=1)
    _traffic(world, f"{LINE}-v{v1}", 200, 2, since)
    _traffic(world, f"{LINE}-v{v2}", 60, 1, since)
    _reviews(world, f"{LINE}-v{v1}", since, 40, 8)
    _reviews(world, f"{LINE}-v{v2}", since, 40, 30)
    table = world.table()
    assert table.canary == f"{LINE}-v{v2}"
    if with_model:
        import numpy as np

        from eval import satisfaction_training
        from eval.satisfaction_model import SatisfactionModel

        monkeypatch.setattr(satisfaction_training, "reader_for", lambda base_dir: _LengthReader())
        model_dir = world.root / "satisfaction-model"
        model_dir.mkdir()
        SatisfactionModel("base", np.zeros(1), np.ones(1), np.array([0.1]), -1.0).save(
            model_dir / "model.npz"
        )
        world.registry.log_satisfaction_model(
            LINE, dataset_hash="d" * 64, base_model="base", metrics={"auc": 0.8},
            accepted=True, reason="test", model_dir=model_dir,
        )  # fmt: skip
    outcome = judge_canary(settings, clients, LINE, upstreams=world.urls,
                           now=since + timedelta(hours=1))  # fmt: skip
    assert outcome.action == "rollback", outcome.reason
    assert "shown less satisfying" in outcome.reason
    if with_model:
        assert outcome.numbers["satisfaction_scored_by"] == (
            f"{LINE} satisfaction model v1 and the users' signals"
        )
        cached = json.loads((settings.home / "satisfaction" / f"{LINE}-v1.json").read_text())
        assert len(cached) == 260  # this window's answers, each scored once
        # The model's constant score tells nothing; the weight is the users' signals'.
        assert "the scores weighted" in outcome.reason
    else:
        assert outcome.numbers["satisfaction_scored_by"] == (
            "the users' signals (no accepted satisfaction model)"
        )
    assert outcome.decision is not None
    check = next(c for c in outcome.decision.checks if c.metric == "satisfaction")
    assert check.counts == (40, 40)
    # The record says each level: satisfaction's share of the rollback budget, the guardrails'.
    assert outcome.numbers["satisfaction_worse_alpha"] == pytest.approx(0.2 * 0.5)
    assert outcome.numbers["worse_alpha"] == pytest.approx(0.2 * 0.5 / 9)
