"""The gateway: an OpenAI-compatible proxy in front of vLLM with per-line keys and a sticky canary.

A caller names its business line as ``model``. The gateway checks the caller's
key may use that line, picks the line's adapter from the routing table (the
champion, or the canary for a sticky share of users; a conversation stays on
the adapter it started with), forwards the request to a vLLM replica under the
adapter's name, relays the answer (SSE streams chunk by chunk) and hands the
finished request to the recorder, which logs it to the store off the request
path. Only the routes below exist: vLLM's admin routes cannot be reached
through the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

import aiohttp
import orjson
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select
from starlette.exceptions import HTTPException as StarletteHTTPException

from feedback.events import (
    IDENTIFIER,
    FeedbackType,
    InvalidEventError,
    TaskOutcome,
    check_prompt,
    validate_event,
)
from feedback.schema import feedback_table, interactions_table
from feedback.store import FeedbackStore
from flywheel.bodies import BodyStalledError, BodyTooLargeError, read_body
from flywheel.http_guard import where_it_failed, withhold_tracebacks
from flywheel.settings import Settings
from gateway.keys import ApiKey, KeyFileWatch, KeyRing, bearer_token
from gateway.limits import Limiter, Limits, Quota, Verdict, build_limiter, quotas_for
from gateway.metrics import CONTENT_TYPE_LATEST, NO_ADAPTER, GatewayMetrics
from gateway.recorder import (
    STORE_DOWN_ERRORS,
    FinishedRequest,
    InteractionRecorder,
    used_tokens,
)
from gateway.routing import RoutingTable, arm_of, choose_arm, parse_adapter_name
from gateway.settings import GatewaySettings
from gateway.upstream import Replica, Upstreams, UpstreamUnavailableError, spawn
from gateway.wire import ROLES as WIRE_ROLES
from gateway.wire import ChatRequest, CompletionRequest, request_problems
from registry.routes import RouteSnapshot, RouteStore

logger = logging.getLogger(__name__)
CLAIMED_KEYS = 100_000

REQUEST_ID_HEADER = "x-request-id"
ADAPTER_HEADER = "x-flywheel-adapter"
ARM_HEADER = "x-flywheel-arm"
LINE_HEADER = "x-flywheel-business-line"
SESSION_HEADER = "x-session-id"
USER_HEADER = "x-user-id"
ROLES = frozenset(WIRE_ROLES)
_IDENTIFIER = re.compile(IDENTIFIER)
_OWN_REQUEST_ID = re.compile(r"req-[0-9a-f]{32}")
_JSON = "application/json"
_DONE = b"data: [DONE]"


class GatewayError(Exception):
    """A refusal with an HTTP status and a message for the caller (OpenAI's error shape)."""

    KINDS: ClassVar[dict[int, str]] = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        405: "invalid_request_error",
        408: "invalid_request_error",
        413: "invalid_request_error",
        415: "invalid_request_error",
        429: "rate_limit_error",
        502: "upstream_error",
        503: "service_unavailable",
    }

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> bytes:
        """The JSON error body."""
        error = {
            "message": self.message,
            "type": self.KINDS.get(self.status, "error"),
            "param": self.param,
            "code": self.status,
        }
        return orjson.dumps({"error": error})

    def response(self, headers: dict[str, str] | None = None) -> Response:
        """The error as a response."""
        return Response(self.body(), status_code=self.status, media_type=_JSON, headers=headers)


