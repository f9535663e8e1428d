"""Replica records in the store: what each vLLM replica serves with, as it started."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from composition.rollout import deploy_canary, judge_canary
from feedback.store import FeedbackStore
from flywheel.errors import FlywheelError
from flywheel.settings import Settings
from registry.adapter_sync import sync_adapters
from registry.canary import CanaryAction
from registry.replicas import (
    ReplicaRecord,
    ReplicaRefusedError,
    ReplicaStore,
    line_lora_limits,
    load_checked,
    read_lora_limits,
    refusal_on,
    reported_max_loras,
    tightest_limits,
)
from registry.routing import RoutingTable
from registry.vllm_admin import VllmAdminError
from tests.registered import fake_adapter, register_version
from tests.unit import test_rollout_stub
from tests.unit.test_rollout_stub import LINE, World
from training.base_model import BaseFingerprint, write_base_record

STARTED = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
# Two stand-in vLLM replicas, the SQLite store and a local MLflow registry.
world = test_rollout_stub.world


@pytest.fixture
def replicas(settings: Settings) -> Iterator[ReplicaStore]:
    store = FeedbackStore.open(settings)
    yield ReplicaStore(store.engine)
    store.close()


def _record(url: str, max_loras: int = 4, **changes: object) -> ReplicaRecord:
    values: dict[str, object] = {
        "url": url,
        "base_name": "SmolLM2-135M-Instruct",
        "base_digest": "sha256:" + "ab" * 32,
        "max_loras": max_loras,
        "max_lora_rank": 16,
        # The stand-in vLLM has no resolver: it loads from the path it is given.
        "resolver": False,
        "started_at": STARTED,
        **changes,
    }
    return ReplicaRecord(**values)  # type: ignore[arg-type]


def test_a_replica_records_itself_and_is_read_back(replicas: ReplicaStore) -> None:
    assert replicas.get("http://127.0.0.1:8001") is None
    assert replicas.all() == []
    replicas.record(_record("http://127.0.0.1:8001/"))
    assert replicas.get("http://127.0.0.1:8001/") == _record("http://127.0.0.1:8001")
    assert replicas.get("http://127.0.0.1:8001") == _record("http://127.0.0.1:8001")


def test_a_restart_replaces_the_record_of_its_url(replicas: ReplicaStore) -> None:
    replicas.record(_record("http://b:8000"))
    replicas.record(_record("http://a:8000", max_loras=4))
    later = STARTED + timedelta(hours=1)
    replicas.record(
        _record("http://a:8000", max_loras=2, resolver=False, started_at=later, base_digest="x")
    )
    assert [r.url for r in replicas.all()] == ["http://a:8000", "http://b:8000"]
    restarted = replicas.get("http://a:8000")
    assert restarted is not None
    assert (restarted.max_loras, restarted.resolver, restarted.base_digest) == (2, False, "x")
    assert restarted.started_at == later


# --------------------------------------------------------------------------- LoRA limits

METRICS = """# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="3",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9
"""


def test_vllm_reports_its_max_loras_on_its_metrics() -> None:
    assert reported_max_loras(METRICS) == 3
    assert reported_max_loras("# nothing about LoRA\n") is None


def test_limits_come_from_the_record_then_vllm_then_the_settings() -> None:
    records = {"http://a:8000": _record("http://a:8000", max_loras=2)}
    metrics = {"http://b:8000": METRICS, "http://c:8000": None}
    limits = read_lora_limits(
        ["http://a:8000/", "http://b:8000", "http://c:8000"],
        records,
        max_loras_setting=4,
        max_lora_rank_setting=32,
        metrics=metrics.get,
    )
    a, b, c = limits.values()
    assert (a.max_loras, a.max_lora_rank) == (2, 16)
    assert a.max_loras_source == "recorded by http://a:8000 at its start"
    assert (b.max_loras, b.max_loras_source) == (3, "reported by vLLM at http://b:8000 (/metrics)")
    assert (b.max_lora_rank, b.max_lora_rank_source) == (
        32,
        "the setting FLYWHEEL_VLLM_MAX_LORA_RANK",
    )
    assert (c.max_loras, c.max_loras_source) == (4, "the setting FLYWHEEL_VLLM_MAX_LORAS")
    tightest = tightest_limits([a, b, c])
    assert (tightest.max_loras, tightest.max_lora_rank) == (2, 16)
    assert tightest.max_loras_source == a.max_loras_source


def test_a_line_fits_the_smallest_of_the_replicas_it_is_placed_on(
    replicas: ReplicaStore,
) -> None:
    replicas.record(_record("http://a:8000", max_loras=2))
    replicas.record(_record("http://b:8000", max_loras=6))
    upstreams = ["http://a:8000", "http://b:8000"]
    silent = {}.get

    everywhere = RoutingTable(business_line="legal")
    on_b = RoutingTable(business_line="legal", replicas=("http://b:8000",))
    limits = {"max_loras_setting": 4, "max_lora_rank_setting": 16, "metrics": silent}
    assert line_lora_limits(replicas, everywhere, upstreams, **limits).max_loras == 2  # type: ignore[arg-type]
    assert line_lora_limits(replicas, on_b, upstreams, **limits).max_loras == 6  # type: ignore[arg-type]
    nowhere = line_lora_limits(replicas, everywhere, [], **limits)  # type: ignore[arg-type]
    assert (nowhere.max_loras, nowhere.max_loras_source) == (
        4,
        "the setting FLYWHEEL_VLLM_MAX_LORAS",
    )


# --------------------------------------------------------------------------- same base or refused


class _Admin:
    """The admin client's two members a checked load uses."""

    def __init__(self, url: str) -> None:
        self.base_url = url
        self.loaded: list[tuple[str, str]] = []

    def ensure_loaded(self, name: str, path: Path | str) -> bool:
        self.loaded.append((name, str(path)))
        return True


