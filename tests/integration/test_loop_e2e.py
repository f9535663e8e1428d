"""The whole loop on real services: the nightly Prefect flow trains, gates, registers and
hot-loads an adapter on vLLM as a 5% canary; users reach both arms through the gateway; the
canary flow promotes a good canary and rolls a bad one back; a nightly run killed during
training is rerun on the same window and registers once.

PostgreSQL holds the feedback store, MLflow is the local SQLite store of each test's home,
vLLM runs on the CPU (the session's server) and Prefect runs against a temporary API server
(one per module). The recipes are tiny (4 DPO steps, a loose gate, a canary policy that
decides on 20 requests per arm) so the module fits a small CPU machine.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update

from composition.clients import build_clients
from composition.recipes import start_training_run
from feedback.schema import interactions_table, watermarks_table
from feedback.store import FeedbackStore
from feedback.watermarks import WatermarkStore
from flywheel.settings import Settings, load_settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator
from registry.names import model_name
from registry.records import TAG_DATASET_HASH
from registry.routes import RouteStore
from registry.routing import RoutingTable, choose_arm
from registry.tracking import Registry
from registry.vllm_admin import VllmAdminClient
from registry.vllm_server import VllmServer, free_port
from tests.conftest import REPO
from tests.servers import serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]

logger = logging.getLogger(__name__)

LINE = "customer_service"
CS_KEY = "fw-cs-loop"
HTTP_TIMEOUT = httpx.Timeout(120.0)
MIN_REQUESTS = 20
PER_ARM = 24
# Every prompt differs: the gateway records a repeated prompt as a regenerate.
_PROMPTS = itertools.count()
# A tiny DPO recipe: 4 steps at a high learning rate, so that even this little training
# changes the greedy answers (vLLM's probe refuses an adapter that answers like the base
# model); a gate that lets any working adapter through; a canary that decides on 20
# requests per arm, promotes straight to 100% (no soak) and tolerates CPU latency noise.
RECIPE = """\
business_line: customer_service
method: dpo
lora: {rank: 8, alpha: 16, dropout: 0.0}
learning_rate: 1.0e-2
max_steps: 4
batch_size: 2
max_length: 128
min_new_examples: 10
eval_generations: 2
gate: {preference_test: non_inferior, non_inferiority_margin: 1.0, min_margin_gain: -100,
       min_eval_pairs: 1, max_preferred_loss_increase: 10, max_general_loss_increase: 10,
       max_refusal_rate_increase: 1, max_length_ratio: 100, min_length_ratio: 0.01,
       allow_pii_in_generations: true}
canary_steps: [0.05, 1.0]
canary:
  min_requests: 20
  alpha: 0.2
  max_looks: 5
  margins: {thumbs_down: 0.5, regenerate: 0.5, edit: 0.5, error: 0.5, abandon: 0.5,
            task_failure: 0.5, dissatisfied: 0.5, refusal: 0.5}
  max_p99_ratio: 20.0
  p99_slack_ms: 10000
  max_ttft_p99_ratio: 20.0
  ttft_slack_ms: 10000
  max_tpot_ratio: 20.0
  tpot_slack_ms: 10000
  max_length_change: 0.99
rollout: {soak_s: 0, watch_s: 0}
"""


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def prefect_api() -> Iterator[str]:
    """A temporary Prefect API server (and database) for the module; its URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        url = PREFECT_API_URL.value()
        assert url
        yield str(url)


@pytest.fixture
def vllm(vllm_server: VllmServer) -> Iterator[VllmServer]:
    """The session's vLLM; adapters a test loads are unloaded after it, so the next test can
    load its own version 1 under the same name."""
    with VllmAdminClient(vllm_server.base_url, timeout=120) as admin:
        before = {model.id for model in admin.list_models()}
    yield vllm_server
    with VllmAdminClient(vllm_server.base_url, timeout=120) as admin:
        for model in admin.list_models():
            if model.is_adapter and model.id not in before:
                admin.unload_adapter(model.id)


@dataclass
class Loop:
    """One test's flywheel: settings from the environment the flows read, and the store."""

    settings: Settings
    store: FeedbackStore
    vllm_url: str

    @property
    def registry(self) -> Registry:
        return Registry.for_home(self.settings.home, self.settings.mlflow_tracking_uri)

    @property
    def routes(self) -> RouteStore:
        return RouteStore(self.store.engine)

    def watermark(self) -> dict[str, Any]:
        return WatermarkStore(self.store.engine).watermarks()[LINE]

    def served_adapters(self) -> dict[str, str | None]:
        """The adapters vLLM serves now, with the folder each was loaded from."""
        with VllmAdminClient(self.vllm_url, timeout=120) as admin:
            return {m.id: m.root for m in admin.list_models() if m.is_adapter}


