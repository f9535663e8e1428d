"""Two real vLLM CPU replicas behind the gateway: canary deploy, promotion, rollback, and
one replica killed and restarted under traffic. ``flywheel lifecycle check`` (its function)
must show no drift after every step."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from composition.clients import Clients, build_clients
from composition.rollout import deploy_canary, judge_canary
from feedback.schema import interactions_table
from feedback.store import FeedbackStore
from flywheel.settings import Settings, load_settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from registry.adapter_sync import lifecycle_check, sync_adapters
from registry.canary import CanaryAction
from registry.routes import RouteStore
from registry.routing import choose_arm
from registry.tracking import Registry
from registry.vllm_admin import busy_adapters
from registry.vllm_server import VllmServer, VllmServerSettings, free_port
from tests.registered import register_version
from tests.servers import serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]
logger = logging.getLogger(__name__)

LINE = "customer_service"
KEY = "fw-lifecycle-key"


@dataclass
class Fleet:
    settings: Settings
    store: FeedbackStore
    registry: Registry
    servers: list[VllmServer]
    adapter: Path
    work: Path
    gateway: str = ""
    answers: list[tuple[float, int, str]] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [s.base_url for s in self.servers]

    @cached_property
    def clients(self) -> Clients:
        return build_clients(self.settings)

    def register(self) -> str:
        folder = self.work / f"adapter-{time.monotonic_ns()}"
        shutil.copytree(self.adapter, folder)
        version = register_version(self.settings, self.registry, LINE, folder, self.work)
        return f"{LINE}-v{version}"

    def settings_recipe_steps(self) -> tuple[float, ...]:
        from composition.recipes import recipe_for

        return recipe_for(self.settings, LINE).canary_steps

    def drift(self) -> list[str]:
        return lifecycle_check(self.settings, self.clients, self.urls)["problems"]

    def settled(self, timeout_s: float = 10.0) -> None:
        """Wait until the gateway serves the line's newest routing revision (it re-reads the
        tables every ``routes_refresh_s``; a request sent sooner may see the old table)."""
        stored = RouteStore(self.store.engine).snapshot().revisions.get(LINE)
        deadline = time.monotonic() + timeout_s
        while True:
            health = httpx.get(
                f"{self.gateway}/healthz",
                headers={"Authorization": f"Bearer {KEY}"},  # an operator's: each line's revision
                timeout=10,
            ).json()
            if health["routes_revisions"].get(LINE) == stored:
                return
            assert time.monotonic() < deadline, f"gateway still at {health}, store at {stored}"
            time.sleep(0.02)

    def ask(self, user: str) -> httpx.Response:
        return httpx.post(
            f"{self.gateway}/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={
                "model": LINE,
                "messages": [{"role": "user", "content": "Say hello to a customer."}],
                "user": user,
                "max_tokens": 8,
                "temperature": 0,
            },
            timeout=60,
        )

    def served_by(self, answer: httpx.Response, timeout_s: float = 5.0) -> str | None:
        """The adapter that answered, as the gateway logged it (no answer tells its caller)."""
        request_id = answer.headers["x-request-id"]
        table = interactions_table.c
        query = select(table.adapter_name).where(table.request_id == request_id)
        deadline = time.monotonic() + timeout_s
        while True:
            with self.store.engine.connect() as connection:
                found = connection.execute(query).first()
            if found is not None:
                return found.adapter_name
            assert time.monotonic() < deadline, f"{request_id} was never logged"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def fleet(
    vllm_python: Path,
    base_model_dir: Path,
    lora_adapter: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("lifecycle")
    patch = pytest.MonkeyPatch()
    patch.setenv("FLYWHEEL_HOME", str(work / "home"))
    patch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    patch.delenv("FLYWHEEL_MLFLOW_TRACKING_URI", raising=False)
    settings = load_settings()
    store = FeedbackStore.open(settings)
    registry = Registry.for_home(settings.home, settings.mlflow_tracking_uri)
    servers = [
        VllmServer(
            # Two servers on 2 cores, one restarting under traffic: allow a slow start.
            VllmServerSettings(model=base_model_dir, port=free_port(), start_timeout_s=600),
            python=vllm_python,
            log_path=work / f"vllm-{i}.log",
            # vLLM pins each server's threads to the same core by default; on 2 cores a
            # restarting replica then waits behind the serving one's spinning threads.
            env={**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
        )
        for i in range(2)
    ]
    try:
        for server in servers:
            server.start()
        fleet = Fleet(settings, store, registry, servers, lora_adapter, work)
        keys = KeyRing(
            [ApiKey(name="ops", sha256=key_digest(KEY), business_lines=("*",), operator=True)]
        )
        config = GatewaySettings(
            upstreams=tuple(fleet.urls),
            routes_refresh_s=0.05,
            log_flush_s=0.05,
            replica_watch_s=1.0,
        )
        app = create_app(settings, config, store=store, routes=RouteStore(store.engine), keys=keys)
        with serving(app, free_port()) as url:
            fleet.gateway = url
            yield fleet
    finally:
        for server in servers:
            server.stop()
        store.close()
        patch.undo()


def _user_on(table: object, arm: str) -> str:
    return next(f"u{i}" for i in range(10_000) if choose_arm(table, f"u{i}")[0] == arm)  # type: ignore[arg-type]


def test_deploy_promote_rollback_on_two_replicas(fleet: Fleet) -> None:
    routes = RouteStore(fleet.store.engine)
    first = fleet.register()
    deployed = deploy_canary(
        fleet.settings, fleet.clients, LINE, int(first.split("-v")[1]), fleet.urls
    )
    assert deployed.status == "canary", deployed.reason
    assert deployed.loaded_on == fleet.urls
    assert fleet.drift() == []
    for _ in range(len(fleet.settings_recipe_steps())):
        promoted = judge_canary(fleet.settings, fleet.clients, LINE, force=CanaryAction.PROMOTE,
                                upstreams=fleet.urls)  # fmt: skip
        assert fleet.drift() == [], promoted.action
        if promoted.action == "promote":
            break
    assert promoted.action == "promote"
    assert fleet.drift() == []
    fleet.settled()
    answer = fleet.ask("anyone")
    assert answer.status_code == 200
    assert fleet.served_by(answer) == first

    bad = fleet.register()
    second = deploy_canary(fleet.settings, fleet.clients, LINE, int(bad.split("-v")[1]), fleet.urls)
    assert second.status == "canary", second.reason
    fleet.settled()
    table = routes.table(LINE)
    canary_user = _user_on(table, "canary")
    assert fleet.served_by(fleet.ask(canary_user)) == bad
    started = time.monotonic()
    rolled = judge_canary(fleet.settings, fleet.clients, LINE, force=CanaryAction.ROLLBACK,
                          reason="rehearsal", upstreams=fleet.urls)  # fmt: skip
    assert rolled.action == "rollback"
    # The canary's users are back on the champion within a second, on every replica (the
    # gateway re-reads the tables every 0.05 s here).
    deadline = started + 1.0
    while True:
        sent = time.monotonic()
        if fleet.served_by(fleet.ask(canary_user)) == first:
            break
        assert sent < deadline, "the rollback took over a second"
    for url in fleet.urls:
        models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert bad not in {m["id"] for m in models}
    assert fleet.drift() == []


def test_a_replica_restarted_under_traffic_gets_its_adapters_back(fleet: Fleet) -> None:
    routes = RouteStore(fleet.store.engine)
    champion = routes.table(LINE).champion
    assert champion is not None, "runs after the deploy test"
    # A canary too: almost no traffic reaches it, so only the gateway's replica watch can
    # bring it back on the restarted replica.
    canary = fleet.register()
    deployed = deploy_canary(
        fleet.settings, fleet.clients, LINE, int(canary.split("-v")[1]), fleet.urls
    )
    assert deployed.status == "canary", deployed.reason
    fleet.settled()
    stop = threading.Event()
    failures: list[str] = []
    served: list[float] = []

    def traffic() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                answer = fleet.ask(f"load-{i}")
            except httpx.HTTPError as exc:
                failures.append(f"{time.monotonic():.1f} {exc!r}")
                continue
            if answer.status_code != 200:
                failures.append(f"{time.monotonic():.1f} {answer.status_code} {answer.text[:120]}")
            else:
                served.append(time.monotonic())
            stop.wait(0.25)  # steady traffic, not a flood that starves the restart

    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    restarted = fleet.servers[1]
    try:
        restarted.stop()
        killed_at = time.monotonic()
        time.sleep(3)
        restarted.start()  # a fresh vLLM: no adapter loaded
        back_at = time.monotonic()
        deadline = back_at + 30
        while (drift := fleet.drift()) and time.monotonic() < deadline:
            time.sleep(0.2)
        recovered_s = time.monotonic() - back_at
        time.sleep(max(0.0, back_at + 5 - time.monotonic()))  # traffic goes on a while
    finally:
        stop.set()
        worker.join(120)
    # While it was down the other replica answered; once it answers again nothing fails:
    # the gateway passes a 404 to the other replica and reloads the adapter there, and its
    # replica watch (every second here) loads whatever else the tables route.
    assert [s for s in served if killed_at < s < back_at], "no answer while one replica was down"
    assert failures == [], failures
    assert drift == []
    assert fleet.drift() == []
    logger.info(
        "restarted replica serves champion and canary again %.1f s after it answered "
        "(replica watch every 1 s here)",
        recovered_s,
    )
    models = httpx.get(f"{restarted.base_url}/v1/models", timeout=10).json()["data"]
    assert {champion, canary} <= {m["id"] for m in models}
    # The reconciler agrees: nothing left to load or unload.
    summary = sync_adapters(fleet.settings, fleet.clients, fleet.urls)
    assert all(not r["loaded"] and not r["unloaded"] and not r["failed"] for r in summary.values())
    rolled = judge_canary(fleet.settings, fleet.clients, LINE, force=CanaryAction.ROLLBACK,
                          reason="done", upstreams=fleet.urls)  # fmt: skip
    assert rolled.action == "rollback"
    assert fleet.drift() == []


def test_the_drain_reads_vllms_own_metrics(fleet: Fleet) -> None:
    champion = RouteStore(fleet.store.engine).table(LINE).champion
    assert champion is not None
    url = fleet.urls[0]
    seen: set[str] = set()

    def long_answer() -> None:
        httpx.post(
            f"{url}/v1/chat/completions",
            json={
                "model": champion,
                "messages": [{"role": "user", "content": "Tell me a long story."}],
                "max_tokens": 200,
                "min_tokens": 200,
            },
            timeout=120,
        )

    worker = threading.Thread(target=long_answer)
    worker.start()
    deadline = time.monotonic() + 30
    while worker.is_alive() and time.monotonic() < deadline and champion not in seen:
        seen = busy_adapters(httpx.get(f"{url}/metrics", timeout=10).text)
        time.sleep(0.1)
    worker.join()
    assert champion in seen
    time.sleep(1)
    assert champion not in busy_adapters(httpx.get(f"{url}/metrics", timeout=10).text)
