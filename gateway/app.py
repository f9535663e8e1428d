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
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from feedback.events import stored_identity as identity
from feedback.store import FeedbackStore
from flywheel.http_guard import where_it_failed, withhold_tracebacks
from flywheel.settings import Settings
from flywheel.settings.gateway import GatewaySettings
from gateway.api_docs import docs_page
from gateway.feedback_api import receive_feedback
from gateway.intake import check_request, json_body, key_of, line_for, operator_key
from gateway.keys import KeyFileWatch, KeyRing
from gateway.limiting import (
    Admission,
    admit_completion,
    settle,
    too_many,
)
from gateway.limits import build_limiter
from gateway.logs import REQUEST_CONTEXT, RequestContext, configure_gateway_logging
from gateway.metrics import CONTENT_TYPE_LATEST, NO_ADAPTER, GatewayMetrics
from gateway.recorder import (
    STORE_DOWN_ERRORS,
    FinishedRequest,
    InteractionRecorder,
)
from gateway.sessions import SessionPins, route_request
from gateway.shadow import maybe_shadow
from gateway.state import GatewayState
from gateway.streaming import (
    BrokenStreamError,
    StreamRewriter,
    UpstreamMode,
    assemble,
    upstream_mode,
    upstream_payload,
    with_answer_id,
)
from gateway.upstream import Replica, Upstreams, UpstreamUnavailableError, spawn
from gateway.wire import (
    JSON_TYPE,
    LINE_HEADER,
    REQUEST_ID_HEADER,
    SESSION_HEADER,
    USER_HEADER,
    ChatRequest,
    CompletionRequest,
    FeedbackAccepted,
    FeedbackRequest,
    GatewayError,
    chat_messages,
    completion_messages,
    documented,
)
from registry.routes import RouteStore
from registry.routing import parse_adapter_name

logger = logging.getLogger(__name__)

_DONE = b"data: [DONE]"


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
    and place there (it restarted, or a load failed there) gets it back from another
    replica's folder, so a restarted vLLM serves its canary and champion again without
    waiting for traffic or the canary flow's reconcile."""
    while True:
        await asyncio.sleep(state.gateway.replica_watch_s)
        listed_at = time.monotonic()
        listings = await state.upstreams.listings()
        # Judge the listing against routes read after it: an adapter the rollout routed
        # away and then unloaded is never loaded back from a stale table.
        while state.routes_started_at <= listed_at:
            await asyncio.sleep(state.gateway.routes_refresh_s)
        tables = state.snapshot.tables.values()
        routed = frozenset().union(*(t.adapters for t in tables))
        placement = {adapter: t.replicas for t in tables for adapter in t.adapters}
        try:
            await state.upstreams.reconcile(routed, listings, placement)
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


@dataclass(slots=True)
class _Exchange:
    """One proxied request while it is being served: what it holds (its admission, its
    place in the in-flight gauge and count) is given back by :func:`_finish`, once."""

    finished: FinishedRequest
    started: float
    adapter_label: str
    headers: dict[str, str]
    # The caller's request as sent to vLLM (model = the adapter), before any streaming
    # change the gateway makes to time it.
    payload: dict[str, Any]
    admitted: Admission | None = None
    done: bool = False


async def _proxy(state: GatewayState, request: Request, *, completion_api: bool) -> Response:
    started = time.perf_counter()
    created = datetime.now(UTC)
    key = key_of(state, request)
    payload = await json_body(state, request)
    line = line_for(state, key, payload)
    messages = completion_messages(payload) if completion_api else chat_messages(payload)
    check_request(state, key, line, payload, messages, completion_api=completion_api)
    admitted, verdict = await admit_completion(state, key, line)
    if verdict is not None and not verdict.allowed:
        return too_many(verdict)
    exchange: _Exchange | None = None
    response: Response | None = None
    status, kind = "error", "gateway_failed"
    try:
        user = identity(payload.get("user") or request.headers.get(USER_HEADER))
        session = identity(request.headers.get(SESSION_HEADER))
        request_id = f"req-{uuid.uuid4().hex}"
        table = state.snapshot.table(line)
        arm, adapter = await route_request(
            state, table, user or session or request_id, session, messages
        )
        REQUEST_CONTEXT.set(RequestContext(line, adapter, request_id))
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
            key_name=key.name,
            completion_api=completion_api,
        )
        # No arm and no adapter name: they would tell a caller which users are the
        # canary's (the answer's model is the line too, gateway.streaming).
        headers = {
            REQUEST_ID_HEADER: request_id,
            LINE_HEADER: line,
            **(verdict.headers() if verdict is not None else {}),
        }
        payload["model"] = adapter or base_model
        label = adapter or NO_ADAPTER
        exchange = _Exchange(finished, started, label, headers, payload, admitted)
        state.metrics.in_flight.labels(line, label).inc()
        state.requests_in_flight += 1
        response = await _forward(state, exchange, table.replicas, completion_api)
        return response
    except asyncio.CancelledError:
        status, kind = "cancelled", "cancelled"
        raise
    finally:
        # Whatever ended the request (an answer, a refusal, an exception, a cancel), what it
        # took is given back here; a relayed stream gives it back when the stream ends.
        if exchange is None:
            if admitted is not None:
                spawn(settle(state, admitted, None), state.tasks)
        elif not isinstance(response, _RelayedStream):
            _finish(state, exchange, status, error="the gateway failed to serve it", kind=kind)


