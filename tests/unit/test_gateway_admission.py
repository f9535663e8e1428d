"""What the gateway admits it gives back on every path, caps every answer, and refuses
malformed values with a 400 naming the field (issue 32, items 1, 2 and 8).

A gateway on a real port in front of the stub vLLM; the key under test may have two
completions in flight at once, so one slot that is never given back shows as a 429.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from feedback.store import FeedbackStore
from flywheel.errors import UsageError
from flywheel.settings import Settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from gateway.limits import Limits
from registry.routes import RouteStore
from registry.vllm_server import free_port
from tests.servers import serving
from tests.stub_vllm import StubBehaviour, StubVllm, running_stub

KEY, CAPPED_KEY = "fw-two-streams", "fw-capped"
LINE = "customer_service"
HI = [{"role": "user", "content": "hi"}]


def _keys() -> KeyRing:
    return KeyRing(
        [
            ApiKey(
                name="two",
                sha256=key_digest(KEY),
                business_lines=(LINE, "legal"),
                limits=Limits(concurrent_streams=2, requests_per_min=10_000),
            ),
            ApiKey(
                name="capped",
                sha256=key_digest(CAPPED_KEY),
                business_lines=(LINE, "legal"),
                limits=Limits(max_output_tokens=100),
            ),
        ],
        {"legal": Limits(max_output_tokens=50)},
    )


@dataclass
class Running:
    url: str
    stub: StubVllm | None
    app: Any

    def post(self, path: str, body: Any, key: str = KEY) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
        content = body if isinstance(body, bytes) else None
        json = None if isinstance(body, bytes) else body
        return httpx.post(self.url + path, content=content, json=json, headers=headers, timeout=10)

    def chat(self, key: str = KEY, **extra: Any) -> httpx.Response:
        return self.post("/v1/chat/completions", {"model": LINE, "messages": HI, **extra}, key)

    def held(self) -> tuple[int, float]:
        """(requests counted in flight, the in-flight gauge's total)."""
        state = self.app.state.gateway
        gauge = sum(
            sample.value
            for metric in state.metrics.registry.collect()
            if metric.name == "flywheel_gateway_in_flight"
            for sample in metric.samples
        )
        return state.requests_in_flight, gauge


def _serve(settings: Settings, config: GatewaySettings) -> Any:
    store = FeedbackStore.open(settings)
    app = create_app(settings, config, store=store, routes=RouteStore(store.engine), keys=_keys())
    return store, app


@pytest.fixture
def gateway(settings: Settings) -> Iterator[Running]:
    with running_stub(StubBehaviour()) as stub:
        config = GatewaySettings(upstreams=(stub.base_url,), log_flush_s=0.02)
        store, app = _serve(settings, config)
        with serving(app, free_port()) as url:
            yield Running(url, stub, app)
    store.close()


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _both_slots_free(gateway: Running) -> None:
    """Two slow chats at once are both answered: the key's two slots are free."""
    assert gateway.stub is not None
    gateway.stub.behaviour.delay_s = 0.3
    answers: list[httpx.Response] = []
    workers = [threading.Thread(target=lambda: answers.append(gateway.chat())) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    gateway.stub.behaviour.delay_s = 0.0
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]


# ------------------------------------------------------------ item 1: admission released


def test_a_body_too_deep_to_forward_is_a_400_at_intake_and_holds_nothing(
    gateway: Running,
) -> None:
    for depth in (65, 254, 1000):
        body = b'{"model": "customer_service", "messages": [{"role": "user", "content": "hi"}],'
        body += b' "metadata": {"x": ' + _deep(depth) + b"}}"
        refused = gateway.post("/v1/chat/completions", body)
        assert refused.status_code == 400, refused.text
        assert "more than 64 deep" in refused.json()["error"]["message"]
    completion = b'{"model": "customer_service", "prompt": "hi", "extra": ' + _deep(500) + b"}"
    assert gateway.post("/v1/completions", completion).status_code == 400
    # As deep as the limit allows is forwarded.
    deep_ok = b'{"model": "customer_service", "messages": [{"role": "user", "content": "hi"}],'
    deep_ok += b' "metadata": ' + _deep(63) + b"}"
    assert gateway.post("/v1/chat/completions", deep_ok).status_code == 200
    assert gateway.stub is not None
    assert len(gateway.stub.received) == 1
    assert [gateway.chat().status_code for _ in range(3)] == [200, 200, 200]
    assert gateway.held() == (0, 0)
    _both_slots_free(gateway)


def test_a_failure_after_admission_gives_back_the_slot_and_the_in_flight_count(
    gateway: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = gateway.app.state.gateway

    async def broken_post(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("a bug between admission and the answer")

    monkeypatch.setattr(state.upstreams, "post", broken_post)
    assert [gateway.chat().status_code for _ in range(4)] == [500] * 4
    monkeypatch.undo()
    assert gateway.held() == (0, 0)
    assert [gateway.chat().status_code for _ in range(3)] == [200, 200, 200]
    _both_slots_free(gateway)


def test_with_vllm_down_at_start_every_request_gets_503_never_429(settings: Settings) -> None:
    config = GatewaySettings(upstreams=(f"http://127.0.0.1:{free_port()}",), log_flush_s=0.02)
    store, app = _serve(settings, config)
    with serving(app, free_port()) as url:
        gateway = Running(url, None, app)
        statuses = [gateway.chat().status_code for _ in range(4)]
        assert statuses == [503] * 4
        assert gateway.held() == (0, 0)
    store.close()


def test_shadow_mirroring_is_not_switched_off_by_failed_requests(gateway: Running) -> None:
    # Eight leaked in-flight requests used to stop every mirror for good
    # (shadow_max_user_requests): the count must fall back to zero.
    for _ in range(8):
        body = b'{"model": "customer_service", "messages": [{"role": "user", "content": "x"}],'
        assert gateway.post("/v1/chat/completions", body + b'"x": ' + _deep(900) + b"}").is_error
    assert gateway.held() == (0, 0)


# ------------------------------------------------------------------ item 2: output capped


def test_an_answer_without_a_limit_gets_the_cap_of_the_gateway_the_key_or_the_line(
    gateway: Running,
) -> None:
    assert gateway.stub is not None
    received = gateway.stub.received
    assert gateway.chat(ignore_eos=True).status_code == 200
    assert received[-1]["max_tokens"] == 4_096
    assert gateway.chat(ignore_eos=True, max_tokens=None).status_code == 200
    assert received[-1]["max_tokens"] == 4_096
    assert gateway.chat(CAPPED_KEY, ignore_eos=True).status_code == 200
    assert received[-1]["max_tokens"] == 100
    legal = {"model": "legal", "messages": HI, "ignore_eos": True}
    assert gateway.post("/v1/chat/completions", legal, CAPPED_KEY).status_code == 200
    assert received[-1]["max_tokens"] == 50  # the line's cap is below the key's
    # A limit the caller sets is kept (either name).
    assert gateway.chat(max_completion_tokens=7).status_code == 200
    assert "max_tokens" not in received[-1]
    assert gateway.chat(max_tokens=9).status_code == 200
    assert received[-1]["max_tokens"] == 9
    # A text completion without max_tokens gets OpenAI's 16; with null, the cap.
    prompt = {"model": LINE, "prompt": "hi", "ignore_eos": True}
    assert gateway.post("/v1/completions", prompt).status_code == 200
    assert received[-1]["max_tokens"] == 16
    assert gateway.post("/v1/completions", {**prompt, "max_tokens": None}).status_code == 200
    assert received[-1]["max_tokens"] == 4_096
    assert gateway.post("/v1/completions", prompt, CAPPED_KEY).status_code == 200
    assert received[-1]["max_tokens"] == 16


def test_asking_for_more_than_the_key_allows_is_a_400_naming_whose_cap(gateway: Running) -> None:
    refused = gateway.chat(CAPPED_KEY, max_tokens=101)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "max_tokens is 101, over key 'capped''s 100"
    legal = {"model": "legal", "messages": HI, "max_completion_tokens": 51}
    refused = gateway.post("/v1/chat/completions", legal, CAPPED_KEY)
    assert refused.json()["error"]["param"] == "max_completion_tokens"
    assert "over line 'legal''s 50" in refused.json()["error"]["message"]


def test_no_cap_is_set_where_the_model_context_is_below_it(settings: Settings) -> None:
    # vLLM stops at its context anyway, and refuses a prompt that leaves less room than a
    # max_tokens it is sent: a context of 2,048 under the cap of 4,096 is left to vLLM.
    with running_stub(StubBehaviour(max_model_len=2_048)) as stub:
        config = GatewaySettings(upstreams=(stub.base_url,), log_flush_s=0.02)
        store, app = _serve(settings, config)
        with serving(app, free_port()) as url:
            gateway = Running(url, stub, app)
            assert gateway.chat(ignore_eos=True).status_code == 200
            assert "max_tokens" not in stub.received[-1]
            assert gateway.chat(CAPPED_KEY, ignore_eos=True).status_code == 200
            assert stub.received[-1]["max_tokens"] == 100
    store.close()


# ---------------------------------------------------------- item 8: malformed values, 400


@pytest.mark.parametrize(
    ("path", "extra", "field"),
    [
        ("/v1/chat/completions", {"best_of": "x"}, "best_of"),
        ("/v1/chat/completions", {"best_of": [1]}, "best_of"),
        ("/v1/completions", {"max_completion_tokens": "abc"}, "max_completion_tokens"),
        ("/v1/chat/completions", {"max_completion_tokens": "abc"}, "max_completion_tokens"),
        ("/v1/completions", {"best_of": 1.5}, "best_of"),
        ("/v1/chat/completions", {"n": "2"}, "n"),
        ("/v1/chat/completions", {"n": True}, "n"),
        ("/v1/chat/completions", {"max_tokens": 5.5}, "max_tokens"),
        ("/v1/chat/completions", {"max_tokens": "5"}, "max_tokens"),
        ("/v1/chat/completions", {"temperature": "hot"}, "temperature"),
        ("/v1/chat/completions", {"top_p": True}, "top_p"),
        ("/v1/chat/completions", {"top_k": 1.5}, "top_k"),
        ("/v1/chat/completions", {"min_p": 3}, "min_p"),
        ("/v1/chat/completions", {"repetition_penalty": 0}, "repetition_penalty"),
        ("/v1/chat/completions", {"min_tokens": -1}, "min_tokens"),
        ("/v1/chat/completions", {"seed": "1"}, "seed"),
        ("/v1/chat/completions", {"stream": "yes"}, "stream"),
        ("/v1/chat/completions", {"stream_options": {"include_usage": "yes"}}, "stream_options"),
        ("/v1/chat/completions", {"ignore_eos": "true"}, "ignore_eos"),
        ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 50}, "top_logprobs"),
        ("/v1/chat/completions", {"logit_bias": {"50256": "x"}}, "logit_bias"),
        ("/v1/chat/completions", {"stop_token_ids": ["a"]}, "stop_token_ids"),
        ("/v1/completions", {"logprobs": True}, "logprobs"),
        ("/v1/completions", {"echo": 1}, "echo"),
        ("/v1/completions", {"presence_penalty": "0"}, "presence_penalty"),
    ],
)
def test_a_malformed_value_is_a_400_naming_the_field(
    gateway: Running, path: str, extra: dict[str, Any], field: str
) -> None:
    base: dict[str, Any] = {"model": LINE}
    base |= {"prompt": "hi"} if path == "/v1/completions" else {"messages": HI}
    response = gateway.post(path, {**base, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].split(".")[0] == field
    assert error["message"].startswith(field)
    assert gateway.stub is not None
    assert gateway.stub.received == []
    assert gateway.held() == (0, 0)


def test_numbers_of_the_right_type_pass(gateway: Running) -> None:
    sampled = gateway.chat(
        temperature=1,
        top_p=0.9,
        top_k=-1,
        min_p=0.1,
        seed=7,
        n=1,
        best_of=1,
        max_tokens=5,
        logprobs=True,
        top_logprobs=2,
        logit_bias={"50256": -100},
        stream_options=None,
    )
    assert sampled.status_code == 200, sampled.text


# ------------------------------------------------------------------ item 9: line names


def test_a_key_file_naming_a_line_that_cannot_exist_is_refused(tmp_path: Path) -> None:
    path, sha = tmp_path / "keys.yaml", "0" * 64
    for document in (
        f"keys: [{{name: a, sha256: '{sha}', business_lines: ['Bad:Line*']}}]",
        f"keys: [{{name: a, sha256: '{sha}', business_lines: ['*'], review_lines: [Legal]}}]",
        "lines: {'legal ': {requests_per_min: 5}}",
    ):
        path.write_text(document)
        with pytest.raises(UsageError, match="a business line's name is lowercase"):
            KeyRing.load(path)
    path.write_text(
        f"keys: [{{name: a, sha256: '{sha}', business_lines: ['*', legal]}}]\n"
        "lines: {legal: {max_output_tokens: 10}}"
    )
    assert KeyRing.load(path).line_limits["legal"].max_output_tokens == 10
