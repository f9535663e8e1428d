"""The gateway in front of a real vLLM on the CPU: canary routing, tenant isolation, a vLLM
killed mid-stream and a 30 s store outage.

Every generation is kept tiny (a handful of tokens) because each one costs CPU time on a
machine that vLLM, PostgreSQL, the gateway and pytest share.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import select

from feedback.schema import feedback_table, interactions_table
from feedback.store import FeedbackStore, create_store_engine, upgrade_schema
from flywheel.settings import Settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from registry.routes import RouteStore
from registry.routing import RoutingTable, choose_arm
from registry.vllm_admin import VllmAdminClient
from registry.vllm_server import VllmServer, VllmServerSettings, free_port
from tests.conftest import services_required
from tests.pg_instance import PrivatePostgres, PrivatePostgresUnavailable
from tests.routing import set_canary, set_champion
from tests.servers import serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]

logger = logging.getLogger(__name__)

LINE = "customer_service"
CHAMPION, CANARY = f"{LINE}-v1", f"{LINE}-v2"
CS_KEY, LEGAL_KEY = "fw-cs-integration", "fw-legal-integration"
ADMIN_ROUTES = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
HTTP_TIMEOUT = httpx.Timeout(120.0)
OUTAGE_S = 30.0
BEFORE_AND_AFTER_S = 5.0


def _keys() -> KeyRing:
    """One key for customer_service, one for legal only."""
    return KeyRing(
        [
            ApiKey(name="cs", sha256=key_digest(CS_KEY), business_lines=(LINE,)),
            ApiKey(name="legal", sha256=key_digest(LEGAL_KEY), business_lines=("legal",)),
        ]
    )


def _open_store(url: str) -> FeedbackStore:
    """A feedback store on ``url`` with its schema migrated to the newest revision."""
    engine = create_store_engine(url)
    upgrade_schema(engine)
    return FeedbackStore(engine)


@dataclass
class Gateway:
    """A gateway on a real port, its application object and its store."""

    url: str
    app: Any
    store: FeedbackStore

    @property
    def recorder(self) -> Any:
        """The gateway's interaction recorder."""
        return self.app.state.gateway.recorder

    def client(self, key: str | None = CS_KEY) -> httpx.Client:
        """An HTTP client with ``key`` as its bearer token (none when ``key`` is None)."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=HTTP_TIMEOUT)

    def rows(self, table: Any) -> list[Any]:
        """Every row of ``table`` once the recorder has written what it holds."""
        assert self.recorder.flush(60)
        with self.store.engine.connect() as connection:
            return list(connection.execute(select(table)).all())

    def interactions(self) -> dict[str, Any]:
        """The stored interactions by request id."""
        return {row.request_id: row for row in self.rows(interactions_table)}


@contextmanager
def running_gateway(
    settings: Settings, store: FeedbackStore, upstream: str, **overrides: Any
) -> Iterator[Gateway]:
    """Serve a gateway in front of ``upstream`` with ``store``; ``overrides`` go to its
    settings."""
    config = GatewaySettings(
        upstreams=(upstream,), routes_refresh_s=0.1, log_flush_s=0.05, **overrides
    )
    app = create_app(settings, config, store=store, routes=RouteStore(store.engine), keys=_keys())
    with serving(app, free_port()) as url:
        yield Gateway(url, app, store)


def _chat_body(prompt: str, **extra: Any) -> dict[str, Any]:
    """A chat request for customer_service with one user message."""
    return {"model": LINE, "messages": [{"role": "user", "content": prompt}], **extra}


def _sse_events(raw: bytes) -> list[bytes]:
    """The payloads of an SSE body's ``data:`` lines, in order."""
    return [line[len(b"data: ") :] for line in raw.split(b"\n") if line.startswith(b"data: ")]


def _streamed_text(events: list[bytes]) -> str:
    """The answer text carried by chat completion chunks (other events are skipped)."""
    parts = []
    for event in events:
        if event == b"[DONE]":
            continue
        document = orjson.loads(event)
        for choice in document.get("choices") or ():
            parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