class FeedbackRequest(BaseModel):
    """Feedback on one answer, named by the request id the gateway returned."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(pattern=IDENTIFIER, description="The x-request-id of the answer.")
    type: FeedbackType
    edited_text: str | None = Field(
        default=None, min_length=1, description="For 'edit': the answer as the user corrected it."
    )
    outcome: TaskOutcome | None = Field(default=None, description="For 'task_outcome'.")
    replaced_by: str | None = Field(
        default=None, pattern=IDENTIFIER, description="For 'regenerate': the new request id."
    )
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        # The store keeps 200 characters; the key is kept under its line's and API key's name.
        max_length=120,
        description="Replays with the same key are stored once (one per type by default); "
        "keys are per business line and API key.",
    )


class FeedbackAccepted(BaseModel):
    """The answer to an accepted feedback event."""

    status: str = "accepted"
    request_id: str
    type: FeedbackType
    idempotency_key: str


def _identity(value: object) -> str | None:
    """A user or session id as the store keeps it (odd ones hashed, never refused)."""
    if value is None or value == "":
        return None
    text = str(value)
    if _IDENTIFIER.fullmatch(text):
        return text
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:40]


def _text_of(content: object, where: str) -> str:
    """The text of a message's content (a string, or OpenAI's list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise GatewayError(
                    400, f"{where}: only text content parts are supported", param=where
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise GatewayError(400, f"{where}: a text part needs a string 'text'", param=where)
            texts.append(text)
        return "".join(texts)
    raise GatewayError(400, f"{where} must be a string or a list of text parts", param=where)


def chat_messages(payload: dict[str, Any]) -> list[dict[str, str]]:
    """The request's messages as the store keeps them (role and text), or a 400."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayError(400, "'messages' must be a non-empty list", param="messages")
    logged = []
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        if not isinstance(message, dict):
            raise GatewayError(400, f"{where} must be an object", param=where)
        role = message.get("role")
        if role not in ROLES:
            raise GatewayError(
                400, f"{where}.role must be one of {', '.join(sorted(ROLES))}", param=where
            )
        # OpenAI's developer role is its system role under a new name; the store and
        # the model's chat template know it as system.
        logged.append(
            {
                "role": "system" if role == "developer" else role,
                "content": _text_of(message.get("content"), where),
            }
        )
    return logged


def completion_messages(payload: dict[str, Any]) -> list[dict[str, str]]:
    """A completion prompt as one user message, or a 400."""
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise GatewayError(400, "'prompt' must be one non-empty string", param="prompt")
    return [{"role": "user", "content": prompt}]


class SessionPins:
    """Which adapter each live conversation is on, so it never switches midway.

    A session id is chosen by the caller, so a pin is keyed by business line and session:
    another line's key reusing the id cannot move this line's conversation.
    """

    def __init__(self, ttl_s: float, capacity: int = 500_000) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._pins: OrderedDict[str, tuple[str | None, float]] = OrderedDict()

    def get(self, line: str, session: str, now: float) -> tuple[bool, str | None]:
        """(found, adapter) for ``session`` of ``line``; expired pins are not found."""
        entry = self._pins.get(f"{line}\x1f{session}")
        if entry is None or entry[1] < now:
            return False, None
        return True, entry[0]

    def set(self, line: str, session: str, adapter: str | None, now: float) -> None:
        """Pin ``session`` of ``line`` to ``adapter`` for another ``ttl_s``."""
        key = f"{line}\x1f{session}"
        self._pins[key] = (adapter, now + self.ttl_s)
        self._pins.move_to_end(key)
        if len(self._pins) > self.capacity:
            self._pins.popitem(last=False)


def pinned_route(
    table: RoutingTable, key: str, pinned: tuple[bool, str | None]
) -> tuple[str, str | None]:
    """The arm and adapter for a request: the conversation's pin while the table still has that
    adapter (a rolled-back canary is never kept), otherwise the sticky split."""
    found, adapter = pinned
    if found and (adapter is None or adapter in table.adapters):
        return arm_of(table, adapter), adapter
    return choose_arm(table, key)


@dataclass
class GatewayState:
    """Everything one replica holds between requests."""

    settings: Settings
    gateway: GatewaySettings
    store: FeedbackStore
    keys: KeyRing
    routes: RouteStore
    recorder: InteractionRecorder
    metrics: GatewayMetrics
    upstreams: Upstreams
    pins: SessionPins
    limiter: Limiter
    keys_watch: KeyFileWatch | None = None
    snapshot: RouteSnapshot = field(default_factory=lambda: RouteSnapshot({}, {}))
    routes_read_at: float = 0.0
    # When the read behind ``snapshot`` started: only a snapshot read after a replica was
    # listed may say which adapters that replica should have loaded.
    routes_started_at: float = 0.0
    base_model: str | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # Recently accepted caller idempotency keys (line-scoped) and what they were for.
    claimed_keys: OrderedDict[str, tuple[str, str]] = field(default_factory=OrderedDict)
    # Signals (request, type, content) this replica accepted lately: each counts once.
    given_signals: OrderedDict[str, None] = field(default_factory=OrderedDict)

    @property
    def lines(self) -> frozenset[str]:
        """The business lines this gateway serves (configured, or routed in the store)."""
        return frozenset(self.settings.business_lines) | self.snapshot.tables.keys()


def _reload_keys(state: GatewayState) -> None:
    """Pick up a changed key file (``flywheel gateway add-key`` needs no restart)."""
    if state.keys_watch is not None:
        state.keys = state.keys_watch.current() or KeyRing(())


async def _refresh_routes(state: GatewayState) -> None:
    """Re-read the routing tables (and a changed key file) every ``routes_refresh_s``; keep
    the last good ones when the store cannot be read."""
    failing = False
    while True:
        _reload_keys(state)
        started = time.monotonic()
        try:
            snapshot = await asyncio.to_thread(state.routes.snapshot)
        except STORE_DOWN_ERRORS as exc:
            if not failing:
                logger.warning("gateway: cannot read routes (%s); keeping the last ones", exc)
            failing = True
        else:
            failing = False
            state.snapshot = snapshot
            state.routes_read_at = time.monotonic()
            state.routes_started_at = started
            for line, revision in snapshot.revisions.items():
                state.metrics.routes_revision.labels(line).set(revision)
        await asyncio.sleep(state.gateway.routes_refresh_s)


async def _watch_replicas(state: GatewayState) -> None:
    """Every ``replica_watch_s``: a replica that lacks an adapter the routing tables name
    (it restarted, or a load failed there) gets it back from another replica's folder, so
    a restarted vLLM serves its canary and champion again without waiting for traffic or
    the canary flow's reconcile."""
    while True:
        await asyncio.sleep(state.gateway.replica_watch_s)
        listed_at = time.monotonic()
        listings = await state.upstreams.listings()
        # Judge the listing against routes read after it: an adapter the rollout routed
        # away and then unloaded is never loaded back from a stale table.
        while state.routes_started_at <= listed_at:
            await asyncio.sleep(state.gateway.routes_refresh_s)
        routed = frozenset().union(*(t.adapters for t in state.snapshot.tables.values()))
        try:
            await state.upstreams.reconcile(routed, listings)
        except Exception:  # the watch must outlive one bad round
            logger.exception("gateway: replica watch round failed")


async def _discover_base_model(state: GatewayState) -> str:
    """The base model's name on vLLM (the model without a parent in /v1/models)."""
    if state.base_model:
        return state.base_model
    try:
        listing = await state.upstreams.get_json("/v1/models")
    except UpstreamUnavailableError as exc:
        raise GatewayError(503, f"the model servers are unavailable: {exc}") from None
    models = listing.get("data", []) if isinstance(listing, dict) else []
    roots = [m["id"] for m in models if isinstance(m, dict) and not m.get("parent")]
    if not roots:
        raise GatewayError(503, "the model servers list no base model")
    state.base_model = roots[0]
    return roots[0]


def _key_of(state: GatewayState, request: Request) -> ApiKey:
    token = bearer_token(request.headers.get("authorization"))
    if token is None:
        raise GatewayError(401, "missing API key: send 'Authorization: Bearer <key>'")
    key = state.keys.authorize(token)
    if key is None:
        raise GatewayError(401, "unknown API key")
    return key


async def _json_body(state: GatewayState, request: Request) -> dict[str, Any]:
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
    return payload


def _line_for(state: GatewayState, key: ApiKey, payload: dict[str, Any]) -> str:
    line = payload.get("model")
    allowed = key.lines_among(state.lines)
    if not isinstance(line, str) or not line:
        raise GatewayError(
            400,
            f"'model' must name your business line (one of: {', '.join(allowed) or 'none'})",
            param="model",
        )
    if line not in state.lines:
        raise GatewayError(
            404,
            f"unknown business line {line[:80]!r} (yours: {', '.join(allowed) or 'none'})",
            param="model",
        )
    if not key.may_use(line):
        raise GatewayError(403, f"this key may not use the business line {line!r}", param="model")
    return line


def _check_request(
    state: GatewayState,
    key: ApiKey,
    payload: dict[str, Any],
    messages: list[dict[str, str]],
    *,
    completion_api: bool,
) -> None:
    """Refuse up front (400, the field named) what OpenAI's API would refuse, what is over
    this gateway's caps or past what the key may send, and what the store would quarantine,
    rather than answer 200 and drop the record."""
    model = CompletionRequest if completion_api else ChatRequest
    try:
        request = model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise GatewayError(400, f"{where}: {first['msg']}", param=where) from None
    problem = request_problems(
        request,
        max_output_tokens=state.gateway.max_output_tokens,
        max_choices=state.gateway.max_choices,
        server_fields=key.allow_server_fields,
    )
    if problem is not None:
        raise GatewayError(400, problem[1], param=problem[0])
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


async def _pin_from_store(state: GatewayState, line: str, session: str) -> tuple[bool, str | None]:
    """The adapter a conversation of ``line`` used last, from the store (another replica may
    have served it); not found when the store cannot say."""
    table = interactions_table
    query = (
        select(table.c.adapter_name)
        .where(table.c.business_line == line, table.c.session_id == session)
        .order_by(table.c.created_at.desc())
        .limit(1)
    )

    def lookup() -> tuple[bool, str | None]:
        with state.store.engine.connect() as connection:
            row = connection.execute(query).first()
        return (False, None) if row is None else (True, row.adapter_name)

    try:
        return await asyncio.wait_for(asyncio.to_thread(lookup), timeout=0.5)
    except (TimeoutError, *STORE_DOWN_ERRORS):
        return False, None


async def _route(
    state: GatewayState,
    table: RoutingTable,
    key: str,
    session: str | None,
    messages: list[dict[str, str]],
) -> tuple[str, str | None]:
    if session is None:
        return choose_arm(table, key)
    now = time.monotonic()
    line = table.business_line
    pinned = state.pins.get(line, session, now)
    if not pinned[0] and any(m["role"] == "assistant" for m in messages):
        pinned = await _pin_from_store(state, line, session)
    arm, adapter = pinned_route(table, key, pinned)
    state.pins.set(line, session, adapter, now)
    return arm, adapter


@dataclass(slots=True)
class _Exchange:
    """One proxied request while it is being served."""

    finished: FinishedRequest
    started: float
    adapter_label: str
    headers: dict[str, str]
    admitted: _Admission | None = None


@dataclass(slots=True)
class _Admission:
    """What a completion took from the rate limits: tokens are charged and the stream slot
    given back when it finishes."""

    tokens: list[Quota]
    streams: list[Quota]
    slot: str | None


def _limit_scopes(state: GatewayState, key: ApiKey, line: str) -> list[tuple[str, Limits | None]]:
    return [(f"key:{key.name}", key.limits), (f"line:{line}", state.keys.line_limits.get(line))]


def _too_many(verdict: Verdict) -> Response:
    assert verdict.refused is not None
    headers = verdict.headers()
    wait = headers["retry-after"]
    error = GatewayError(429, f"rate limit reached: {verdict.refused.label}; retry in {wait} s")
    return error.response(headers)


async def _check_limits(
    state: GatewayState,
    line: str,
    quotas: list[Quota],
    costs: list[float],
    streams: list[Quota] | None = None,
) -> Verdict:
    """Ask the limiter and count the outcome per line."""
    verdict = await state.limiter.admit(quotas, costs, streams or [])
    state.metrics.rate_limited.labels(line, "admitted" if verdict.allowed else "refused").inc()
    return verdict


async def _admit_completion(
    state: GatewayState, key: ApiKey, line: str
) -> tuple[_Admission | None, Verdict | None]:
    """Count a completion against its key's and line's limits: (admission, None) when it may
    go on, (None, refusal) when a limit is reached; (None, None) when nothing is limited."""
    scopes = _limit_scopes(state, key, line)
    requests = quotas_for("requests", scopes)
    tokens = quotas_for("tokens", scopes)
    streams = quotas_for("streams", scopes)
    if not (requests or tokens or streams):
        return None, None
    costs = [1.0] * len(requests) + [0.0] * len(tokens)
    verdict = await _check_limits(state, line, [*requests, *tokens], costs, streams)
    if not verdict.allowed:
        return None, verdict
    return _Admission(tokens, streams, verdict.stream_slot), verdict


async def _proxy(state: GatewayState, request: Request, *, completion_api: bool) -> Response:
    started = time.perf_counter()
    created = datetime.now(UTC)
    key = _key_of(state, request)
    payload = await _json_body(state, request)
    line = _line_for(state, key, payload)
    messages = completion_messages(payload) if completion_api else chat_messages(payload)
    _check_request(state, key, payload, messages, completion_api=completion_api)
    admitted, verdict = await _admit_completion(state, key, line)
    if verdict is not None and not verdict.allowed:
        return _too_many(verdict)
    user = _identity(payload.get("user") or request.headers.get(USER_HEADER))
    session = _identity(request.headers.get(SESSION_HEADER))
    request_id = f"req-{uuid.uuid4().hex}"
    table = state.snapshot.table(line)
    arm, adapter = await _route(state, table, user or session or request_id, session, messages)
    base_model = await _discover_base_model(state)
    parsed = parse_adapter_name(adapter) if adapter else None
    finished = FinishedRequest(
        request_id=request_id,
        business_line=line,
        base_model=base_model,
        messages=messages,
        created_at=created,
        adapter_name=adapter,
        adapter_version=parsed[1] if parsed else None,
        arm=arm,
        session_id=session,
        user_id=user,
        completion_api=completion_api,
    )
    headers = {
        REQUEST_ID_HEADER: request_id,
        ADAPTER_HEADER: adapter or base_model,
        ARM_HEADER: arm,
        LINE_HEADER: line,
        **(verdict.headers() if verdict is not None else {}),
    }
    exchange = _Exchange(finished, started, adapter or NO_ADAPTER, headers, admitted)
    payload["model"] = adapter or base_model
    path = "/v1/completions" if completion_api else "/v1/chat/completions"
    in_flight = state.metrics.in_flight.labels(line, exchange.adapter_label)
    in_flight.inc()
    missing: list[Replica] = []
    try:
        replica, upstream = await state.upstreams.post(
            path, orjson.dumps(payload), missing=missing if adapter else None
        )
    except UpstreamUnavailableError as exc:
        in_flight.dec()
        _finish(state, exchange, "error", error=str(exc), kind="upstream_unavailable")
        return GatewayError(503, "the model servers are unavailable; retry shortly").response(
            headers
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        in_flight.dec()
        _finish(state, exchange, "error", error=repr(exc), kind="upstream_failed")
        return GatewayError(502, "the model server failed before answering").response(headers)
    if missing and adapter and upstream.status != 404:
        # Some replica lacks an adapter the routes name (restarted?): load it back there.
        spawn(state.upstreams.heal(adapter, missing, replica), state.tasks)
    streaming = upstream.status == 200 and upstream.content_type == "text/event-stream"
    if not streaming:
        try:
            body = await upstream.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            _finish(state, exchange, "error", error=repr(exc), kind="upstream_failed")
            return GatewayError(502, "the model server failed while answering").response(headers)
        finally:
            upstream.release()
            in_flight.dec()
        return _answer(state, exchange, upstream.status, body)
    return StreamingResponse(
        _relay(state, exchange, upstream, in_flight),
        media_type="text/event-stream",
        headers=headers,
    )


def _answer(state: GatewayState, exchange: _Exchange, status: int, body: bytes) -> Response:
    """A non-streamed answer: vLLM's body as is (its 4xx errors too); its 5xx become 502."""
    exchange.finished.body = body
    elapsed = time.perf_counter() - exchange.started
    exchange.finished.ttft_ms = elapsed * 1000
    if status == 200:
        _finish(state, exchange, "ok")
        return Response(body, status_code=200, media_type=_JSON, headers=exchange.headers)
    error = body[:500].decode(errors="replace")
    if status == 404 and exchange.finished.adapter_name:
        _finish(state, exchange, "error", error=error, kind="adapter_missing")
        message = f"the adapter {exchange.finished.adapter_name} is not loaded on the model server"
        return GatewayError(503, message).response(exchange.headers)
    if status < 500:
        _finish(state, exchange, "error", error=error, kind="rejected_by_model_server")
        return Response(body, status_code=status, media_type=_JSON, headers=exchange.headers)
    _finish(state, exchange, "error", error=error, kind="upstream_error")
    return GatewayError(502, f"the model server failed ({status})").response(exchange.headers)


async def _relay(
    state: GatewayState,
    exchange: _Exchange,
    upstream: aiohttp.ClientResponse,
    in_flight: Any,
) -> AsyncIterator[bytes]:
    """Relay an SSE stream chunk by chunk; a broken stream ends with an SSE error event."""
    chunks: list[bytes] = []
    status, error = "ok", None
    try:
        async for chunk in upstream.content.iter_any():
            if not chunks:
                exchange.finished.ttft_ms = (time.perf_counter() - exchange.started) * 1000
            chunks.append(chunk)
            yield chunk
        if not chunks or _DONE not in b"".join(chunks[-2:]):
            status, error = "error", "the stream ended before [DONE]"
    except (aiohttp.ClientError, TimeoutError) as exc:
        status, error = "error", repr(exc)
    except (asyncio.CancelledError, GeneratorExit):
        status, error = "cancelled", "the client went away"
        raise
    finally:
        upstream.release()
        in_flight.dec()
        exchange.finished.chunks = chunks
        _finish(state, exchange, status, error=error, kind="stream_broken" if error else None)
    if status == "error":
        failure = GatewayError(502, "the model server failed mid-stream; the answer is incomplete")
        # A cut may fall inside an event: close it so the error is an event of its own.
        separator = b"" if not chunks or chunks[-1].endswith(b"\n\n") else b"\n\n"
        yield separator + b"data: " + failure.body() + b"\n\n" + _DONE + b"\n\n"


def _finish(
    state: GatewayState,
    exchange: _Exchange,
    status: str,
    *,
    error: str | None = None,
    kind: str | None = None,
) -> None:
    """Hand the finished request to the recorder and count it."""
    finished = exchange.finished
    elapsed = time.perf_counter() - exchange.started
    finished.latency_ms = elapsed * 1000
    finished.status = status
    finished.error = error
    finished.error_kind = kind if status == "error" else None
    state.recorder.record(finished)
    line, adapter = finished.business_line, exchange.adapter_label
    metrics = state.metrics
    metrics.requests.labels(line, adapter, finished.arm or "base", status).inc()
    metrics.latency.labels(line, adapter).observe(elapsed)
    if finished.ttft_ms is not None:
        metrics.ttft.labels(line, adapter).observe(finished.ttft_ms / 1000)
    if kind is not None and status != "cancelled":
        metrics.errors.labels(line, adapter, kind).inc()
    if exchange.admitted is not None:
        spawn(_settle(state, exchange.admitted, finished), state.tasks)


async def _settle(state: GatewayState, admitted: _Admission, finished: FinishedRequest) -> None:
    """Charge the tokens a finished completion used and give back its stream slot."""
    if admitted.slot is not None:
        await state.limiter.release(admitted.streams, admitted.slot)
    if admitted.tokens:
        await state.limiter.charge(admitted.tokens, used_tokens(finished))


async def _owner_of(
    state: GatewayState, request_id: str, field_name: str = "request_id"
) -> tuple[str, str | None, str | None]:
    """(business line, user, adapter) of a request, from memory or from the store. A request
    id of the gateway's own shape that is not in the store yet may have been answered by
    another replica a moment ago (its writer flushes every ``log_flush_s``): it is looked up
    again for up to ``feedback_lookup_wait_s`` before the 404."""
    recent = state.recorder.recent(request_id)
    if recent is not None:
        return recent.business_line, recent.user_id, recent.adapter_name
    table = interactions_table
    query = select(table.c.business_line, table.c.user_id, table.c.adapter_name).where(
        table.c.request_id == request_id
    )

    def lookup() -> Any:
        with state.store.engine.connect() as connection:
            return connection.execute(query).first()

    wait = state.gateway.feedback_lookup_wait_s if _OWN_REQUEST_ID.fullmatch(request_id) else 0
    deadline = time.monotonic() + wait
    while True:
        try:
            row = await asyncio.to_thread(lookup)
        except STORE_DOWN_ERRORS:
            raise GatewayError(503, "cannot look the request up right now; retry shortly") from None
        if row is not None:
            return row.business_line, row.user_id, row.adapter_name
        if time.monotonic() >= deadline:
            raise GatewayError(404, f"no request {request_id!r} is known", param=field_name)
        await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


async def _feedback(state: GatewayState, request: Request) -> Response:
    key = _key_of(state, request)
    payload = await _json_body(state, request)
    try:
        feedback = FeedbackRequest.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise GatewayError(400, f"{where}: {first['msg']}", param=where) from None
    line, user, adapter = await _owner_of(state, feedback.request_id)
    if not key.may_use(line):
        raise GatewayError(403, "this key may not give feedback on that business line")
    quotas = quotas_for("feedback", _limit_scopes(state, key, line))
    if quotas:
        verdict = await _check_limits(state, line, quotas, [1.0] * len(quotas))
        if not verdict.allowed:
            return _too_many(verdict)
    if feedback.replaced_by is not None:
        replacement_line, _, _ = await _owner_of(state, feedback.replaced_by, "replaced_by")
        if replacement_line != line:
            raise GatewayError(
                400, "replaced_by must be a request of the same business line", param="replaced_by"
            )
    idempotency_key = feedback.idempotency_key or _default_key(feedback)
    stored_key = _stored_key(line, key, feedback, idempotency_key)
    event = {
        "type": feedback.type.value,
        "request_id": feedback.request_id,
        "user_id": user,
        "edited_text": feedback.edited_text,
        "outcome": feedback.outcome.value if feedback.outcome else None,
        "replaced_by": feedback.replaced_by,
        "idempotency_key": stored_key,
        "created_at": datetime.now(UTC).isoformat(),
    }
    try:
        validate_event(
            event,
            max_text_chars=state.settings.store.max_text_chars,
            max_messages=state.settings.store.max_messages,
        )
    except InvalidEventError as exc:
        raise GatewayError(400, exc.reason, param=exc.field) from None
    replay = False
    if feedback.idempotency_key is not None:
        replay = await _claim_key(state, stored_key, feedback)
    accepted = FeedbackAccepted(
        request_id=feedback.request_id, type=feedback.type, idempotency_key=idempotency_key
    )
    if replay:
        # The same key for the same signal again: the first answer, nothing stored twice.
        return Response(accepted.model_dump_json().encode(), status_code=202, media_type=_JSON)
    signal = _default_key(feedback)
    if await _already_given(state, signal, feedback):
        # The same signal on the same answer (a double click, a flood under fresh keys):
        # it counts once, and the caller is told so instead of a 202 for a copy.
        duplicate = {
            "status": "duplicate",
            "request_id": feedback.request_id,
            "type": feedback.type.value,
            "idempotency_key": idempotency_key,
        }
        return Response(orjson.dumps(duplicate), status_code=200, media_type=_JSON)
    state.recorder.record_feedback(event)
    state.given_signals[signal] = None
    if len(state.given_signals) > CLAIMED_KEYS:
        state.given_signals.popitem(last=False)
    state.metrics.feedback.labels(line, adapter or NO_ADAPTER, feedback.type.value).inc()
    return Response(accepted.model_dump_json().encode(), status_code=202, media_type=_JSON)


def _stored_key(line: str, key: ApiKey, feedback: FeedbackRequest, idempotency_key: str) -> str:
    """The idempotency key as stored: a caller's own key lives in the namespace of its line
    and API key (another tenant cannot pre-empt it); the default one names the request."""
    if feedback.idempotency_key is None:
        return idempotency_key  # gw:<request id>:...: the request id already names the line
    holder = hashlib.sha256(key.name.encode()).hexdigest()[:8]
    return f"{line}:{holder}:{idempotency_key}"


async def _claim_key(state: GatewayState, stored: str, feedback: FeedbackRequest) -> bool:
    """Refuse (409) a caller's key reused for another request or signal: otherwise it would
    be a 202 whose event the store then drops as a duplicate. True when the key was already
    claimed for this very signal (a replay)."""
    claim = (feedback.request_id, feedback.type.value)
    held = state.claimed_keys.get(stored)
    if held is None:
        table = feedback_table
        query = select(table.c.request_id, table.c.type).where(table.c.idempotency_key == stored)

        def lookup() -> Any:
            with state.store.engine.connect() as connection:
                return connection.execute(query).first()

        try:
            row = await asyncio.to_thread(lookup)
        except STORE_DOWN_ERRORS:
            row = None  # the store's unique key still keeps the first; say 202 as before
        held = (row.request_id, row.type) if row is not None else None
    if held is not None and held != claim:
        given = feedback.idempotency_key
        raise GatewayError(
            409,
            f"idempotency_key {given!r} was already used for {held[1]} on request {held[0]}",
            param="idempotency_key",
        )
    state.claimed_keys[stored] = claim
    state.claimed_keys.move_to_end(stored)
    if len(state.claimed_keys) > CLAIMED_KEYS:
        state.claimed_keys.popitem(last=False)
    return held is not None


async def _already_given(state: GatewayState, signal: str, feedback: FeedbackRequest) -> bool:
    """Whether this signal (type and content) was already given on this answer, by this
    replica lately or by any replica in the store."""
    if signal in state.given_signals:
        return True
    table = feedback_table
    query = select(table.c.edited_text, table.c.outcome, table.c.replaced_by).where(
        table.c.request_id == feedback.request_id, table.c.type == feedback.type.value
    )

    def lookup() -> list[Any]:
        with state.store.engine.connect() as connection:
            return list(connection.execute(query).all())

    try:
        rows = await asyncio.wait_for(asyncio.to_thread(lookup), timeout=0.5)
    except (TimeoutError, *STORE_DOWN_ERRORS):
        return False  # the spool replays it; the store's unique key still holds
    outcome = feedback.outcome.value if feedback.outcome else None
    given = (feedback.edited_text, outcome, feedback.replaced_by)
    return any((r.edited_text, r.outcome, r.replaced_by) == given for r in rows)


def _default_key(feedback: FeedbackRequest) -> str:
    """One event per request and type, unless the content differs (a second, different edit)."""
    detail = feedback.edited_text or feedback.replaced_by or ""
    suffix = hashlib.sha256(detail.encode()).hexdigest()[:16] if detail else "1"
    return f"gw:{feedback.request_id}:{feedback.type.value}:{suffix}"


_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "integer"},
            },
        }
    },
}