def _adapter_on(folder: Path, base: BaseFingerprint | None) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    if base is not None:
        write_base_record(folder, base)
    return folder


def test_a_replica_serving_another_base_refuses_before_loading(
    replicas: ReplicaStore, tmp_path: Path
) -> None:
    replicas.record(_record("http://a:8000"))
    other = BaseFingerprint("Qwen2.5-0.5B", "sha256:" + "cd" * 32)
    admin = _Admin("http://a:8000")

    with pytest.raises(ReplicaRefusedError) as refused:
        load_checked(admin, "legal-v2", _adapter_on(tmp_path / "v2", other), replicas)  # type: ignore[arg-type]

    assert admin.loaded == []
    assert isinstance(refused.value, VllmAdminError)  # a failed load: the probe path rejects it
    assert "http://a:8000 refuses legal-v2: trained on Qwen2.5-0.5B" in str(refused.value)
    assert "serves SmolLM2-135M-Instruct" in str(refused.value)


def test_the_same_base_an_older_adapter_or_an_unrecorded_replica_loads(
    replicas: ReplicaStore, tmp_path: Path
) -> None:
    replicas.record(_record("http://a:8000"))
    same = BaseFingerprint("SmolLM2-135M-Instruct", "sha256:" + "ab" * 32)
    other = BaseFingerprint("Qwen2.5-0.5B", "sha256:" + "cd" * 32)
    recorded, unrecorded = _Admin("http://a:8000"), _Admin("http://b:8000")
    assert load_checked(recorded, "legal-v1", _adapter_on(tmp_path / "v1", same), replicas)  # type: ignore[arg-type]
    assert load_checked(recorded, "legal-v0", _adapter_on(tmp_path / "v0", None), replicas)  # type: ignore[arg-type]
    assert load_checked(unrecorded, "legal-v2", _adapter_on(tmp_path / "v2", other), replicas)  # type: ignore[arg-type]
    assert [name for name, _ in recorded.loaded + unrecorded.loaded] == [
        "legal-v1",
        "legal-v0",
        "legal-v2",
    ]
    assert refusal_on(None, tmp_path / "v2") is None


# --------------------------------------------------------------------------- the rollout reads them


def _promoted(world: World, version: int) -> None:
    deployed = deploy_canary(world.settings, world.clients, LINE, version, world.urls)
    assert deployed.status == "canary", deployed.reason
    outcome = judge_canary(
        world.settings, world.clients, LINE, force=CanaryAction.PROMOTE, upstreams=world.urls
    )
    assert outcome.action == "promote"