def _users_by_arm(table: RoutingTable, per_arm: int) -> dict[str, list[str]]:
    """``per_arm`` user ids the sticky split sends to each of champion and canary."""
    found: dict[str, list[str]] = {"champion": [], "canary": []}
    for index in range(100_000):
        user = f"user-{index}"
        arm, _ = choose_arm(table, user)
        if len(found[arm]) < per_arm:
            found[arm].append(user)
        if all(len(users) == per_arm for users in found.values()):
            return found
    raise AssertionError(f"the split of {table} gave too few users to one arm")


def _vllm_requests(server: VllmServer) -> Counter[str]:
    """How many requests vLLM received per path, from the access log in its server log (its
    /metrics leaves the adapter routes out)."""
    text = server.log_path.read_text(encoding="utf-8", errors="replace")
    return Counter(re.findall(r'"(?:GET|POST|PUT|DELETE) (/[^ ?"]*)[^"]* HTTP/[0-9.]+"', text))


@pytest.fixture(scope="module")
def adapters(vllm_server: VllmServer, lora_adapter: Path) -> Iterator[VllmServer]:
    """The shared vLLM with the tiny adapter loaded as customer_service-v1 and -v2; what this
    fixture loaded is unloaded at the end, so other modules find the server as it was."""
    with VllmAdminClient(vllm_server.base_url, timeout=120) as admin:
        loaded = [name for name in (CHAMPION, CANARY) if admin.ensure_loaded(name, lora_adapter)]
        yield vllm_server
        for name in loaded:
            admin.unload_adapter(name)


@pytest.fixture
def store(postgres_url: str) -> Iterator[FeedbackStore]:
    """A feedback store on a fresh PostgreSQL database."""
    store = _open_store(postgres_url)
    yield store
    store.close()


@pytest.fixture
def routed_store(store: FeedbackStore) -> FeedbackStore:
    """The store, with customer_service on v1 and v2 as a 5% canary."""
    routes = RouteStore(store.engine)
    set_champion(routes, LINE, CHAMPION, actor="test")
    set_canary(routes, LINE, CANARY, 0.05, actor="test")
    return store


@pytest.fixture
def gateway(
    settings: Settings, adapters: VllmServer, routed_store: FeedbackStore
) -> Iterator[Gateway]:
    """A gateway in front of the shared vLLM, routed by ``routed_store``."""
    with running_gateway(settings, routed_store, adapters.base_url) as running:
        yield running


def _post_chat(gateway: Gateway, prompt: str) -> httpx.Response:
    """One small non-streamed chat request on a client of its own (safe from any thread)."""
    with gateway.client() as client:
        return client.post("/v1/chat/completions", json=_chat_body(prompt, max_tokens=4))