def _documented(
    schema: dict[str, Any], statuses: tuple[int, ...], *, duplicate: bool = False
) -> dict[str, Any]:
    error = {"content": {_JSON: {"schema": _ERROR_SCHEMA}}}
    responses: dict[str, Any] = {
        str(status): {"description": GatewayError.KINDS.get(status, "error"), **error}
        for status in statuses
    }
    if duplicate:
        responses["200"] = {
            "description": "The same signal on this answer was given already: counted once.",
            "content": {
                _JSON: {
                    "schema": {
                        "type": "object",
                        "properties": {
                            "status": {"type": "string", "enum": ["duplicate"]},
                            "request_id": {"type": "string"},
                            "type": {"type": "string"},
                            "idempotency_key": {"type": "string"},
                        },
                    }
                }
            },
        }
    return {
        "requestBody": {"required": True, "content": {_JSON: {"schema": schema}}},
        "responses": responses,
    }


def create_app(
    settings: Settings,
    gateway: GatewaySettings,
    *,
    store: FeedbackStore | None = None,
    keys: KeyRing | None = None,
) -> FastAPI:
    """The gateway application (one replica); resources open on startup, close on shutdown."""
    withhold_tracebacks()
    own_store = store is None
    feedback_store = store or FeedbackStore.open(settings)
    keys_watch: KeyFileWatch | None = None
    if keys is None:
        keys_watch = KeyFileWatch(gateway.resolved_keys_file(settings.home))
        keys = keys_watch.current() or KeyRing(())
    state = GatewayState(
        settings=settings,
        gateway=gateway,
        store=feedback_store,
        keys=keys,
        keys_watch=keys_watch,
        routes=RouteStore(feedback_store.engine),
        recorder=InteractionRecorder(
            feedback_store,
            gateway.resolved_spool_dir(settings.home),
            batch_size=gateway.log_batch_size,
            flush_s=gateway.log_flush_s,
            retry_s=gateway.spool_retry_s,
            regenerate_window_s=gateway.regenerate_window_s,
            orphan_grace_s=gateway.orphan_grace_s,
        ),
        metrics=GatewayMetrics(),
        upstreams=Upstreams(
            gateway.upstreams,
            connect_timeout_s=gateway.connect_timeout_s,
            read_timeout_s=gateway.read_timeout_s,
        ),
        pins=SessionPins(gateway.session_pin_ttl_s),
        limiter=build_limiter(
            settings.redis_url.get_secret_value() if settings.redis_url else None,
            gateway.rate_window_s,
            gateway.read_timeout_s,
            gateway.rate_limit_namespace,
        ),
        base_model=gateway.base_model_name,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await state.upstreams.start()
        state.recorder.start()
        try:
            state.snapshot = await asyncio.to_thread(state.routes.snapshot)
            state.routes_read_at = time.monotonic()
        except STORE_DOWN_ERRORS as exc:
            logger.warning("gateway: no routes at start (%s): serving base models", exc)
        state.tasks.append(asyncio.create_task(_refresh_routes(state)))
        if state.gateway.replica_watch_s > 0:
            state.tasks.append(asyncio.create_task(_watch_replicas(state)))
        with contextlib.suppress(GatewayError):
            await _discover_base_model(state)
        try:
            yield
        finally:
            for task in state.tasks:
                task.cancel()
            await asyncio.gather(*state.tasks, return_exceptions=True)
            await state.upstreams.close()
            await state.limiter.close()
            await asyncio.to_thread(state.recorder.close)
            if own_store:
                feedback_store.close()

    app = FastAPI(
        title="flywheel gateway",
        version="1",
        description="OpenAI-compatible proxy: name your business line as `model`.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.gateway = state
    _add_routes(app, state)
    return app


def _add_routes(app: FastAPI, state: GatewayState) -> None:
    """The gateway's routes, error handlers and OpenAPI document."""

    @app.exception_handler(GatewayError)
    async def _refused(_request: Request, exc: GatewayError) -> Response:
        state.metrics.rejected.labels(str(exc.status)).inc()
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> Response:
        return GatewayError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        # Its message may quote a prompt: the type and the place are enough to find it.
        where = where_it_failed(exc.__traceback__, type(exc))
        logger.error("gateway: unexpected error on %s: %s", request.url.path, where)
        return GatewayError(500, "internal error in the gateway").response()

    errors = (400, 401, 403, 404, 408, 413, 429, 502, 503)

    @app.post(
        "/v1/chat/completions",
        openapi_extra=_documented({"$ref": "#/components/schemas/ChatRequest"}, errors),
        summary="Chat completion for your business line (SSE when stream is true)",
    )
    async def chat_completions(request: Request) -> Response:
        return await _proxy(state, request, completion_api=False)

    @app.post(
        "/v1/completions",
        openapi_extra=_documented({"$ref": "#/components/schemas/CompletionRequest"}, errors),
        summary="Text completion for your business line (SSE when stream is true)",
    )
    async def completions(request: Request) -> Response:
        return await _proxy(state, request, completion_api=True)

    @app.post(
        "/v1/feedback",
        status_code=202,
        response_model=FeedbackAccepted,
        openapi_extra=_documented(
            {"$ref": "#/components/schemas/FeedbackRequest"},
            (400, 401, 403, 404, 408, 409, 413, 429, 503),
            duplicate=True,
        ),
        summary="Thumbs, edit, abandon, task outcome or regenerate for an answer",
    )
    async def feedback(request: Request) -> Response:
        return await _feedback(state, request)

    @app.get("/v1/models", summary="The business lines your key may use")
    async def models(request: Request) -> Response:
        key = _key_of(state, request)
        data = [
            {"id": line, "object": "model", "owned_by": "flywheel"}
            for line in key.lines_among(state.lines)
        ]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type=_JSON)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        stats = state.recorder.stats
        state.metrics.store_up.set(1 if stats.store_up else 0)
        state.metrics.spooled.set(await asyncio.to_thread(state.recorder.spool.records))
        if state.routes_read_at:
            state.metrics.routes_age.set(time.monotonic() - state.routes_read_at)
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", summary="Liveness, store and routes freshness")
    async def healthz() -> Response:
        age = time.monotonic() - state.routes_read_at if state.routes_read_at else None
        body = {
            "status": "ok",
            "store_up": state.recorder.stats.store_up,
            "routes_age_s": age,
            # Per line, the routing revision this replica serves (compare with the store's).
            "routes_revisions": state.snapshot.revisions,
            "base_model": state.base_model,
        }
        return Response(orjson.dumps(body), media_type=_JSON)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (FeedbackRequest, ChatRequest, CompletionRequest):
                extra = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(extra.pop("$defs", {}))
                components[model.__name__] = extra
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def app_from_env() -> FastAPI:
    """The gateway configured from the environment (``flywheel serve gateway`` serves it,
    with the header guards of :mod:`flywheel.http_guard`)."""
    from flywheel.settings import load_settings

    return create_app(load_settings(), GatewaySettings())
