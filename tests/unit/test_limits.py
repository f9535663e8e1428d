"""Rate limits: the sliding window, the limiter in memory and on a real Redis, and the
gateway's 429s with OpenAI's headers (stub upstream)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from composition.clients import build_clients
from feedback.store import FeedbackStore
from flywheel.settings import Settings, load_settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from gateway.limits import (
    Limits,
    MemoryLimiter,
    Quota,
    RedisLimiter,
    quotas_for,
    retry_after,
    sliding_count,
)
from registry.routes import RouteStore
from registry.vllm_server import free_port
from tests.servers import serving
from tests.stub_vllm import StubBehaviour, running_stub

CS_KEY, OTHER_KEY = "fw-cs-limited", "fw-other"


def test_the_sliding_window_weights_the_previous_window_by_what_is_left_of_it() -> None:
    assert sliding_count(100, 0, 0, 60) == 100
    assert sliding_count(100, 10, 30, 60) == 60
    assert sliding_count(100, 10, 60, 60) == 10
    # 60 used of 50 needs 10 more to fall: 100 / 60 a second -> 6 s.
    assert retry_after(100, 10, 30, 60, 0, 50) == pytest.approx(6.0)
    # Nothing from before: wait for the next window, then the current count falls too.
    assert retry_after(0, 50, 20, 60, 1, 50) == pytest.approx(40 + 60 / 50)
    assert retry_after(0, 10, 20, 60, 1, 50) == 0.0


def test_the_memory_limiter_admits_exactly_the_limit_then_refuses_with_a_wait() -> None:
    limiter = MemoryLimiter(window_s=60)
    quota = Quota("line:legal", "requests", 10)
    start = 6_000.0  # the start of a window
    admitted = [limiter.admit_at(start + i * 0.1, [quota], [1], []).allowed for i in range(15)]
    assert admitted == [True] * 10 + [False] * 5
    refused = limiter.admit_at(start + 2, [quota], [1], [])
    assert refused.refused == quota
    assert 58 < refused.retry_after_s < 66
    assert refused.headers()["retry-after"] in {str(s) for s in range(58, 67)}
    # Half a window into the next one, half of the ten still count: five more fit.
    later = [limiter.admit_at(start + 90 + i * 0.01, [quota], [1], []).allowed for i in range(8)]
    assert later == [True] * 5 + [False] * 3


def test_tokens_are_charged_after_the_fact_and_an_overdraft_waits() -> None:
    limiter = MemoryLimiter(window_s=60)
    tokens = Quota("key:cs", "tokens", 1_000)
    assert limiter.admit_at(6_000, [tokens], [0], []).allowed
    asyncio.run(limiter.charge([tokens], 1_500))
    verdict = asyncio.run(limiter.admit([tokens], [0], []))
    assert not verdict.allowed
    assert verdict.retry_after_s > 0


def test_a_refusal_by_one_quota_takes_nothing_from_the_others() -> None:
    limiter = MemoryLimiter(window_s=60)
    key, line = Quota("key:cs", "requests", 100), Quota("line:cs", "requests", 3)
    for _ in range(3):
        assert limiter.admit_at(6_000, [key, line], [1, 1], []).allowed
    assert not limiter.admit_at(6_000, [key, line], [1, 1], []).allowed
    other_line = Quota("line:legal", "requests", 3)
    # The key's counter went up three times only: 97 left for another line.
    verdict = limiter.admit_at(6_000, [key, other_line], [1, 1], [])
    assert verdict.allowed
    assert verdict.standings[0].remaining == 96


def test_stream_slots_are_given_back() -> None:
    limiter = MemoryLimiter(window_s=60)
    streams = Quota("key:cs", "streams", 2)
    first = limiter.admit_at(6_000, [], [], [streams])
    second = limiter.admit_at(6_000, [], [], [streams])
    assert first.allowed
    assert second.allowed
    assert not limiter.admit_at(6_000, [], [], [streams]).allowed
    assert first.stream_slot is not None
    asyncio.run(limiter.release([streams], first.stream_slot))
    assert limiter.admit_at(6_000, [], [], [streams]).allowed


def test_headers_name_the_tightest_quota_of_each_kind() -> None:
    limiter = MemoryLimiter(window_s=60)
    quotas = [Quota("key:cs", "requests", 100), Quota("line:cs", "requests", 5)]
    verdict = limiter.admit_at(6_030, quotas, [1, 1], [])
    headers = verdict.headers()
    assert headers["x-ratelimit-limit-requests"] == "5"
    assert headers["x-ratelimit-remaining-requests"] == "4"
    assert headers["x-ratelimit-reset-requests"] == "30.000s"
    assert "retry-after" not in headers


def test_limits_unset_are_unlimited() -> None:
    scopes = [("key:a", Limits(requests_per_min=5)), ("line:x", None), ("line:y", Limits())]
    assert quotas_for("requests", scopes) == [Quota("key:a", "requests", 5)]
    assert quotas_for("tokens", scopes) == []


# --------------------------------------------------------------------------- real Redis


def _redis(url: str, timeout_s: float = 0.5) -> Any:
    """The gateway's Redis client as the composition root builds it from the settings."""
    gateway = GatewaySettings(redis_timeout_s=timeout_s)
    return build_clients(load_settings(redis_url=url, gateway=gateway)).redis