def test_a_replica_started_with_max_loras_2_refuses_a_third_routed_adapter(world: World) -> None:
    # FLYWHEEL_VLLM_MAX_LORAS is 4 (the default): the replicas' records decide.
    assert world.settings.vllm_max_loras == 4
    for url in world.urls:
        world.clients.replicas.record(_record(url, max_loras=2))
    v1, v2, v3 = world.register(), world.register(), world.register()
    _promoted(world, v1)
    _promoted(world, v2)

    third = deploy_canary(world.settings, world.clients, LINE, v3, world.urls)

    assert third.status == "refused"
    assert f"{LINE}-v{v3} would make 3 adapters served at once" in third.reason
    assert f"--max-loras 2 (recorded by {world.urls[0]} at its start)" in third.reason
    assert world.table().canary is None
    assert world.loaded() == [{f"{LINE}-v{v1}", f"{LINE}-v{v2}"}] * 2
    assert world.check() == []
    # One replica restarted with more room: the smallest over the line's replicas still holds.
    world.clients.replicas.record(_record(world.urls[1], max_loras=8))
    again = deploy_canary(world.settings, world.clients, LINE, v3, world.urls)
    assert again.status == "refused"
    # The check reads each replica's own limit too.
    world.clients.replicas.record(_record(world.urls[0], max_loras=1))
    assert world.check() == [
        f"2 adapters are routed to {world.urls[0]}, over its --max-loras 1 (recorded by "
        f"{world.urls[0]} at its start): {LINE}-v{v1}, {LINE}-v{v2}"
    ]


def test_an_adapter_of_another_base_is_rejected_before_any_user_is_routed(
    world: World, tmp_path: Path
) -> None:
    served = BaseFingerprint("SmolLM2-135M-Instruct", "sha256:" + "ab" * 32)
    other = BaseFingerprint("Qwen2.5-0.5B-Instruct", "sha256:" + "cd" * 32)
    for url in world.urls:
        world.clients.replicas.record(_record(url, base_digest=served.digest))
    folder = fake_adapter(tmp_path / "trained-on-qwen")
    write_base_record(folder, other)
    version = register_version(world.settings, world.registry, LINE, folder, tmp_path)

    deployed = deploy_canary(world.settings, world.clients, LINE, version, world.urls)

    assert deployed.status == "failed"
    assert f"{world.urls[0]} refuses {LINE}-v{version}: trained on Qwen2.5-0.5B-Instruct" in (
        deployed.reason
    )
    assert "this replica serves SmolLM2-135M-Instruct" in deployed.reason
    assert world.loaded() == [set(), set()]
    assert world.table().adapters == set()
    rejected = world.registry.version_tags(LINE, version)["rolled_back"]
    assert "trained on Qwen2.5-0.5B-Instruct" in rejected
    assert world.registry.alias_version(LINE, "candidate") is None


def test_a_replica_restarted_on_another_base_is_not_given_the_routed_adapters(
    world: World, tmp_path: Path
) -> None:
    served = BaseFingerprint("SmolLM2-135M-Instruct", "sha256:" + "ab" * 32)
    folder = fake_adapter(tmp_path / "trained-on-smollm")
    write_base_record(folder, served)
    version = register_version(world.settings, world.registry, LINE, folder, tmp_path)
    _promoted(world, version)
    adapter = f"{LINE}-v{version}"
    restarted = world.replicas[1]
    restarted.behaviour.adapters.clear()
    world.clients.replicas.record(_record(restarted.base_url, base_digest="sha256:" + "ef" * 32))

    summary = sync_adapters(world.settings, world.clients, world.urls)

    assert world.loaded() == [{adapter}, set()]
    [refused] = summary[restarted.base_url]["failed"]
    assert refused.startswith(f"{adapter}: refused: trained on SmolLM2-135M-Instruct")


def test_a_recipe_rank_over_a_replicas_recorded_rank_is_refused_before_training(
    settings: Settings,
) -> None:
    from composition.line_training import _check_servable_rank
    from tests.fake_clients import fake_clients

    upstream = settings.gateway.upstreams[0]
    clients = fake_clients(settings)
    _check_servable_rank(settings, clients, "legal", 16)
    with pytest.raises(FlywheelError, match="the setting FLYWHEEL_VLLM_MAX_LORA_RANK"):
        _check_servable_rank(settings, clients, "legal", settings.vllm_max_lora_rank + 1)
    clients.replicas.record(_record(upstream, max_lora_rank=8))
    with pytest.raises(FlywheelError) as refused:
        _check_servable_rank(settings, clients, "legal", 16)
    assert f"--max-lora-rank 8 (recorded by {upstream} at its start)" in str(refused.value)
    clients.close()