@pytest.fixture
def loop(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_url: str,
    base_model_dir: Path,
    vllm: VllmServer,
    prefect_api: str,
) -> Iterator[Loop]:
    """The environment the flows read (PostgreSQL store, MLflow under a fresh home, the tiny
    recipe, the converted base model, the session's vLLM) and the opened store."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / f"{LINE}.yaml").write_text(RECIPE, encoding="utf-8")
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLYWHEEL_DATABASE_URL", postgres_url)
    monkeypatch.setenv("FLYWHEEL_RECIPES_DIR", str(recipes))
    monkeypatch.setenv("FLYWHEEL_BASE_MODEL", str(base_model_dir))
    monkeypatch.setenv("FLYWHEEL_GATEWAY_UPSTREAMS", vllm.base_url)
    monkeypatch.delenv("FLYWHEEL_MLFLOW_TRACKING_URI", raising=False)
    settings = load_settings()
    store = FeedbackStore.open(settings)
    yield Loop(settings, store, vllm.base_url)
    store.close()


# --------------------------------------------------------------------------- helpers


def _simulate(store: FeedbackStore, requests: int = 500, seed: int = 3) -> None:
    """A day of customer-service traffic with feedback, ending a day ago (about 34 DPO
    training pairs for 500 requests)."""
    simulation = SimulationSettings(
        requests=requests,
        seed=seed,
        start=datetime.now(UTC) - timedelta(days=2),
        business_lines=(LINE,),
    )
    store.ingest(TrafficSimulator(simulation).events(), source="simulate")


@dataclass
class Gateway:
    """A gateway on a real port in front of the session's vLLM."""

    url: str
    app: Any
    store: FeedbackStore

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {CS_KEY}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=HTTP_TIMEOUT)

    def flush(self) -> None:
        """Wait until the recorder has written every interaction and feedback it holds."""
        assert self.app.state.gateway.recorder.flush(60)

    def served(self, response: httpx.Response) -> tuple[str | None, str | None]:
        """(arm, adapter) that answered, as the gateway logged it: no answer tells its
        caller (the adapter None: the base model)."""
        self.flush()
        table = interactions_table.c
        query = select(table.arm, table.adapter_name).where(
            table.request_id == response.headers["x-request-id"]
        )
        with self.store.engine.connect() as connection:
            arm, adapter = connection.execute(query).one()
        return arm, adapter


@contextmanager
def running_gateway(loop: Loop) -> Iterator[Gateway]:
    """A gateway on ``loop``'s store, with one key for customer_service."""
    keys = KeyRing([ApiKey(name="cs", sha256=key_digest(CS_KEY), business_lines=(LINE,))])
    config = GatewaySettings(upstreams=(loop.vllm_url,), routes_refresh_s=0.1, log_flush_s=0.05)
    app = create_app(
        loop.settings, config, store=loop.store, routes=RouteStore(loop.store.engine), keys=keys
    )
    with serving(app, free_port()) as url:
        yield Gateway(url, app, loop.store)


def _users_by_arm(table: RoutingTable, per_arm: int) -> dict[str, list[str]]:
    """``per_arm`` user ids that the sticky split sends to each of its two arms."""
    found: dict[str, list[str]] = {}
    for index in range(200_000):
        user = f"user-{index}"
        arm, _ = choose_arm(table, user)
        group = found.setdefault(arm, [])
        if len(group) < per_arm:
            group.append(user)
        if len(found) == 2 and all(len(g) == per_arm for g in found.values()):
            return found
    raise AssertionError(f"the split of {table} gave too few users to an arm")


def _ask(gateway: Gateway, user: str) -> httpx.Response:
    """One short chat request of ``user`` (2 tokens: the answer's content does not matter)."""
    prompt = f"Question {next(_PROMPTS)}: where is my parcel?"
    body = {
        "model": LINE,
        "messages": [{"role": "user", "content": prompt}],
        "user": user,
        "max_tokens": 2,
        "temperature": 0,
    }
    with gateway.client() as client:
        return client.post("/v1/chat/completions", json=body)


def _served_by(gateway: Gateway, user: str, adapter: str | None, within_s: float = 5.0) -> int:
    """Assert that ``user``'s requests reach ``adapter`` (None: the base model) within
    ``within_s`` (the gateway re-reads the routing table every 0.1 s here); the number of
    requests it took."""
    deadline = time.monotonic() + within_s
    sent = 0
    while True:
        response = _ask(gateway, user)
        sent += 1
        assert response.status_code == 200, response.text
        served = gateway.served(response)[1]
        if served == adapter or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert served == adapter, (user, served, adapter)
    assert response.json()["model"] == LINE  # the answer never names the adapter
    return sent


