"""Shadow mirroring in the gateway over a stand-in vLLM: the user gets the champion's answer,
the shadow's is stored beside it, never sooner than the user's, within the share and the cap."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import select

from feedback.schema import interactions_table, quarantine_table, shadow_outputs_table
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from gateway.recorder import FinishedRequest
from gateway.shadow import shadow_body, shadow_for, shadow_output_event
from registry.routes import RouteStore
from registry.routing import RoutingTable
from registry.vllm_server import free_port
from tests.servers import serving
from tests.stub_vllm import StubBehaviour, StubVllm, running_stub

KEY = "fw-cs-secret"
OPERATOR_KEY = "fw-operator-secret"
LINE = "customer_service"
CHAMPION, CANARY, SHADOW = f"{LINE}-v1", f"{LINE}-v2", f"{LINE}-v3"
PROMPT = "my card is 4111 1111 1111 1111, help"


@dataclass
class Running:
    url: str
    stub: StubVllm
    store: FeedbackStore
    app: Any

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10
        )

    def rows(self, table: Any) -> list[Any]:
        assert self.app.state.gateway.recorder.flush(10)
        with self.store.engine.connect() as connection:
            return list(connection.execute(select(table)).all())

    def shadows(self, expected: int, timeout_s: float = 10.0) -> list[Any]:
        """The stored shadow answers once ``expected`` are there (or the timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.rows(shadow_outputs_table)
            if len(rows) >= expected or time.monotonic() > deadline:
                return rows
            time.sleep(0.05)

    def metric(self, name: str, **labels: str) -> float:
        scrape = {"Authorization": f"Bearer {OPERATOR_KEY}"}
        text = httpx.get(self.url + "/metrics", headers=scrape).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


def _run(
    settings: Settings,
    table: RoutingTable,
    behaviour: StubBehaviour | None = None,
    **gateway: Any,
) -> Iterator[Running]:
    store = FeedbackStore.open(settings)
    RouteStore(store.engine).change(LINE, lambda _: table, action="test", actor="test")
    behaviour = behaviour or StubBehaviour(adapters={CHAMPION, CANARY, SHADOW})
    keys = KeyRing(
        [
            ApiKey(name="cs", sha256=key_digest(KEY), business_lines=(LINE,)),
            ApiKey(name="prometheus", sha256=key_digest(OPERATOR_KEY), operator=True),
        ]
    )
    with running_stub(behaviour) as stub:
        config = GatewaySettings(
            upstreams=(stub.base_url,), routes_refresh_s=0.05, log_flush_s=0.02, **gateway
        )
        app = create_app(settings, config, store=store, routes=RouteStore(store.engine), keys=keys)
        with serving(app, free_port()) as url:
            yield Running(url, stub, store, app)
    store.close()


def _table(**extra: Any) -> RoutingTable:
    return RoutingTable(business_line=LINE, champion=CHAMPION, **extra)


@pytest.fixture
def shadowed(settings: Settings) -> Iterator[Running]:
    yield from _run(settings, _table(shadow=SHADOW, shadow_fraction=1.0))


def _ask(client: httpx.Client, user: str = "u1", **extra: Any) -> httpx.Response:
    body = {"model": LINE, "messages": [{"role": "user", "content": PROMPT}], "user": user}
    response = client.post("/v1/chat/completions", json=body | extra)
    assert response.status_code == 200, response.text
    return response


def test_the_user_gets_the_champion_and_the_shadow_answer_is_stored_with_lineage(
    shadowed: Running,
) -> None:
    with shadowed.client() as client:
        response = _ask(client, max_tokens=7)
    assert f"-{CHAMPION}" in response.json()["choices"][0]["message"]["content"]
    assert SHADOW not in response.text
    [row] = shadowed.shadows(1)
    assert row.request_id == response.headers["x-request-id"]
    assert (row.adapter_name, row.adapter_version, row.business_line) == (SHADOW, 3, LINE)
    assert row.status == "ok"
    assert f"-{SHADOW}" in row.response
    assert row.output_tokens == 5
    assert row.latency_ms > 0
    [asked] = [b for b in shadowed.stub.received if b["model"] == SHADOW]
    assert (asked["stream"], asked["n"], asked["max_tokens"]) == (False, 1, 7)
    assert asked["messages"] == [{"role": "user", "content": PROMPT}]
    assert "stream_options" not in asked
    [interaction] = shadowed.rows(interactions_table)
    assert interaction.adapter_name == CHAMPION
    assert shadowed.metric("flywheel_gateway_shadow_requests_total", status="ok") == 1


def test_a_slow_shadow_never_delays_the_user(settings: Settings) -> None:
    behaviour = StubBehaviour(adapters={CHAMPION, SHADOW}, delays={SHADOW: 1.5})
    table = _table(shadow=SHADOW, shadow_fraction=1.0)
    for running in _run(settings, table, behaviour):
        with running.client() as client:
            started = time.perf_counter()
            _ask(client)
            body = {"model": LINE, "messages": [{"role": "user", "content": "x"}], "stream": True}
            with client.stream("POST", "/v1/chat/completions", json=body) as streamed:
                assert b"[DONE]" in b"".join(streamed.iter_bytes())
            took = time.perf_counter() - started
        assert took < 1.0, f"two answers took {took:.2f} s behind a 1.5 s shadow"
        rows = running.shadows(2)
        assert len(rows) == 2
        assert min(r.latency_ms for r in rows) >= 1_400


def test_the_share_of_requests_mirrored_is_the_tables(settings: Settings) -> None:
    table = _table(shadow=SHADOW, shadow_fraction=0.3)
    ids = [f"req-{i:06x}" for i in range(20_000)]
    finished = [
        FinishedRequest(i, LINE, "stub-base", [], datetime.now(UTC), CHAMPION, 1, "champion")
        for i in ids
    ]
    sampled = sum(shadow_for(table, f) is not None for f in finished) / len(ids)
    assert abs(sampled - 0.3) < 0.015
    for running in _run(settings, table, shadow_max_concurrency=1_000):
        with running.client() as client:
            responses = [_ask(client, user=f"u{i}") for i in range(120)]
        expected = sum(
            shadow_for(table, f) is not None
            for f in (
                FinishedRequest(
                    r.headers["x-request-id"], LINE, "b", [], datetime.now(UTC), CHAMPION, 1
                )
                for r in responses
            )
        )
        rows = running.shadows(expected)
        time.sleep(0.2)
        assert len(running.shadows(expected)) == expected
        # Binomial(120, 0.3): 36 expected, sd 5; 5 sd either side.
        assert 11 <= len(rows) <= 61


def test_the_concurrency_cap_skips_and_counts(settings: Settings) -> None:
    behaviour = StubBehaviour(adapters={CHAMPION, SHADOW}, delays={SHADOW: 1.0})
    table = _table(shadow=SHADOW, shadow_fraction=1.0)
    for running in _run(settings, table, behaviour, shadow_max_concurrency=1):
        with running.client() as client:
            for i in range(3):
                _ask(client, user=f"u{i}")
        skipped = running.metric(
            "flywheel_gateway_shadow_skipped_total", adapter=SHADOW, reason="cap"
        )
        assert skipped == 2
        assert len(running.shadows(1)) == 1
        time.sleep(0.3)
        assert len(running.shadows(1)) == 1
        assert len(running.rows(interactions_table)) == 3


def test_a_busy_process_yields_to_its_users(settings: Settings) -> None:
    """While as many user requests as shadow_max_user_requests are being answered, a
    sampled request is not mirrored (skipped as busy); once it is quiet, it is."""
    import concurrent.futures

    behaviour = StubBehaviour(adapters={CHAMPION, SHADOW}, delay_s=0.5)
    table = _table(shadow=SHADOW, shadow_fraction=1.0)
    for running in _run(
        settings, table, behaviour, shadow_max_user_requests=2, shadow_max_concurrency=100
    ):
        with concurrent.futures.ThreadPoolExecutor(4) as pool:

            def ask(i: int, running: Any = running) -> None:
                with running.client() as client:
                    _ask(client, user=f"busy{i}")

            list(pool.map(ask, range(4)))
        busy = running.metric(
            "flywheel_gateway_shadow_skipped_total", adapter=SHADOW, reason="busy"
        )
        # Four at once: the first three to finish each saw at least two others in flight.
        assert busy >= 2
        with running.client() as client:
            _ask(client, user="alone")
        assert (
            running.metric("flywheel_gateway_shadow_skipped_total", adapter=SHADOW, reason="busy")
            == busy
        )
        assert len(running.shadows(int(5 - busy))) == 5 - busy


def test_the_canary_arm_is_never_shadowed(settings: Settings) -> None:
    table = _table(canary=CANARY, canary_fraction=0.5, shadow=SHADOW, shadow_fraction=1.0)
    for running in _run(settings, table, shadow_max_concurrency=1_000):
        with running.client() as client:
            asked = {_ask(client, user=f"u{i}").headers["x-request-id"] for i in range(40)}
        # Which arm answered is the store's to say (no answer tells its caller).
        arms = {r.request_id: r.arm for r in running.rows(interactions_table)}
        assert set(arms) == asked
        assert set(arms.values()) == {"champion", "canary"}
        champions = {r for r, arm in arms.items() if arm == "champion"}
        rows = running.shadows(len(champions))
        time.sleep(0.2)
        rows = running.shadows(len(champions))
        assert {r.request_id for r in rows} == champions


def test_a_failing_shadow_is_stored_as_an_error_and_logged_once_without_the_prompt(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    behaviour = StubBehaviour(adapters={CHAMPION})  # the shadow is not loaded: vLLM's 404
    table = _table(shadow=SHADOW, shadow_fraction=1.0)
    with caplog.at_level(logging.WARNING, logger="gateway.shadow"):
        for running in _run(settings, table, behaviour):
            with running.client() as client:
                for i in range(3):
                    assert f"-{CHAMPION}" in _ask(client, user=f"u{i}").text
            rows = running.shadows(3)
            assert [r.status for r in rows] == ["error"] * 3
            assert all(r.output_tokens is None and r.response == "" for r in rows)
            assert "404" in rows[0].metadata["error"]
            errors = running.metric("flywheel_gateway_shadow_requests_total", status="error")
            assert errors == 3
    shadow_logs = [r for r in caplog.records if r.name == "gateway.shadow"]
    assert len(shadow_logs) == 1
    assert "4111" not in shadow_logs[0].getMessage()


def test_a_shadow_without_its_interaction_is_dropped_not_quarantined(settings: Settings) -> None:
    store = FeedbackStore.open(settings)
    finished = FinishedRequest(
        "req-gone", LINE, "stub-base", [{"role": "user", "content": "x"}], datetime.now(UTC)
    )
    record = shadow_output_event(finished, SHADOW, status="ok", latency_ms=1.0)
    written = store.add_shadow_outputs([record, {"type": "shadow_output"}])
    assert (written.added, written.missing, written.invalid) == (0, 1, 1)
    with store.engine.connect() as connection:
        assert connection.execute(select(quarantine_table)).all() == []
    store.close()


def test_shadow_answers_are_stored_once_and_forgotten_with_their_user(settings: Settings) -> None:
    store = FeedbackStore.open(settings)
    created = datetime.now(UTC)
    interaction = {
        "type": "interaction",
        "request_id": "req-1",
        "user_id": "alice",
        "business_line": LINE,
        "adapter_name": CHAMPION,
        "adapter_version": 1,
        "base_model": "stub-base",
        "messages": [{"role": "user", "content": "x"}],
        "response": "y",
        "status": "ok",
        "created_at": created.isoformat(),
    }
    store.ingest([interaction], source="test")
    finished = FinishedRequest("req-1", LINE, "stub-base", [], created, user_id="alice")
    record = shadow_output_event(finished, SHADOW, status="ok", latency_ms=1.0)
    assert store.add_shadow_outputs([record]).added == 1
    again = store.add_shadow_outputs([record])
    assert (again.added, again.duplicates) == (0, 1)
    assert store.forget_user("alice").total("shadow_outputs") == 1
    with store.engine.connect() as connection:
        assert connection.execute(select(shadow_outputs_table)).all() == []
    store.close()


def test_the_shadow_body_is_one_plain_answer_under_the_shadow() -> None:
    payload = {
        "model": CHAMPION,
        "messages": [],
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 3,
        "temperature": 0.2,
    }
    body = orjson.loads(shadow_body(payload, SHADOW))
    assert body == {"model": SHADOW, "messages": [], "stream": False, "n": 1, "temperature": 0.2}
    assert payload["model"] == CHAMPION  # the caller's request is left as it was