@pytest.mark.integration
def test_redis_counts_like_memory_and_takes_all_or_nothing(redis_url: str) -> None:
    scope = f"line:test-{uuid.uuid4().hex}"
    line, key = Quota(scope, "requests", 20), Quota(scope + "-key", "requests", 1_000)

    async def burst() -> list[bool]:
        # One event loop: the limiter's connection pool belongs to it.
        limiter = RedisLimiter(_redis(redis_url, timeout_s=5), window_s=60)
        try:
            verdicts = await asyncio.gather(
                *(limiter.admit([key, line], [1, 1], []) for _ in range(30))
            )
            after = await limiter.admit([key], [1], [])
            assert limiter.up
        finally:
            await limiter.close()
        assert after.standings[0].remaining == 1_000 - 21
        return [v.allowed for v in verdicts]

    admitted = asyncio.run(burst())
    # Concurrent and atomic: exactly the limit, however the 30 interleave.
    assert admitted.count(True) == 20


@pytest.mark.integration
def test_redis_stream_slots_and_token_charges(redis_url: str) -> None:
    scope = f"key:test-{uuid.uuid4().hex}"
    streams, tokens = Quota(scope, "streams", 1), Quota(scope, "tokens", 100)

    async def run() -> None:
        limiter = RedisLimiter(_redis(redis_url, timeout_s=5), window_s=60)
        try:
            await check(limiter)
        finally:
            await limiter.close()

    async def check(redis_limiter: RedisLimiter) -> None:
        first = await redis_limiter.admit([tokens], [0], [streams])
        assert first.allowed
        assert first.stream_slot
        assert not (await redis_limiter.admit([tokens], [0], [streams])).allowed
        await redis_limiter.release([streams], first.stream_slot)
        await redis_limiter.charge([tokens], 150)
        over = await redis_limiter.admit([tokens], [0], [streams])
        assert over.refused == tokens
        assert over.retry_after_s > 0

    asyncio.run(run())


@pytest.mark.integration
def test_redis_settles_a_finished_answer_in_one_call(redis_url: str) -> None:
    scope = f"key:test-{uuid.uuid4().hex}"
    streams, tokens = Quota(scope, "streams", 1), Quota(scope, "tokens", 100)

    async def run() -> tuple[bool, bool]:
        limiter = RedisLimiter(_redis(redis_url, timeout_s=5), window_s=60)
        try:
            first = await limiter.admit([tokens], [0], [streams])
            await limiter.settle([tokens], 150, [streams], first.stream_slot)
            after = await limiter.admit([tokens], [0], [streams])
            # The slot is free again, so only the tokens refuse.
            return first.allowed, after.refused == tokens
        finally:
            await limiter.close()

    assert asyncio.run(run()) == (True, True)


def test_an_unreachable_redis_falls_back_to_this_process() -> None:
    limiter = RedisLimiter(_redis(f"redis://127.0.0.1:{free_port()}/0"), window_s=60)
    quota = Quota("line:x", "requests", 2)

    async def run() -> list[bool]:
        try:
            return [(await limiter.admit([quota], [1], [])).allowed for _ in range(3)]
        finally:
            await limiter.close()

    assert asyncio.run(run()) == [True, True, False]
    assert not limiter.up


# --------------------------------------------------------------------------- the gateway


def _limited_keys() -> KeyRing:
    return KeyRing(
        [
            ApiKey(
                name="cs",
                sha256=key_digest(CS_KEY),
                business_lines=("customer_service",),
                limits=Limits(requests_per_min=5, feedback_per_min=3, concurrent_streams=1),
            ),
            ApiKey(name="other", sha256=key_digest(OTHER_KEY), business_lines=("*",)),
        ],
        {"legal": Limits(requests_per_min=4)},
    )