def _interaction(request_id: str, adapter: str | None, created: datetime) -> dict[str, Any]:
    return {
        "type": "interaction",
        "request_id": request_id,
        "user_id": f"u-{request_id}",
        "business_line": LINE,
        "adapter_name": adapter,
        "arm": "canary" if adapter else "base",
        "base_model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "user", "content": f"q {request_id}"}],
        "response": "a",
        "latency_ms": 100.0,
        "status": "ok",
        "created_at": created.isoformat(),
    }


def _arm_traffic(
    adapter: str | None, requests: int, thumbs_down: int, start: datetime
) -> list[dict[str, Any]]:
    """``requests`` logged interactions of one arm, the first ``thumbs_down`` disliked."""
    prefix = adapter or "base"
    events: list[dict[str, Any]] = []
    for index in range(requests):
        request_id = f"{prefix}-{index}"
        created = start + timedelta(milliseconds=index)
        events.append(_interaction(request_id, adapter, created))
        if index < thumbs_down:
            events.append(
                {
                    "type": "thumbs_down",
                    "request_id": request_id,
                    "idempotency_key": f"td-{request_id}",
                    "created_at": created.isoformat(),
                }
            )
    return events


def _versions(registry: Registry) -> list[Any]:
    return list(registry.client.search_model_versions(f"name = '{model_name(LINE)}'"))


def _as_utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


# --------------------------------------------------------------------------- tests


def test_nightly_then_canary_promotes_a_good_adapter(loop: Loop) -> None:
    from flows.canary import canary_watch
    from flows.nightly import run_nightly
    from registry.decisions import canary_decisions

    _simulate(loop.store)
    started = time.monotonic()
    [report] = run_nightly(lines=[LINE])
    logger.info("nightly run: %.0f s, %s", time.monotonic() - started, report)

    # Trained, gated, registered, hot-loaded and probed, then a 5% canary.
    assert report["status"] == "deployed", report
    assert report["examples"]["dpo"] >= 10
    assert (report["version"], report["adapter"]) == (1, f"{LINE}-v1")
    assert report["resumed"] is False
    adapter = report["adapter"]
    registry = loop.registry
    assert registry.aliases(LINE) == {"candidate": 1, "canary": 1}
    assert loop.served_adapters()[adapter] == str(registry.adapter_path(LINE, 1))
    table = loop.routes.table(LINE)
    assert (table.champion, table.canary, table.canary_fraction) == (None, adapter, 0.05)
    [change, *_] = loop.routes.history(LINE)
    assert (change.action, change.actor) == ("canary_set", "flywheel:canary")
    mark = loop.watermark()
    assert mark["watermark"] == datetime.fromisoformat(report["window_until"])
    assert mark["pending_until"] is None
    assert str(mark["outcome"]).startswith("deployed")

    # Real users through the gateway: both arms well past the canary's minimum.
    users = _users_by_arm(table, PER_ARM)
    assert set(users) == {"base", "canary"}
    started = time.monotonic()
    with running_gateway(loop) as gateway:
        jobs = [(arm, user) for arm, group in users.items() for user in group]
        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(lambda job: (job[0], _ask(gateway, job[1])), jobs))
        served: dict[str, list[str]] = {"base": [], "canary": []}
        for arm, response in answers:
            assert response.status_code == 200, response.text
            # The canary's answers come from the adapter, the others from the base model.
            assert gateway.served(response) == (arm, adapter if arm == "canary" else None)
            assert response.json()["model"] == LINE
            served[arm].append(response.headers["x-request-id"])
        # A few thumbs-down on each arm, at the same rate.
        with gateway.client() as client:
            for request_ids in served.values():
                for request_id in request_ids[:2]:
                    posted = client.post(
                        "/v1/feedback", json={"request_id": request_id, "type": "thumbs_down"}
                    )
                    assert posted.status_code == 202, posted.text
        gateway.flush()
        logger.info("%d requests and feedback: %.0f s", len(jobs), time.monotonic() - started)

        results = canary_watch(lines=[LINE])

        assert [(r["business_line"], r["action"]) for r in results] == [(LINE, "promote")]
        # Everyone is on the new champion at once, the base-arm users included.
        _served_by(gateway, users["base"][0], adapter)

    table = loop.routes.table(LINE)
    assert (table.champion, table.canary, table.previous) == (adapter, None, None)
    assert registry.aliases(LINE) == {"champion": 1}
    tags = registry.version_tags(LINE, 1)
    assert tags["promoted_by"] == "flywheel:canary"
    assert adapter in loop.served_adapters()
    [decision] = canary_decisions(loop.store, LINE)
    assert (decision["action"], decision["adapter"], decision["look"]) == ("promote", adapter, 1)
    assert decision["canary_fraction"] == 0.05
    numbers = decision["numbers"]
    assert numbers["canary"]["requests"] == PER_ARM
    assert numbers["champion"]["requests"] == PER_ARM
    assert numbers["canary"]["signals"]["thumbs_down"] == 2
    assert numbers["champion"]["signals"]["thumbs_down"] == 2
    assert numbers["canary"]["signals"]["dissatisfied"] == 2
    assert {c["metric"]: c["verdict"] for c in numbers["checks"]} == {
        "thumbs_down_rate": "OK",
        "regenerate_rate": "OK",
        "edit_rate": "OK",
        "error_rate": "OK",
        "abandon_rate": "OK",
        "task_failure_rate": "OK",
        "dissatisfied_rate": "OK",
        "refusal_rate": "OK",
        "p99_latency_ms": "OK",
        "p99_ttft_ms": "OK",
        "p50_tpot_ms": "OK",
        "mean_output_tokens": "OK",
    }


