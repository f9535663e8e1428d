"""An A/B experiment through the gateway on a real vLLM (CPU, runtime LoRA) between two
tiny adapters trained by flywheel's own trainer: one answers late-delivery questions with
an apology, the other without. Simulated customer-service users (``lab.simulation.users``)
judge the answer they really got and report a task outcome through the gateway's feedback
API; the sequential test must pick the apologising adapter, ``promote`` must make it the
champion (routing and MLflow alias), and the feedback page must show the decision."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from composition.clients import Clients, build_clients
from composition.experiments import look_experiment, promote_experiment, start_experiment
from dashboard.app import create_app as create_dashboard
from feedback.schema import interactions_table
from feedback.store import FeedbackStore
from flywheel.settings import Settings, load_settings
from flywheel.settings.dashboard import DashboardSettings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from lab.simulation.users import CustomerServiceUsers
from registry.routes import RouteStore
from registry.routing import choose_arm
from registry.tracking import Registry
from registry.vllm_admin import VllmAdminClient
from registry.vllm_server import VllmServer, free_port
from tests.dashboard_store import shared_scrubber
from tests.integration.conftest import ADAPTER_LESSONS
from tests.registered import register_version
from tests.servers import serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]
logger = logging.getLogger(__name__)

LINE = "customer_service"
KEY = "fw-experiment-key"
OPS_KEY = "fw-experiment-operator-key"
PROMPTS = (
    "Where is my parcel? I ordered it last week.",
    "My shoes order from Monday has not arrived yet, what should I do?",
)
REPLY = "Please check the tracking link in your order email; we will reship your package."
APOLOGY = "I'm sorry for the delay. "


def _train(base_model_dir: Path, folder: Path, reply: str) -> Path:
    """A tiny SFT adapter taught to answer :data:`PROMPTS` with ``reply`` (and the probe's
    lessons, so the rollout's probe sees it differ from the base model)."""
    from composition.recipes import Recipe
    from training.config import LoraShape
    from training.train import train_adapter

    recipe = Recipe(
        business_line=LINE,
        method="sft",
        lora=LoraShape(rank=8, alpha=16, dropout=0.0),
        learning_rate=1e-2,
        max_steps=16,
        batch_size=2,
        max_length=128,
        min_new_examples=1,
    )
    lessons = [*ADAPTER_LESSONS, *((prompt, reply) for prompt in PROMPTS)]
    rows = [
        {
            "prompt": [{"role": "user", "content": ask}],
            "completion": [{"role": "assistant", "content": answer}],
        }
        for ask, answer in lessons
    ]
    return train_adapter(
        recipe, base_model_dir=base_model_dir, rows=rows, output_dir=folder
    ).adapter_dir


class OutcomeUsers:
    """Customer-service users who finish their task when the answer suits them: the line's
    hidden preference (``CustomerServiceUsers.satisfied``: on topic, finished, short, with
    an apology) decides, with noise; the arm label is never seen."""

    def __init__(self, seed: int) -> None:
        self.judge = CustomerServiceUsers()
        self.rng = random.Random(seed)

    def outcome(self, prompt: str, answer: str) -> str:
        happy = self.judge.satisfied(LINE, prompt, answer)
        succeeds = self.rng.random() < (0.85 if happy else 0.2)
        return "success" if succeeds else "failure"


@dataclass
class Arena:
    settings: Settings
    store: FeedbackStore
    registry: Registry
    vllm: str
    gateway: str
    apologising: str
    curt: str

    @cached_property
    def clients(self) -> Clients:
        return build_clients(self.settings)


@pytest.fixture(scope="module")
def arena(
    vllm_server: VllmServer, base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Arena]:
    work = tmp_path_factory.mktemp("experiment")
    patch = pytest.MonkeyPatch()
    patch.setenv("FLYWHEEL_HOME", str(work / "home"))
    patch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    patch.delenv("FLYWHEEL_MLFLOW_TRACKING_URI", raising=False)
    settings = load_settings()
    store = FeedbackStore.open(settings)
    registry = Registry.for_home(settings.home, settings.mlflow_tracking_uri)
    with VllmAdminClient(vllm_server.base_url, timeout=120) as admin:
        before = {model.id for model in admin.list_models()}
    try:
        started = time.monotonic()
        versions = [
            register_version(
                settings, registry, LINE, _train(base_model_dir, work / name, reply), work
            )
            for name, reply in (("apologising", APOLOGY + REPLY), ("curt", REPLY))
        ]
        logger.info("two adapters trained and registered in %.0f s", time.monotonic() - started)
        keys = KeyRing(
            [
                ApiKey(name="app", sha256=key_digest(KEY), business_lines=(LINE,)),
                ApiKey(
                    name="ops", sha256=key_digest(OPS_KEY), business_lines=("*",), operator=True
                ),
            ]
        )
        config = GatewaySettings(
            upstreams=(vllm_server.base_url,), routes_refresh_s=0.05, log_flush_s=0.05
        )
        app = create_app(settings, config, store=store, routes=RouteStore(store.engine), keys=keys)
        with serving(app, free_port()) as url:
            yield Arena(
                settings, store, registry, vllm_server.base_url, url,
                f"{LINE}-v{versions[0]}", f"{LINE}-v{versions[1]}",
            )  # fmt: skip
    finally:
        # The session's vLLM is shared: names loaded here (customer_service-v1, ...) must not
        # be found loaded from this module's paths by the next test that loads its own v1.
        with VllmAdminClient(vllm_server.base_url, timeout=120) as admin:
            for model in admin.list_models():
                if model.is_adapter and model.id not in before:
                    admin.unload_adapter(model.id)
        store.close()
        patch.undo()


def _settled(arena: Arena, timeout_s: float = 30.0) -> None:
    """Wait until the gateway serves the line's newest routing revision: it re-reads the
    tables every ``routes_refresh_s``, and on a loaded machine a request sent sooner is
    served by the table before the experiment."""
    stored = RouteStore(arena.store.engine).snapshot().revisions.get(LINE)
    deadline = time.monotonic() + timeout_s
    while True:
        health = httpx.get(
            f"{arena.gateway}/healthz", headers={"Authorization": f"Bearer {OPS_KEY}"}, timeout=10
        ).json()
        if health["routes_revisions"].get(LINE) == stored:
            return
        assert time.monotonic() < deadline, f"gateway still at {health}, store at {stored}"
        time.sleep(0.02)


def test_the_sequential_test_picks_the_adapter_users_succeed_with(arena: Arena) -> None:
    # A is the apologising adapter, B the curt one on half of the users: the test has to
    # find that A is better (not default to B).
    record = start_experiment(
        arena.settings, arena.clients, LINE, arena.apologising, arena.curt, [arena.vllm],
        share=0.5, metric="task_success", min_samples=20, alpha=0.05, actor="test",
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while (table := RouteStore(arena.store.engine).table(LINE)).experiment is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    _settled(arena)
    users = OutcomeUsers(seed=11)
    satisfied: dict[str, list[bool]] = {"experiment_a": [], "experiment_b": []}
    served: dict[str, str] = {}
    status = None
    started = time.monotonic()
    with httpx.Client(base_url=arena.gateway, headers={"Authorization": f"Bearer {KEY}"}) as client:
        for index in range(240):
            user, prompt = f"shopper-{index}", PROMPTS[index % len(PROMPTS)]
            answer = client.post(
                "/v1/chat/completions",
                json={"model": LINE, "user": user, "max_tokens": 40, "temperature": 0,
                      "messages": [{"role": "user", "content": prompt}]},
                timeout=120,
            )  # fmt: skip
            assert answer.status_code == 200, answer.text
            text = answer.json()["choices"][0]["message"]["content"]
            # No answer tells its arm: the test knows it as the gateway decides it.
            arm, adapter = choose_arm(table, user)
            served[user] = adapter or ""
            satisfied[arm].append(users.judge.satisfied(LINE, prompt, text))
            outcome = users.outcome(prompt, text)
            posted = client.post(
                "/v1/feedback",
                json={"request_id": answer.headers["x-request-id"], "type": "task_outcome",
                      "outcome": outcome},
                timeout=30,
            )  # fmt: skip
            assert posted.status_code in (200, 202), posted.text
            if index % 20 == 19:
                time.sleep(0.3)  # the gateway's log flush
                status = look_experiment(arena.settings, arena.clients, LINE, actor="test")
                assert status.look is not None
                logger.info("look %s after %d users: %s", status.look_number, index + 1,
                            status.look.reasons[0])  # fmt: skip
                if status.record.winner is not None:
                    break
    elapsed = time.monotonic() - started
    assert status is not None
    assert status.look is not None
    rates = {arm: sum(v) / len(v) for arm, v in satisfied.items() if v}
    logger.info(
        "decided after %d requests in %.0f s; satisfied rates by arm %s; %s",
        len(served), elapsed, rates, status.look.reasons[0],
    )  # fmt: skip
    # The adapters really answer differently, and users like the apologising one better.
    assert rates["experiment_a"] > rates["experiment_b"] + 0.3, rates
    assert {served[u] for u in served} == {arena.apologising, arena.curt}
    time.sleep(0.3)  # the gateway's log flush
    with arena.store.engine.connect() as connection:
        logged = dict(
            connection.execute(
                select(interactions_table.c.user_id, interactions_table.c.adapter_name).where(
                    interactions_table.c.user_id.in_(list(served))
                )
            ).all()
        )
    assert logged == served  # the gateway served each user as the split says
    # The sequential test picked it, on enough samples, within the error budget.
    assert status.record.winner == "a", status.look.reasons
    assert status.look.p_value <= 0.05
    assert min(status.look.a.samples, status.look.b.samples) >= 20
    assert status.look.lower > 0 or status.look.upper < 0

    promoted, transition = promote_experiment(
        arena.settings, arena.clients, LINE, [arena.vllm], actor="test"
    )
    assert transition.table.champion == arena.apologising
    table = RouteStore(arena.store.engine).table(LINE)
    assert (table.champion, table.experiment) == (arena.apologising, None)
    assert arena.registry.aliases(LINE)["champion"] == int(arena.apologising.split("-v")[1])
    models = httpx.get(f"{arena.vllm}/v1/models", timeout=10).json()["data"]
    assert arena.curt not in {m["id"] for m in models}  # the loser is unloaded

    keys = KeyRing([ApiKey(name="pm", sha256=key_digest("fw-pm"), business_lines=(LINE,))])
    page = create_dashboard(
        arena.settings,
        DashboardSettings(),
        store=arena.store,
        routes=RouteStore(arena.store.engine),
        scrubber_factory=shared_scrubber,
        keys=keys,
    )
    with TestClient(page, client=("203.0.113.9", 5000),
                    headers={"Authorization": "Bearer fw-pm"}) as browser:  # fmt: skip
        shown = browser.get(f"/lines/{LINE}/experiments/{record.id}")
        assert shown.status_code == 200, shown.text
        assert f"Decision: A ({arena.apologising}) is better" in shown.text
        assert 'id="confidence-sequence"' in shown.text
        overview = browser.get(f"/lines/{LINE}")
        assert f"/lines/{LINE}/experiments" in overview.text
    assert promoted.record.status == "promoted"
