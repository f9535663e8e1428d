"""A completion or feedback request taken in: the key, a bounded body, the business
line, and the checks that refuse up front what vLLM or the store would refuse."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request
from pydantic import ValidationError

from feedback.events import (
    InvalidEventError,
    check_prompt,
)
from flywheel.bodies import BodyStalledError, BodyTooLargeError, nests_deeper, read_body
from gateway.keys import ApiKey, bearer_token
from gateway.limiting import output_cap
from gateway.state import GatewayState
from gateway.wire import (
    ChatRequest,
    CompletionRequest,
    GatewayError,
    output_limit,
    request_problems,
)


def key_of(state: GatewayState, request: Request) -> ApiKey:
    """The caller's API key, or a 401."""
    token = bearer_token(request.headers.get("authorization"))
    if token is None:
        raise GatewayError(401, "missing API key: send 'Authorization: Bearer <key>'")
    key = state.keys.authorize(token)
    if key is None:
        raise GatewayError(401, "unknown API key")
    return key


def operator_key(state: GatewayState, request: Request) -> ApiKey:
    """The caller's API key if it holds the operator role: a 401 without a known key, a 403
    for a key without the role (every line's metrics and routing are no tenant's to read)."""
    key = key_of(state, request)
    if not key.operator:
        raise GatewayError(
            403, "this needs an operator key ('operator: true' in the gateway's key file)"
        )
    return key


async def json_body(state: GatewayState, request: Request) -> dict[str, Any]:
    """The body as a JSON object, read within the size and stall limits, or a 4xx."""
    try:
        body = await read_body(
            request.stream(),
            request.headers.get("content-length"),
            state.gateway.max_body_bytes,
            state.gateway.body_read_timeout_s,
        )
    except BodyTooLargeError as exc:
        raise GatewayError(413, str(exc)) from None
    except BodyStalledError as exc:
        # A client that stalls mid-body is cut, not waited on forever (slowloris).
        raise GatewayError(408, str(exc)) from None
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise GatewayError(400, "the body must be a JSON object")
    depth = state.gateway.max_body_depth
    if nests_deeper(payload, depth):
        # Refused here, before anything is counted: past its depth limit the body could
        # not be sent on to vLLM.
        raise GatewayError(400, f"the body nests arrays and objects more than {depth} deep")
    return payload


def line_for(state: GatewayState, key: ApiKey, payload: dict[str, Any]) -> str:
    """The business line the request names as ``model``, if this key may use it. A line of
    another tenant gets the very answer of a line that does not exist (404, same body), so
    a key learns nothing about lines beyond its own."""
    line = payload.get("model")
    allowed = key.lines_among(state.lines)
    if not isinstance(line, str) or not line:
        raise GatewayError(
            400,
            f"'model' must name your business line (one of: {', '.join(allowed) or 'none'})",
            param="model",
        )
    if line not in state.lines or not key.may_use(line):
        raise GatewayError(
            404,
            f"unknown business line {line[:80]!r} (yours: {', '.join(allowed) or 'none'})",
            param="model",
        )
    return line


def check_request(
    state: GatewayState,
    key: ApiKey,
    line: str,
    payload: dict[str, Any],
    messages: list[dict[str, str]],
    *,
    completion_api: bool,
) -> None:
    """Refuse up front (400, the field named) what OpenAI's API would refuse, what is over
    this gateway's caps or past what the key may send, and what the store would quarantine,
    rather than answer 200 and drop the record; a request that sets no output limit gets the
    key's or the line's (:func:`gateway.wire.output_limit`)."""
    model = CompletionRequest if completion_api else ChatRequest
    try:
        request = model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise GatewayError(400, f"{where}: {first['msg']}", param=where) from None
    cap = output_cap(state, key, line)
    problem = request_problems(
        request,
        output_cap=cap,
        max_choices=state.gateway.max_choices,
        server_fields=key.allow_server_fields,
    )
    if problem is not None:
        raise GatewayError(400, problem[1], param=problem[0])
    limit = output_limit(
        request,
        cap,
        completion_api=completion_api,
        max_tokens_sent="max_tokens" in payload,
        context_tokens=state.upstreams.context_tokens,
    )
    if limit is not None:
        payload["max_tokens"] = limit
    try:
        check_prompt(
            messages,
            max_text_chars=state.settings.store.max_text_chars,
            max_messages=state.settings.store.max_messages,
        )
    except InvalidEventError as exc:
        raise GatewayError(400, f"{exc.field}: {exc.reason}", param=exc.field) from None
    if not completion_api:
        for message in payload["messages"]:
            if message.get("role") == "developer":
                message["role"] = "system"