def test_a_bad_canary_is_rolled_back(loop: Loop, lora_adapter: Path, tmp_path: Path) -> None:
    from composition.recipes import recipe_for
    from composition.rollout import deploy_canary
    from flows.canary import canary_watch
    from registry.decisions import canary_decisions

    # A registered version by hand (the tiny adapter of the session, which answers unlike
    # the base model), deployed as a canary by the same function the nightly flow uses.
    registry = loop.registry
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}", encoding="utf-8")
    dataset_hash = "ab" * 32
    lineage = {
        "base_model": loop.settings.base_model.name if loop.settings.base_model else "-",
        "dataset_hash": dataset_hash,
        "recipe_hash": "cd" * 32,
        "code_version": "test",
    }
    run_id = start_training_run(
        registry,
        recipe_for(loop.settings, LINE),
        dataset_hash,
        manifest,
        lineage["base_model"],
        "test",
    )
    registry.log_adapter(run_id, lora_adapter)
    version = registry.register_adapter(run_id, LINE, lineage)
    registry.set_candidate(LINE, version)
    registry.finish_run(run_id)
    deployed = deploy_canary(
        loop.settings, build_clients(loop.settings), LINE, version, [loop.vllm_url]
    )
    assert deployed.status == "canary", deployed.reason
    adapter = deployed.adapter
    assert adapter in loop.served_adapters()
    table = loop.routes.table(LINE)
    assert (table.champion, table.canary) == (None, adapter)
    assert registry.aliases(LINE) == {"candidate": version, "canary": version}

    with running_gateway(loop) as gateway:
        users = _users_by_arm(table, 1)
        canary_user = users["canary"][0]
        asked = _served_by(gateway, canary_user, adapter)
        # The canary's window in the store: 40 requests per arm, the canary disliked half
        # the time, the champion (the base model) twice.
        since = loop.routes.history(LINE)[0].created_at
        start = _as_utc(since) + timedelta(milliseconds=1)
        events = _arm_traffic(None, 40, 2, start) + _arm_traffic(adapter, 40, 20, start)
        loop.store.ingest(events, source="test")
        gateway.flush()

        results = canary_watch(lines=[LINE])

        assert [r["action"] for r in results] == ["rollback"], results
        # Traffic first: the canary's users are back on the champion within a second.
        _served_by(gateway, canary_user, None, within_s=1.5)

    reason = results[0]["reason"]
    assert "thumbs-down rate higher on the canary" in reason
    table = loop.routes.table(LINE)
    assert (table.champion, table.canary) == (None, None)
    [change, *_] = loop.routes.history(LINE)
    assert (change.action, change.actor, change.reason) == (
        "canary_clear",
        "flywheel:canary",
        reason,
    )
    tags = registry.version_tags(LINE, version)
    assert tags["rolled_back"] == reason
    assert tags["rolled_back_by"] == "flywheel:canary"
    assert "canary" not in registry.aliases(LINE)
    assert "candidate" not in registry.aliases(LINE)
    assert adapter not in loop.served_adapters()
    [decision] = canary_decisions(loop.store, LINE)
    assert (decision["action"], decision["adapter"], decision["look"]) == ("rollback", adapter, 1)
    numbers = decision["numbers"]
    # The canary user's requests through the gateway are in the canary's window too.
    assert (numbers["canary"]["requests"], numbers["champion"]["requests"]) == (40 + asked, 40)
    assert numbers["canary"]["signals"]["thumbs_down"] == 20
    assert numbers["champion"]["signals"]["thumbs_down"] == 2
    verdicts = {c["metric"]: c["verdict"] for c in numbers["checks"]}
    assert verdicts["thumbs_down_rate"] == "WORSE"
    assert verdicts["dissatisfied_rate"] == "WORSE"


