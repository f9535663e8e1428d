"""The servers' HTTP guards, on the real gateway over a stub vLLM: oversized and slow headers
are refused before authentication, with a body that says why and no traceback; ordinary
requests, large bodies in one read included, pass."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from feedback.store import FeedbackStore
from flywheel.http_guard import GuardedHttpToolsProtocol, server_options
from flywheel.settings import Settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from registry.routes import RouteStore
from registry.vllm_server import free_port
from tests.stub_vllm import StubBehaviour, running_stub

KEY = "fw-guard-key"


class QuickGuard(GuardedHttpToolsProtocol):
    header_timeout_s = 0.5


@pytest.fixture
def port(settings: Settings) -> Iterator[int]:
    store = FeedbackStore.open(settings)
    keys = KeyRing([ApiKey(name="ops", sha256=key_digest(KEY), business_lines=("*",))])
    with running_stub(StubBehaviour()) as stub:
        app = create_app(
            settings,
            GatewaySettings(upstreams=(stub.base_url,)),
            store=store,
            routes=RouteStore(store.engine),
            keys=keys,
        )
        chosen = free_port()
        options = {**server_options(), "http": QuickGuard}
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=chosen, log_level="warning", **options)
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            yield chosen
        finally:
            server.should_exit = True
            thread.join(20)
    store.close()


def _exchange(port: int, data: bytes, wait_s: float = 5.0) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        started = time.monotonic()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            raw.sendall(data)  # may be refused before all of it is sent
        raw.settimeout(wait_s)
        answer = b""
        try:
            while chunk := raw.recv(65536):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return answer, time.monotonic() - started


def test_oversized_headers_get_431_before_authentication(port: int) -> None:
    huge = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200_000 + b"\r\n\r\n"
    answer, _ = _exchange(port, huge)
    assert answer.startswith(b"HTTP/1.1 431")
    assert b"over 65536 bytes" in answer


def test_headers_that_trickle_in_get_408(port: int) -> None:
    answer, waited = _exchange(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"did not arrive" in answer
    assert 0.4 < waited < 3


def test_a_silent_connection_is_closed_too(port: int) -> None:
    answer, waited = _exchange(port, b"")
    assert answer.startswith(b"HTTP/1.1 408")
    assert waited < 3


def test_ordinary_requests_and_a_large_body_in_one_read_pass(port: int) -> None:
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{url}/v1/models", headers=headers, timeout=10).status_code == 200
    big = "x" * 150_000  # the first read holds headers and much more than 64 KiB of body
    body = {"model": "legal", "messages": [{"role": "user", "content": big}], "max_tokens": 2}
    with httpx.Client(timeout=10) as client:
        first = client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        # Keep-alive: the next request on the same connection is counted afresh.
        second = client.get(f"{url}/v1/models", headers=headers)
    assert first.status_code == 200, first.text
    assert second.status_code == 200


def test_an_unexpected_error_reaches_the_log_without_its_message(
    port: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import gateway.app

    def broken(*_args: object) -> str:
        raise RuntimeError("the prompt said: call me on 13800138000")

    monkeypatch.setattr(gateway.app, "line_for", broken)
    with caplog.at_level(logging.INFO):
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "legal", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=10,
        )
        time.sleep(0.2)  # uvicorn logs the re-raised exception after the 500 went out
    assert answer.status_code == 500
    assert "13800138000" not in answer.text
    assert "13800138000" not in caplog.text
    assert "RuntimeError at test_http_guard.py" in caplog.text
