"""How the gateway asks vLLM for an answer so it can time it (pure).

The canary compares adapters on time to first token (TTFT) and time per output
token (TPOT, which needs vLLM's token count). A non-streamed answer arrives
whole, so its first token cannot be timed; a streamed one carries no token
count unless the caller asked for it. So the gateway:

- asks for usage on every stream (``stream_options.include_usage``) and, when
  the caller did not ask for it, drops vLLM's usage-only last event before the
  caller sees it (:class:`StreamRewriter`);
- asks for a stream when the caller wants a plain answer whose shape it can
  rebuild exactly (one choice, no tools, no log-probabilities, only the fields
  in ``ASSEMBLED_FIELDS``), times the first event, and rebuilds the JSON answer
  from the events (:func:`assemble`). Any other request goes to vLLM as sent and
  its TTFT is unknown (stored as null, never its total latency).

Every answer the caller gets carries the gateway's request id as its ``id`` (each
chunk of a stream too, :func:`with_answer_id` and :class:`StreamRewriter`): the id
an OpenAI client shows as ``response.id`` is the one ``/v1/feedback`` names. vLLM's
own id (``chatcmpl-...``) is not kept: nothing the gateway stores or reads needs it.
Its ``model`` becomes the business line the caller named: the adapter that answered
(``<line>-v<version>``) would tell a caller which arm it is on, and so which users are
the canary's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

# Request fields whose answer a stream reproduces exactly when rebuilt into one document.
ASSEMBLED_FIELDS = frozenset(
    {
        "model", "messages", "prompt", "stream", "stream_options", "max_tokens",
        "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "stop",
        "stop_token_ids", "seed", "presence_penalty", "frequency_penalty",
        "repetition_penalty", "min_tokens", "ignore_eos", "user", "n", "response_format",
        "skip_special_tokens", "spaces_between_special_tokens", "length_penalty", "metadata",
        "store", "service_tier", "include_stop_str_in_output",
    }
)  # fmt: skip
_EVENT_END = b"\n\n"


class UpstreamMode(StrEnum):
    """How the request goes to vLLM."""

    AS_SENT = "as_sent"  # the caller's request unchanged (TTFT unknown when not streamed)
    STREAM = "stream"  # the caller streams; usage asked for and kept
    STREAM_STRIP_USAGE = "stream_strip_usage"  # the caller streams; vLLM's usage dropped
    ASSEMBLE = "assemble"  # the caller wants one answer; streamed from vLLM, rebuilt

    @property
    def strips_usage(self) -> bool:
        """Whether vLLM's usage event must be kept from the caller."""
        return self is UpstreamMode.STREAM_STRIP_USAGE


class BrokenStreamError(Exception):
    """The stream ended without [DONE], or vLLM reported an error inside it."""


def upstream_mode(payload: dict[str, Any], *, completion_api: bool, enabled: bool) -> UpstreamMode:
    """How to send ``payload`` so TTFT and TPOT can be measured (``enabled`` off: as sent)."""
    if not enabled:
        return UpstreamMode.AS_SENT
    options = payload.get("stream_options")
    if payload.get("stream") is True:
        if isinstance(options, dict) and options.get("include_usage") is True:
            return UpstreamMode.STREAM
        return UpstreamMode.STREAM_STRIP_USAGE
    rebuildable = (
        payload.get("stream") in (None, False)
        and options is None
        and set(payload) <= ASSEMBLED_FIELDS
        and payload.get("n") in (None, 1)
        # A batch of prompts answers several choices.
        and (not completion_api or isinstance(payload.get("prompt"), str))
    )
    return UpstreamMode.ASSEMBLE if rebuildable else UpstreamMode.AS_SENT


def upstream_payload(payload: dict[str, Any], mode: UpstreamMode) -> dict[str, Any]:
    """The body to send vLLM in ``mode`` (``payload`` itself when unchanged)."""
    if mode in (UpstreamMode.AS_SENT, UpstreamMode.STREAM):
        return payload
    options = payload.get("stream_options")
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    return {**payload, "stream": True, "stream_options": options}


def _events(block: bytes) -> list[bytes]:
    return [event for event in block.split(_EVENT_END) if event.strip()]


def _data(event: bytes) -> Any:
    """The JSON of one SSE event's data line; None for [DONE], comments or junk."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return None
            try:
                return orjson.loads(payload)
            except orjson.JSONDecodeError:
                return None
    return None


def _usage_only(data: Any) -> bool:
    return isinstance(data, dict) and data.get("choices") == [] and "usage" in data


def with_answer_id(body: bytes, answer_id: str, *, model: str | None = None) -> bytes:
    """A JSON answer with ``answer_id`` as its ``id`` (and ``model``, when given, as its
    ``model``); a body that is not an answer (no ``id``, not JSON) is returned as it is."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(document, dict) or "id" not in document:
        return body
    document["id"] = answer_id
    if model is not None and "model" in document:
        document["model"] = model
    return orjson.dumps(document)