# First in the module: on a small machine its own vLLM starts before the shared one does.
def test_vllm_killed_mid_stream_ends_the_stream_cleanly_and_then_503(
    vllm_python: Path,
    base_model_dir: Path,
    settings: Settings,
    store: FeedbackStore,
    tmp_path: Path,
) -> None:
    server_settings = VllmServerSettings(model=base_model_dir, port=free_port())
    with (
        VllmServer(server_settings, python=vllm_python, log_path=tmp_path / "vllm.log") as server,
        running_gateway(settings, store, server.base_url) as gateway,
        gateway.client() as client,
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        logger.info("the doomed vLLM started in %.1f s", server.startup_s)
        assert server.pid is not None
        body = _chat_body(
            "Write a very long story about a lighthouse keeper and a dragon.",
            stream=True,
            max_tokens=400,
            temperature=1.0,
            # vLLM's own switch: the story must not end before the kill.
            ignore_eos=True,
        )
        raw = bytearray()
        dying: Future[httpx.Response] | None = None
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            request_id = response.headers["x-request-id"]
            for chunk in response.iter_bytes():
                raw += chunk
                if dying is None and raw.count(b"data: ") >= 3:
                    os.killpg(server.pid, signal.SIGKILL)
                    killed_at = time.monotonic()
                    # Sent while vLLM's processes are still being torn down (about 0.2 s here).
                    dying = pool.submit(_post_chat, gateway, "Are you there?")
        assert dying is not None, "the stream ended before vLLM could be killed"
        logger.info("the stream ended %.2f s after the kill", time.monotonic() - killed_at)
        after = _post_chat(gateway, "Still there?")
        during = dying.result()
        stored = gateway.interactions()

    # Only whole SSE events: vLLM's chunks, then the gateway's error event and [DONE].
    assert bytes(raw).endswith(b"data: [DONE]\n\n")
    assert all(line.startswith(b"data: ") for line in raw.split(b"\n") if line)
    events = _sse_events(bytes(raw))
    assert events[-1] == b"[DONE]"
    error = orjson.loads(events[-2])["error"]
    assert error["code"] == 502
    assert error["type"] == "upstream_error"
    for needle in ("Traceback", "Error", "Exception", 'File "', "aiohttp"):
        assert needle not in error["message"]
    relayed = _streamed_text(events[:-2])
    assert relayed
    broken = stored[request_id]
    assert (broken.status, broken.arm, broken.response) == ("error", "base", relayed)

    for late in (after, during):
        assert stored[late.headers["x-request-id"]].status == "error"
        assert late.headers["content-type"].startswith("application/json")
        assert late.json()["error"]["code"] == late.status_code
    assert after.status_code == 503, after.text
    assert during.status_code == 503, (during.text, stored[during.headers["x-request-id"]].metadata)


def test_champion_and_canary_adapters_each_serve_their_own_users(
    gateway: Gateway, base_model_dir: Path
) -> None:
    table = RouteStore(gateway.store.engine).table(LINE)
    users = _users_by_arm(table, 3)
    expected = {user: arm for arm, group in users.items() for user in group}
    streamed_user, completion_user = users["canary"][0], users["champion"][0]
    served: dict[str, dict[str, Any]] = {}
    with gateway.client() as client:
        for user, arm in expected.items():
            started = time.monotonic()
            prompt = "Say hello to a customer."
            # vLLM's min_tokens: a raw completion prompt may otherwise end at once, empty.
            sampling = {"user": user, "max_tokens": 6, "min_tokens": 3, "temperature": 0}
            if user == streamed_user:
                body = _chat_body(prompt, stream=True, **sampling)
                with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    raw = b"".join(response.iter_bytes())
                events = _sse_events(raw)
                assert events[-1] == b"[DONE]"
                # The gateway asked vLLM for usage; the caller did not, so it never sees it.
                assert not any(b'"usage"' in event for event in events)
                text = _streamed_text(events)
                shown_model = orjson.loads(events[0])["model"]
            elif user == completion_user:
                body = {"model": LINE, "prompt": prompt, **sampling}
                response = client.post("/v1/completions", json=body)
                text = response.json()["choices"][0]["text"]
                shown_model = response.json()["model"]
                assert response.json()["object"] == "text_completion"
            else:
                response = client.post("/v1/chat/completions", json=_chat_body(prompt, **sampling))
                text = response.json()["choices"][0]["message"]["content"]
                shown_model = response.json()["model"]
                # Streamed from vLLM to time it, rebuilt into the one answer asked for.
                assert response.json()["object"] == "chat.completion"
                assert response.json()["choices"][0]["finish_reason"] in ("length", "stop")
            if user != streamed_user:
                assert 3 <= response.json()["usage"]["completion_tokens"] <= 6
            assert response.status_code == 200, response.text
            # No answer tells its caller the arm or adapter (the rows below say which served).
            assert not {"x-flywheel-arm", "x-flywheel-adapter"} & set(response.headers)
            assert shown_model == LINE
            assert text
            logger.info("%s (%s) answered in %.2f s", user, arm, time.monotonic() - started)
            served[response.headers["x-request-id"]] = {"user": user, "arm": arm, "text": text}

    stored = gateway.interactions()
    assert set(stored) == set(served)
    assert {row.adapter_name for row in stored.values()} == {CHAMPION, CANARY}
    for request_id, answer in served.items():
        row = stored[request_id]
        adapter = CANARY if answer["arm"] == "canary" else CHAMPION
        assert (row.adapter_name, row.arm, row.user_id) == (adapter, answer["arm"], answer["user"])
        assert row.adapter_version == int(adapter.rsplit("-v", 1)[1])
        assert row.base_model == str(base_model_dir)
        assert row.status == "ok"
        assert row.response == answer["text"]
        assert 0 < row.ttft_ms <= row.latency_ms
        assert 3 <= row.metadata["output_tokens"] <= 6  # vLLM's count, streamed or not
        assert row.metadata["tpot_ms"] > 0
        assert row.source == "gateway"
        if answer["user"] == completion_user:
            assert row.messages == [{"role": "user", "content": "Say hello to a customer."}]


def test_a_legal_key_reaches_nothing_of_customer_service_nor_vllm_admin(
    gateway: Gateway, adapters: VllmServer, lora_adapter: Path, base_model_dir: Path
) -> None:
    with gateway.client(CS_KEY) as cs:
        served = cs.post(
            "/v1/chat/completions", json=_chat_body("Hello?", user="cs-user", max_tokens=4)
        )
    assert served.status_code == 200, served.text
    cs_request = served.headers["x-request-id"]
    with VllmAdminClient(adapters.base_url, timeout=120) as admin:
        models_before = admin.list_models()
    vllm_before = _vllm_requests(adapters)
    # The served request is in the access log, so a missing line below means a missing request.
    assert vllm_before["/v1/chat/completions"] > 0

    with gateway.client(LEGAL_KEY) as legal:
        attempts = [
            ("/v1/chat/completions", _chat_body("Hi", max_tokens=4)),
            ("/v1/chat/completions", _chat_body("Hi", max_tokens=4, stream=True)),
            ("/v1/completions", {"model": LINE, "prompt": "Hi", "max_tokens": 4}),
            ("/v1/completions", {"model": LINE, "prompt": "Hi", "max_tokens": 4, "stream": True}),
            ("/v1/feedback", {"request_id": cs_request, "type": "thumbs_down"}),
        ]
        for path, body in attempts:
            refused = legal.post(path, json=body)
            assert refused.status_code == 404, (path, body, refused.text)
            assert refused.headers["content-type"].startswith("application/json")
            assert refused.json()["error"]["code"] == 404
        assert [m["id"] for m in legal.get("/v1/models").json()["data"]] == ["legal"]
    with gateway.client(CS_KEY) as cs:
        assert [m["id"] for m in cs.get("/v1/models").json()["data"]] == [LINE]

    # Naming an adapter or the base model as ``model`` is no way around a line, for any key.
    for key in (LEGAL_KEY, CS_KEY):
        with gateway.client(key) as client:
            for model in (CHAMPION, CANARY, str(base_model_dir)):
                chat = client.post(
                    "/v1/chat/completions", json={**_chat_body("Hi", max_tokens=4), "model": model}
                )
                assert chat.status_code == 404, (key, model, chat.text)
                text = client.post(
                    "/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 4}
                )
                assert text.status_code == 404, (key, model, text.text)

    admin_bodies = {
        "/v1/load_lora_adapter": {"lora_name": "legal-v9", "lora_path": str(lora_adapter)},
        "/v1/unload_lora_adapter": {"lora_name": CHAMPION},
    }
    for caller in (LEGAL_KEY, CS_KEY, None):
        with gateway.client(caller) as client:
            for path in ADMIN_ROUTES:
                answer = client.post(path, json=admin_bodies[path])
                assert answer.status_code == 404, (caller, path, answer.text)
                assert answer.json()["error"]["code"] == 404

    with VllmAdminClient(adapters.base_url, timeout=120) as admin:
        assert admin.list_models() == models_before
    vllm_after = _vllm_requests(adapters)
    for route in ("/v1/chat/completions", "/v1/completions", *ADMIN_ROUTES):
        assert vllm_after[route] == vllm_before[route], route
    assert list(gateway.interactions()) == [cs_request]
    assert gateway.rows(feedback_table) == []


@dataclass(frozen=True)
class Sent:
    """One request of the traffic thread and what the client got back."""

    request_id: str
    phase: str
    status: int
    text: str | None


@dataclass
class Traffic:
    """Chat requests sent one after another from a thread, with thumbs up on some answers
    while the store is down."""

    gateway: Gateway
    phase: str = "before"
    served: list[Sent] = field(default_factory=list)
    feedback: list[tuple[str, int]] = field(default_factory=list)
    failure: BaseException | None = None
    stopping: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        """Send until told to stop; keep what each request got back."""
        try:
            with self.gateway.client() as client:
                index = 0
                while not self.stopping.is_set():
                    phase = self.phase
                    body = _chat_body(f"Question {index}: say hi.", user=f"load-{index}")
                    response = client.post(
                        "/v1/chat/completions", json={**body, "max_tokens": 4, "temperature": 0}
                    )
                    request_id = response.headers["x-request-id"]
                    text = None
                    if response.status_code == 200:
                        text = response.json()["choices"][0]["message"]["content"]
                    self.served.append(Sent(request_id, phase, response.status_code, text))
                    if phase == "outage" and response.status_code == 200 and index % 2 == 0:
                        thumbs = {"request_id": request_id, "type": "thumbs_up"}
                        answer = client.post("/v1/feedback", json=thumbs)
                        self.feedback.append((request_id, answer.status_code))
                    index += 1
        except BaseException as exc:  # handed to the test thread, which raises it
            self.failure = exc


def test_a_30s_store_outage_loses_no_interaction_and_no_feedback(
    adapters: VllmServer, settings: Settings, tmp_path: Path
) -> None:
    try:
        pg = PrivatePostgres(tmp_path / "pg")
    except PrivatePostgresUnavailable as exc:
        if services_required():
            raise
        pytest.skip(f"no private PostgreSQL server: {exc}")
    with pg:
        store = _open_store(pg.url)
        set_champion(RouteStore(store.engine), LINE, CHAMPION, actor="test")
        spool = tmp_path / "spool"
        with running_gateway(
            settings, store, adapters.base_url, spool_dir=spool, spool_retry_s=1
        ) as gateway:
            traffic = Traffic(gateway)
            sender = threading.Thread(target=traffic.run, name="traffic", daemon=True)
            sender.start()
            try:
                time.sleep(BEFORE_AND_AFTER_S)

                pg.stop()
                traffic.phase = "outage"
                down_at = time.monotonic()
                time.sleep(OUTAGE_S / 2)
                with gateway.client(key=None) as client:  # liveness needs no key
                    health = client.get("/healthz").json()
                assert health["store_up"] is False
                assert gateway.recorder.spool.files()
                time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))

                pg.start()
                traffic.phase = "after"
                up_at = time.monotonic()
                while gateway.recorder.spool.files():
                    assert time.monotonic() - up_at < 120, "the spool was not replayed in 2 min"
                    time.sleep(0.05)
                replay_s = time.monotonic() - up_at
                time.sleep(max(0.0, BEFORE_AND_AFTER_S - (time.monotonic() - up_at)))
            finally:
                traffic.stopping.set()
                sender.join(180)
            assert not sender.is_alive()
            if traffic.failure is not None:
                raise traffic.failure
            assert gateway.recorder.spool.files() == []
            rows = gateway.rows(interactions_table)
            feedback = gateway.rows(feedback_table)
            quarantined = store.quarantined()
            stats = gateway.recorder.stats
            with gateway.client(key=None) as client:  # liveness needs no key
                health = client.get("/healthz").json()
        store.close()

    phases = Counter(sent.phase for sent in traffic.served)
    logger.info(
        "requests before/during/after the outage: %d/%d/%d; feedback during it: %d; "
        "%d events spooled, %d replayed; spool empty %.2f s after the restart",
        phases["before"],
        phases["outage"],
        phases["after"],
        len(traffic.feedback),
        stats.spooled,
        stats.replayed,
        replay_s,
    )
    assert min(phases["before"], phases["outage"], phases["after"]) > 0
    assert {sent.status for sent in traffic.served} == {200}
    assert Counter(row.request_id for row in rows) == Counter(s.request_id for s in traffic.served)
    by_id = {row.request_id: row for row in rows}
    for sent in traffic.served:
        row = by_id[sent.request_id]
        assert (row.status, row.adapter_name, row.arm) == ("ok", CHAMPION, "champion"), sent
        assert row.response == sent.text, sent
    assert traffic.feedback
    assert {status for _, status in traffic.feedback} == {202}
    thumbs = Counter(row.request_id for row in feedback if row.type == "thumbs_up")
    assert thumbs == Counter(request_id for request_id, _ in traffic.feedback)
    assert len(feedback) == len(traffic.feedback)
    assert quarantined == []
    assert stats.spooled > 0
    assert stats.replayed == stats.spooled
    assert health["store_up"] is True