@pytest.fixture
def limited(settings: Settings) -> Iterator[str]:
    store = FeedbackStore.open(settings)
    with running_stub(StubBehaviour(delay_s=0.0)) as stub:
        config = GatewaySettings(upstreams=(stub.base_url,), log_flush_s=0.02)
        app = create_app(
            settings, config, store=store, routes=RouteStore(store.engine), keys=_limited_keys()
        )
        with serving(app, free_port()) as url:
            yield url
    store.close()


def _ask(url: str, key: str, line: str, **extra: object) -> httpx.Response:
    body = {"model": line, "messages": [{"role": "user", "content": "hi"}], **extra}
    return httpx.post(
        f"{url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


def test_a_key_over_its_limit_gets_429_with_retry_after_and_the_rest_is_untouched(
    limited: str,
) -> None:
    answers = [_ask(limited, CS_KEY, "customer_service") for _ in range(7)]
    assert [a.status_code for a in answers] == [200] * 5 + [429] * 2
    assert answers[0].headers["x-ratelimit-limit-requests"] == "5"
    assert answers[0].headers["x-ratelimit-remaining-requests"] == "4"
    refused = answers[-1]
    assert int(refused.headers["retry-after"]) >= 1
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert "key 'cs'" in error["message"]
    # Another key on the same line is untouched; the legal line has a limit of its own.
    assert _ask(limited, OTHER_KEY, "customer_service").status_code == 200
    legal = [_ask(limited, OTHER_KEY, "legal").status_code for _ in range(5)]
    assert legal == [200] * 4 + [429]


def test_feedback_floods_get_429(limited: str) -> None:
    answer = _ask(limited, CS_KEY, "customer_service")
    request_id = answer.headers["x-request-id"]
    statuses = [
        httpx.post(
            f"{limited}/v1/feedback",
            json={"request_id": request_id, "type": "thumbs_down", "idempotency_key": f"k{i}"},
            headers={"Authorization": f"Bearer {CS_KEY}"},
            timeout=10,
        ).status_code
        for i in range(5)
    ]
    # One thumbs-down counts once (the copies are 200 "duplicate"); the flood is cut at 3/min.
    assert statuses == [202, 200, 200, 429, 429]


def test_concurrent_streams_are_capped_and_given_back(settings: Settings, tmp_path: Path) -> None:
    store = FeedbackStore.open(settings)
    with running_stub(StubBehaviour(delay_s=0.6)) as stub:
        config = GatewaySettings(upstreams=(stub.base_url,), log_flush_s=0.02)
        app = create_app(
            settings, config, store=store, routes=RouteStore(store.engine), keys=_limited_keys()
        )
        with serving(app, free_port()) as url:
            slow: dict[str, httpx.Response] = {}
            worker = threading.Thread(
                target=lambda: slow.update(answer=_ask(url, CS_KEY, "customer_service"))
            )
            worker.start()
            time.sleep(0.25)
            second = _ask(url, CS_KEY, "customer_service")
            worker.join()
            assert slow["answer"].status_code == 200
            assert second.status_code == 429
            assert "in flight at once" in second.json()["error"]["message"]
            time.sleep(0.1)  # the slot is given back off the request path
            assert _ask(url, CS_KEY, "customer_service").status_code == 200
    store.close()


def test_limits_come_from_the_key_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "keys": [
                    {
                        "name": "cs",
                        "sha256": key_digest(CS_KEY),
                        "business_lines": ["customer_service"],
                        "limits": {"requests_per_min": 60, "tokens_per_min": 10_000},
                    }
                ],
                "lines": {"legal": {"concurrent_streams": 4}},
            }
        )
    )
    ring = KeyRing.load(path)
    key = ring.authorize(CS_KEY)
    assert key is not None
    assert key.limits.tokens_per_min == 10_000
    assert ring.line_limits["legal"].concurrent_streams == 4


def test_a_body_that_stalls_is_cut_with_408_and_no_traceback(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    import socket

    store = FeedbackStore.open(settings)
    with running_stub(StubBehaviour()) as stub:
        config = GatewaySettings(upstreams=(stub.base_url,), body_read_timeout_s=0.5)
        app = create_app(
            settings, config, store=store, routes=RouteStore(store.engine), keys=_limited_keys()
        )
        port = free_port()
        with serving(app, port), socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + OTHER_KEY.encode() + b"\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                b'{"model": "legal", '
            )
            started = time.monotonic()
            answer = b""
            while chunk := raw.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer and b"}}" in answer:
                    break
            waited = time.monotonic() - started
    store.close()
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"did not arrive" in answer
    assert 0.4 < waited < 5
    assert "Traceback" not in caplog.text