def _upstream_value(block: bytes, name: str) -> bytes | None:
    """The ``name`` field (``id``, ``model``) of the first answer chunk in ``block`` that
    has one, JSON-encoded (quotes included)."""
    for event in _events(block):
        data = _data(event)
        if isinstance(data, dict) and isinstance(data.get(name), str) and data[name]:
            return orjson.dumps(data[name])
    return None


class _FieldSwap:
    """Replaces one string field's upstream value, the same in every chunk, as bytes."""

    def __init__(self, name: str, value: str) -> None:
        self._name = name
        self._key = orjson.dumps(name)
        self._new = self._key + b":" + orjson.dumps(value)
        self._old: tuple[bytes, bytes] | None = None

    def __call__(self, block: bytes) -> bytes:
        if self._old is None and (found := _upstream_value(block, self._name)) is not None:
            # vLLM writes compact JSON; a server that puts a space after the colon too.
            self._old = (self._key + b":" + found, self._key + b": " + found)
        if self._old is None:
            return block
        compact, spaced = self._old
        return block.replace(compact, self._new).replace(spaced, self._new)


class StreamRewriter:
    """Relays vLLM's SSE stream whole events at a time, each chunk's ``id`` set to the
    gateway's ``answer_id`` (and its ``model`` to ``model``, when given), and without
    vLLM's usage-only event when ``strip_usage``.

    Bytes after the last complete event wait for the rest of it (a partial event is of no
    use to a client), so ids are set and the usage event dropped even when they arrive in
    pieces; everything else passes through unchanged. vLLM gives every chunk of a stream
    the same id and model, so each is read once and each ``"id":<its id>`` is replaced as
    bytes (no JSON per chunk): unescaped quotes cannot occur inside a JSON string, so an
    answer's text never matches."""

    def __init__(self, answer_id: str, *, strip_usage: bool, model: str | None = None) -> None:
        self._pending = b""
        self._swaps = [_FieldSwap("id", answer_id)]
        if model is not None:
            self._swaps.append(_FieldSwap("model", model))
        self._strip_usage = strip_usage

    def feed(self, chunk: bytes) -> bytes:
        """The complete events of ``pending + chunk`` the caller should get."""
        data = self._pending + chunk
        end = data.rfind(_EVENT_END)
        if end < 0:
            self._pending = data
            return b""
        complete, self._pending = data[: end + 2], data[end + 2 :]
        complete = self._set_id(complete)
        if not self._strip_usage or b'"usage"' not in complete:
            return complete
        kept = [e for e in complete.split(_EVENT_END) if e and not _usage_only(_data(e))]
        return b"".join(e + _EVENT_END for e in kept)

    def flush(self) -> bytes:
        """What is left when the stream ends (an incomplete last event, relayed as is but
        for its id)."""
        rest, self._pending = self._pending, b""
        return self._set_id(rest)

    def _set_id(self, block: bytes) -> bytes:
        for swap in self._swaps:
            block = swap(block)
        return block


@dataclass(slots=True)
class _Choice:
    text: list[str]
    role: str = "assistant"
    reasoning: list[str] | None = None
    finish_reason: str | None = None
    stop_reason: Any = None

    def add(self, piece: dict[str, Any], *, completion_api: bool) -> None:
        """Fold one streamed piece of this choice in."""
        if completion_api:
            self.text.append(piece.get("text") or "")
        else:
            delta = piece.get("delta") or {}
            self.role = delta.get("role") or self.role
            self.text.append(delta.get("content") or "")
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                self.reasoning = [*(self.reasoning or []), reasoning]
        self.finish_reason = piece.get("finish_reason") or self.finish_reason
        self.stop_reason = piece.get("stop_reason", self.stop_reason)


def assemble(body: bytes, *, completion_api: bool) -> bytes:
    """The JSON answer vLLM would have given without streaming, from its SSE ``body``."""
    if b"[DONE]" not in body:
        raise BrokenStreamError("the stream ended before [DONE]")
    first: dict[str, Any] | None = None
    usage = None
    choices: dict[int, _Choice] = {}
    for event in _events(body):
        data = _data(event)
        if not isinstance(data, dict):
            continue
        if "error" in data:
            raise BrokenStreamError("the model server reported an error mid-stream")
        first = first or data
        usage = data.get("usage") or usage
        for piece in data.get("choices") or ():
            choice = choices.setdefault(int(piece.get("index", 0)), _Choice([]))
            choice.add(piece, completion_api=completion_api)
    if first is None:
        raise BrokenStreamError("the stream held no answer")
    built = []
    for index, choice in sorted(choices.items()):
        entry: dict[str, Any] = {"index": index}
        if completion_api:
            entry["text"] = "".join(choice.text)
        else:
            message: dict[str, Any] = {"role": choice.role, "content": "".join(choice.text)}
            if choice.reasoning:
                message["reasoning_content"] = "".join(choice.reasoning)
            message["tool_calls"] = []
            entry["message"] = message
        entry |= {
            "logprobs": None,
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
        }
        built.append(entry)
    document = {
        "id": first.get("id"),
        "object": "text_completion" if completion_api else "chat.completion",
        "created": first.get("created"),
        "model": first.get("model"),
        "choices": built,
        "usage": usage,
    }
    return orjson.dumps(document)
