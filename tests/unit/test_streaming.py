"""How the gateway asks vLLM for answers it can time (pure parts)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.streaming import (
    BrokenStreamError,
    StreamRewriter,
    UpstreamMode,
    assemble,
    upstream_mode,
    upstream_payload,
    with_answer_id,
)

CHAT = {"model": "a", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("extra", "completion_api", "mode"),
    [
        ({}, False, UpstreamMode.ASSEMBLE),
        ({"stream": False, "max_tokens": 9, "temperature": 0.7}, False, UpstreamMode.ASSEMBLE),
        ({"stream": True}, False, UpstreamMode.STREAM_STRIP_USAGE),
        ({"stream": True, "stream_options": {"include_usage": True}}, False, UpstreamMode.STREAM),
        ({"n": 2}, False, UpstreamMode.AS_SENT),
        ({"logprobs": True}, False, UpstreamMode.AS_SENT),
        ({"tools": []}, False, UpstreamMode.AS_SENT),
        ({"prompt": ["a", "b"]}, True, UpstreamMode.AS_SENT),
        ({"prompt": "a"}, True, UpstreamMode.ASSEMBLE),
    ],
)
def test_modes(extra: dict[str, Any], completion_api: bool, mode: UpstreamMode) -> None:
    payload = {**CHAT, **extra}
    assert upstream_mode(payload, completion_api=completion_api, enabled=True) is mode
    assert upstream_mode(payload, completion_api=completion_api, enabled=False) is (
        UpstreamMode.AS_SENT
    )


def test_payloads_ask_for_usage_without_touching_the_callers() -> None:
    caller = {**CHAT, "stream_options": {"continuous_usage_stats": False}, "stream": True}
    sent = upstream_payload(caller, UpstreamMode.STREAM_STRIP_USAGE)
    assert sent["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert caller["stream_options"] == {"continuous_usage_stats": False}
    assert upstream_payload(CHAT, UpstreamMode.ASSEMBLE)["stream"] is True
    assert upstream_payload(CHAT, UpstreamMode.AS_SENT) is CHAT


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


DELTAS = [
    _event({"id": "c1", "created": 5, "model": "m", "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}),
    _event({"id": "c1", "created": 5, "model": "m", "choices": [
        {"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]}),
    _event({"id": "c1", "created": 5, "model": "m", "choices": [
        {"index": 0, "delta": {"content": " there"}, "finish_reason": "stop",
         "stop_reason": None}]}),
]  # fmt: skip
USAGE = _event({"id": "c1", "choices": [], "usage": {"completion_tokens": 2, "total_tokens": 9}})
STREAM = b"".join(DELTAS) + USAGE + b"data: [DONE]\n\n"


def _relayed(stream: bytes, size: int, *, strip_usage: bool) -> bytes:
    rewriter = StreamRewriter("req-1", strip_usage=strip_usage)
    out = b"".join(rewriter.feed(stream[i : i + size]) for i in range(0, len(stream), size))
    return out + rewriter.flush()


@pytest.mark.parametrize("size", [1, 7, 64, len(STREAM)])
def test_the_usage_event_is_dropped_and_ids_set_however_the_stream_is_cut(size: int) -> None:
    out = _relayed(STREAM, size, strip_usage=True)
    expected = b"".join(DELTAS) + b"data: [DONE]\n\n"
    assert out == expected.replace(b'"id":"c1"', b'"id":"req-1"')


@pytest.mark.parametrize("size", [1, 7, len(STREAM)])
def test_a_relayed_stream_changes_nothing_but_the_ids(size: int) -> None:
    quoted = _event({"id": "c1", "choices": [{"index": 0, "delta": {"content": '{"id":"c1"}'}}]})
    stream = STREAM.replace(b"data: [DONE]", quoted + b"data: [DONE]")
    out = _relayed(stream, size, strip_usage=False)
    events = [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
    assert {e["id"] for e in events} == {"req-1"}
    assert events[-2]["usage"] == {"completion_tokens": 2, "total_tokens": 9}
    assert events[-1]["choices"][0]["delta"]["content"] == '{"id":"c1"}'
    assert out.replace(b'"id":"req-1"', b'"id":"c1"') == stream


def test_a_plain_answer_gets_the_request_id_and_anything_else_is_left_alone() -> None:
    answer = orjson.dumps({"id": "c1", "choices": [{"index": 0, "text": "c1"}]})
    assert orjson.loads(with_answer_id(answer, "req-1")) == {
        "id": "req-1",
        "choices": [{"index": 0, "text": "c1"}],
    }
    error = orjson.dumps({"error": {"message": "bad"}})
    for body in (error, b"not json", b"[1]"):
        assert with_answer_id(body, "req-1") == body


@pytest.mark.parametrize("size", [1, 7, len(STREAM)])
def test_the_adapter_that_answered_is_shown_as_the_line(size: int) -> None:
    quoted = _event({"id": "c1", "choices": [{"index": 0, "delta": {"content": '"model":"m"'}}]})
    stream = STREAM.replace(b"data: [DONE]", quoted + b"data: [DONE]")
    rewriter = StreamRewriter("req-1", strip_usage=False, model="legal")
    out = b"".join(rewriter.feed(stream[i : i + size]) for i in range(0, len(stream), size))
    events = [
        orjson.loads(e[6:]) for e in (out + rewriter.flush()).split(b"\n\n") if e[6:7] == b"{"
    ]
    assert {e.get("model") for e in events} == {"legal", None}  # usage events name none
    assert events[-1]["choices"][0]["delta"]["content"] == '"model":"m"'
    plain = orjson.dumps({"id": "c1", "model": "legal-v3", "choices": []})
    assert orjson.loads(with_answer_id(plain, "req-1", model="legal"))["model"] == "legal"


def test_a_chat_answer_is_rebuilt_from_its_events() -> None:
    document = orjson.loads(assemble(STREAM, completion_api=False))
    assert document["object"] == "chat.completion"
    assert (document["id"], document["created"], document["model"]) == ("c1", 5, "m")
    [choice] = document["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello there", "tool_calls": []}
    assert choice["finish_reason"] == "stop"
    assert document["usage"] == {"completion_tokens": 2, "total_tokens": 9}


def test_a_text_completion_is_rebuilt() -> None:
    last = {"index": 0, "text": "b", "finish_reason": "length"}
    stream = (
        _event({"id": "t", "model": "m", "choices": [{"index": 0, "text": "a"}]})
        + _event({"id": "t", "model": "m", "choices": [last]})
        + b"data: [DONE]\n\n"
    )
    document = orjson.loads(assemble(stream, completion_api=True))
    assert document["object"] == "text_completion"
    assert document["choices"][0]["text"] == "ab"
    assert document["choices"][0]["finish_reason"] == "length"
    assert document["usage"] is None


@pytest.mark.parametrize(
    "stream",
    [
        b"".join(DELTAS),  # no [DONE]
        DELTAS[0] + _event({"error": {"message": "boom"}}) + b"data: [DONE]\n\n",
        b"data: [DONE]\n\n",
    ],
)
def test_a_broken_stream_is_not_rebuilt(stream: bytes) -> None:
    with pytest.raises(BrokenStreamError):
        assemble(stream, completion_api=False)