def _lease(loop: Loop) -> tuple[str | None, datetime | None]:
    with loop.store.engine.connect() as connection:
        row = connection.execute(
            select(watermarks_table.c.locked_by, watermarks_table.c.locked_until).where(
                watermarks_table.c.business_line == LINE
            )
        ).one()
    return row.locked_by, row.locked_until


def _running_training(registry: Registry) -> Any | None:
    """The line's MLflow run that is RUNNING, if any."""
    experiment = registry.client.get_experiment_by_name(f"flywheel/{LINE}")
    if experiment is None:
        return None
    runs = registry.client.search_runs(
        [experiment.experiment_id], filter_string="attributes.status = 'RUNNING'"
    )
    return runs[0] if runs else None


def test_a_nightly_run_killed_during_training_then_rerun_registers_once(
    loop: Loop, prefect_api: str, tmp_path: Path
) -> None:
    from feedback.leases import LEASE_S
    from flows.nightly import line_nightly

    _simulate(loop.store)
    registry = loop.registry
    # Create MLflow's database and the line's experiment before the child writes to them.
    registry.experiment_id(LINE)
    child_log = tmp_path / "nightly-child.log"
    code = "from flows.nightly import line_nightly; line_nightly('customer_service')"
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    with child_log.open("wb") as log:
        child = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        training = None
        while training is None:
            assert child.poll() is None, child_log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, "training never started in the child"
            time.sleep(1.0)
            training = _running_training(registry)
        # Into the trainer itself: it has made its output folder, and no adapter yet.
        output = loop.settings.runs_dir / LINE / training.info.run_id
        while not output.is_dir():
            assert child.poll() is None, child_log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, "the trainer never started in the child"
            time.sleep(0.2)
        time.sleep(1.0)
        assert child.poll() is None
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
    assert not (output / "adapter").exists()
    killed_run = registry.client.get_run(training.info.run_id)
    assert killed_run.info.status == "RUNNING"  # nobody closed it: the process died
    dataset_hash = killed_run.data.tags[TAG_DATASET_HASH]

    # The dead run moved nothing: its window is pending, no version registered, and its
    # lease is still held (it expires LEASE_S after the last renewal).
    mark = loop.watermark()
    pending = mark["pending_until"]
    assert pending is not None
    assert mark["watermark"] is None
    assert _versions(registry) == []
    owner, until = _lease(loop)
    assert owner is not None
    assert owner.split(":")[1] == str(child.pid)
    assert until is not None
    assert _as_utc(until) > datetime.now(UTC)

    # A rerun at once finds the line busy and returns without waiting or touching anything.
    started = time.monotonic()
    busy = line_nightly(LINE)
    assert busy["status"] == "busy", busy
    assert time.monotonic() - started < 60
    assert loop.watermark()["pending_until"] == pending
    assert _lease(loop)[0] == owner

    # LEASE_S (600 s) later the dead run's lease has run out; instead of waiting ten minutes
    # the test moves its expiry into the past, as time would.
    assert LEASE_S == 600.0
    with loop.store.engine.begin() as connection:
        connection.execute(
            update(watermarks_table)
            .where(watermarks_table.c.business_line == LINE)
            .values(locked_until=datetime.now(UTC) - timedelta(seconds=1))
        )

    started = time.monotonic()
    report = line_nightly(LINE)
    logger.info("rerun after the kill: %.0f s, %s", time.monotonic() - started, report)

    assert report["status"] == "deployed", report
    assert report["resumed"] is True
    assert datetime.fromisoformat(report["window_until"]) == _as_utc(pending)
    [registered] = _versions(registry)
    assert int(registered.version) == report["version"] == 1
    assert registered.tags["dataset_hash"] == dataset_hash  # the same window, the same data
    mark = loop.watermark()
    assert mark["watermark"] == pending
    assert mark["pending_until"] is None
    assert _lease(loop) == (None, None)
    assert loop.routes.table(LINE).canary == f"{LINE}-v1"
    # The dead process's MLflow run no longer claims to be running.
    assert registry.client.get_run(training.info.run_id).info.status == "KILLED"