async def _forward(
    state: GatewayState,
    exchange: _Exchange,
    placement: tuple[str, ...] | None,
    completion_api: bool,
) -> Response:
    """Send the request to vLLM and answer the caller from its response."""
    payload, adapter = exchange.payload, exchange.finished.adapter_name
    mode = upstream_mode(payload, completion_api=completion_api, enabled=state.gateway.time_answers)
    path = "/v1/completions" if completion_api else "/v1/chat/completions"
    missing: list[Replica] = []
    try:
        replica, upstream = await state.upstreams.post(
            path,
            orjson.dumps(upstream_payload(payload, mode)),
            missing=missing if adapter else None,
            placement=placement,
            adapter=adapter,
        )
    except UpstreamUnavailableError as exc:
        _finish(state, exchange, "error", error=str(exc), kind="upstream_unavailable")
        return GatewayError(503, "the model servers are unavailable; retry shortly").response(
            exchange.headers
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        _finish(state, exchange, "error", error=repr(exc), kind="upstream_failed")
        failure = GatewayError(502, "the model server failed before answering")
        return failure.response(exchange.headers)
    if missing and adapter and upstream.status != 404:
        # Some replica lacks an adapter the routes name (restarted?): load it back there.
        spawn(state.upstreams.heal(adapter, missing, replica), state.tasks)
    return await _respond(state, exchange, upstream, mode, completion_api)


async def _respond(
    state: GatewayState,
    exchange: _Exchange,
    upstream: aiohttp.ClientResponse,
    mode: UpstreamMode,
    completion_api: bool,
) -> Response:
    """The caller's answer from vLLM's response: relayed as a stream, rebuilt from one, or
    as vLLM gave it (a plain answer, or an error)."""
    streaming = upstream.status == 200 and upstream.content_type == "text/event-stream"
    if not streaming:
        try:
            body = await upstream.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            _finish(state, exchange, "error", error=repr(exc), kind="upstream_failed")
            failure = GatewayError(502, "the model server failed while answering")
            return failure.response(exchange.headers)
        finally:
            upstream.release()
        return _answer(state, exchange, upstream.status, body)
    if mode is UpstreamMode.ASSEMBLE:
        return await _assembled(state, exchange, upstream, completion_api)
    return _RelayedStream(state, exchange, upstream, strip_usage=mode.strips_usage)


async def _assembled(
    state: GatewayState,
    exchange: _Exchange,
    upstream: aiohttp.ClientResponse,
    completion_api: bool,
) -> Response:
    """A plain answer the gateway asked vLLM to stream (to time its first token), rebuilt."""
    chunks: list[bytes] = []
    try:
        async for chunk in upstream.content.iter_any():
            if not chunks:
                exchange.finished.ttft_ms = (time.perf_counter() - exchange.started) * 1000
            chunks.append(chunk)
        body = assemble(b"".join(chunks), completion_api=completion_api)
    except (aiohttp.ClientError, TimeoutError) as exc:
        exchange.finished.chunks = chunks
        _finish(state, exchange, "error", error=repr(exc), kind="upstream_failed")
        return GatewayError(502, "the model server failed while answering").response(
            exchange.headers
        )
    except BrokenStreamError as exc:
        exchange.finished.chunks = chunks
        _finish(state, exchange, "error", error=str(exc), kind="stream_broken")
        return GatewayError(502, "the model server failed while answering").response(
            exchange.headers
        )
    finally:
        upstream.release()
    return _answer(state, exchange, 200, body, timed=True)


def _answer(
    state: GatewayState, exchange: _Exchange, status: int, body: bytes, *, timed: bool = False
) -> Response:
    """A non-streamed answer: vLLM's body with the request id as its ``id`` (its 4xx errors
    as they are); its 5xx become 502. Its TTFT stays unknown unless it was streamed from
    vLLM and rebuilt (``timed``)."""
    exchange.finished.body = body
    if not timed:
        exchange.finished.ttft_ms = None
    if status == 200:
        _finish(state, exchange, "ok")
        finished = exchange.finished
        answer = with_answer_id(body, finished.request_id, model=finished.business_line)
        return Response(answer, status_code=200, media_type=JSON_TYPE, headers=exchange.headers)
    error = body[:500].decode(errors="replace")
    if status == 404 and exchange.finished.adapter_name:
        _finish(state, exchange, "error", error=error, kind="adapter_missing")
        message = "the line's model is not loaded on the model server; retry shortly"
        return GatewayError(503, message).response(exchange.headers)
    if status < 500:
        _finish(state, exchange, "error", error=error, kind="rejected_by_model_server")
        if adapter := exchange.finished.adapter_name:  # vLLM's message may name it
            body = body.replace(adapter.encode(), exchange.finished.business_line.encode())
        return Response(body, status_code=status, media_type=JSON_TYPE, headers=exchange.headers)
    _finish(state, exchange, "error", error=error, kind="upstream_error")
    return GatewayError(502, f"the model server failed ({status})").response(exchange.headers)


class _RelayedStream(StreamingResponse):
    """vLLM's SSE stream relayed to the caller; the exchange is finished when the stream
    ends, and at the latest when sending ends, even if the body was never started (the
    caller left before its first byte)."""

    def __init__(
        self,
        state: GatewayState,
        exchange: _Exchange,
        upstream: aiohttp.ClientResponse,
        *,
        strip_usage: bool,
    ) -> None:
        relay = _relay(state, exchange, upstream, strip_usage=strip_usage)
        super().__init__(relay, media_type="text/event-stream", headers=exchange.headers)
        self._relay = relay
        self._state, self._exchange, self._upstream = state, exchange, upstream

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._relay.aclose()
            finally:
                if not self._exchange.done:
                    self._upstream.release()
                    _finish(self._state, self._exchange, "cancelled", error="the client left")


async def _relay(
    state: GatewayState,
    exchange: _Exchange,
    upstream: aiohttp.ClientResponse,
    *,
    strip_usage: bool = False,
) -> AsyncGenerator[bytes, None]:
    """Relay an SSE stream event by event, each chunk's id the request id (without vLLM's
    usage event when ``strip_usage``: the gateway asked for it, the caller did not); a
    broken stream ends with an SSE error event."""
    chunks: list[bytes] = []
    finished = exchange.finished
    rewriter = StreamRewriter(
        finished.request_id, strip_usage=strip_usage, model=finished.business_line
    )
    status, error = "ok", None
    try:
        async for chunk in upstream.content.iter_any():
            if not chunks:
                exchange.finished.ttft_ms = (time.perf_counter() - exchange.started) * 1000
            chunks.append(chunk)
            if relayed := rewriter.feed(chunk):
                yield relayed
        if not chunks or _DONE not in b"".join(chunks[-2:]):
            status, error = "error", "the stream ended before [DONE]"
        elif rest := rewriter.flush():
            yield rest
    except (aiohttp.ClientError, TimeoutError) as exc:
        status, error = "error", repr(exc)
    except (asyncio.CancelledError, GeneratorExit):
        status, error = "cancelled", "the client went away"
        raise
    finally:
        upstream.release()
        exchange.finished.chunks = chunks
        _finish(state, exchange, status, error=error, kind="stream_broken" if error else None)
    if status == "error":
        failure = GatewayError(502, "the model server failed mid-stream; the answer is incomplete")
        # Only whole events were relayed (a cut event's start is dropped): the error is an
        # event of its own.
        yield b"data: " + failure.body() + b"\n\n" + _DONE + b"\n\n"


def _finish(
    state: GatewayState,
    exchange: _Exchange,
    status: str,
    *,
    error: str | None = None,
    kind: str | None = None,
) -> None:
    """Give back what the request held (its admission, the in-flight gauge and count), then
    hand it to the recorder and count it; once per request, whichever path ends it first."""
    if exchange.done:
        return
    exchange.done = True
    finished = exchange.finished
    line, adapter = finished.business_line, exchange.adapter_label
    metrics = state.metrics
    metrics.in_flight.labels(line, adapter).dec()
    state.requests_in_flight -= 1
    elapsed = time.perf_counter() - exchange.started
    finished.latency_ms = elapsed * 1000
    finished.status = status
    finished.error = error
    finished.error_kind = kind if status == "error" else None
    if exchange.admitted is not None:
        spawn(settle(state, exchange.admitted, finished), state.tasks)
    state.recorder.record(finished)
    maybe_shadow(state, finished, exchange.payload)
    metrics.requests.labels(line, adapter, finished.arm or "base", status).inc()
    metrics.latency.labels(line, adapter).observe(elapsed)
    if finished.ttft_ms is not None:
        metrics.ttft.labels(line, adapter).observe(finished.ttft_ms / 1000)
    if kind is not None and status != "cancelled":
        metrics.errors.labels(line, adapter, kind).inc()


def create_app(
    settings: Settings,
    gateway: GatewaySettings,
    *,
    store: FeedbackStore,
    routes: RouteStore,
    keys: KeyRing | None = None,
    redis: Any = None,
    on_shutdown: Callable[[], None] | None = None,
) -> FastAPI:
    """The gateway application (one replica) over the clients it is handed: the store, its
    routing tables and, for rate limits every replica shares, an asynchronous Redis client
    (None: this process counts alone). Background work starts on startup and stops on
    shutdown, then ``on_shutdown`` runs (``composition.servers`` closes its clients)."""
    withhold_tracebacks()
    configure_gateway_logging()
    feedback_store = store
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
        routes=routes,
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
            redis, gateway.rate_window_s, gateway.read_timeout_s, gateway.rate_limit_namespace
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
        # Each replica's context length, for the output cap (re-read by the replica watch).
        await state.upstreams.listings()
        try:
            yield
        finally:
            for task in state.tasks:
                task.cancel()
            await asyncio.gather(*state.tasks, return_exceptions=True)
            await state.upstreams.close()
            await state.limiter.close()
            state.metrics.worker_exited()
            await asyncio.to_thread(state.recorder.close)
            if on_shutdown is not None:
                on_shutdown()

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

    errors = (400, 401, 404, 408, 413, 429, 502, 503)

    @app.post(
        "/v1/chat/completions",
        openapi_extra=documented({"$ref": "#/components/schemas/ChatRequest"}, errors),
        summary="Chat completion for your business line (SSE when stream is true)",
    )
    async def chat_completions(request: Request) -> Response:
        return await _proxy(state, request, completion_api=False)

    @app.post(
        "/v1/completions",
        openapi_extra=documented({"$ref": "#/components/schemas/CompletionRequest"}, errors),
        summary="Text completion for your business line (SSE when stream is true)",
    )
    async def completions(request: Request) -> Response:
        return await _proxy(state, request, completion_api=True)

    @app.post(
        "/v1/feedback",
        status_code=202,
        response_model=FeedbackAccepted,
        openapi_extra=documented(
            {"$ref": "#/components/schemas/FeedbackRequest"},
            (400, 401, 404, 408, 409, 413, 429, 503),
            duplicate=True,
        ),
        summary="Thumbs, edit, abandon, task outcome or regenerate for an answer",
    )
    async def feedback(request: Request) -> Response:
        return await receive_feedback(state, request)

    @app.get("/v1/models", summary="The business lines your key may use")
    async def models(request: Request) -> Response:
        key = key_of(state, request)
        data = [
            {"id": line, "object": "model", "owned_by": "flywheel"}
            for line in key.lines_among(state.lines)
        ]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type=JSON_TYPE)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        return HTMLResponse(docs_page(app.openapi()))

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        operator_key(state, request)
        stats = state.recorder.stats
        state.metrics.store_up.set(1 if stats.store_up else 0)
        state.metrics.spooled.set(await asyncio.to_thread(state.recorder.spool.records))
        if state.routes_read_at:
            state.metrics.routes_age.set(time.monotonic() - state.routes_read_at)
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get(
        "/healthz",
        summary="Liveness, store and routes freshness; with an operator key, each line's "
        "routing revision and the base model",
    )
    async def healthz(request: Request) -> Response:
        age = time.monotonic() - state.routes_read_at if state.routes_read_at else None
        body: dict[str, Any] = {
            "status": "ok",
            "store_up": state.recorder.stats.store_up,
            "routes_age_s": age,
        }
        if request.headers.get("authorization") is not None:
            operator_key(state, request)
            # Per line, the routing revision this replica serves (compare with the store's).
            body["routes_revisions"] = state.snapshot.revisions
            body["base_model"] = state.base_model
        return Response(orjson.dumps(body), media_type=JSON_TYPE)

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
