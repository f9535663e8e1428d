"""``POST /v1/feedback``: a signal on an answer, scoped by the answer's business line and
the caller's key, counted once per answer and signal, handed to the recorder."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError

from feedback.events import (
    FeedbackType,
    InvalidEventError,
    validate_event,
)
from gateway.intake import json_body, key_of
from gateway.keys import ApiKey
from gateway.limiting import (
    check_limits,
    limit_scopes,
    too_many,
)
from gateway.limits import quotas_for
from gateway.logs import REQUEST_CONTEXT, RequestContext
from gateway.metrics import NO_ADAPTER
from gateway.recorder import STORE_DOWN_ERRORS
from gateway.state import GatewayState
from gateway.wire import (
    JSON_TYPE,
    FeedbackAccepted,
    FeedbackRequest,
    GatewayError,
)

CLAIMED_KEYS = 100_000


_OWN_REQUEST_ID = re.compile(r"req-[0-9a-f]{32}")


async def _owner_of(
    state: GatewayState, key: ApiKey, request_id: str, field_name: str = "request_id"
) -> tuple[str, str | None, str | None]:
    """(business line, user, adapter) of a request ``key`` may give feedback on, from memory
    or from the store. A request id of the gateway's own shape that is not in the store yet
    may have been answered by another replica a moment ago (its writer flushes every
    ``log_flush_s``): it is looked up again for up to ``feedback_lookup_wait_s`` before the
    404. A request of a line the key may not use gets that same 404 after the same wait:
    "not yours" and "not there" answer alike, so a key learns nothing of other tenants."""
    wait = state.gateway.feedback_lookup_wait_s if _OWN_REQUEST_ID.fullmatch(request_id) else 0
    deadline = time.monotonic() + wait
    owner: tuple[str, str | None, str | None] | None = None
    if (recent := state.recorder.recent(request_id)) is not None:
        owner = recent.business_line, recent.user_id, recent.adapter_name
    while owner is None:
        try:
            owner = await asyncio.to_thread(state.store.request_owner, request_id)
        except STORE_DOWN_ERRORS:
            raise GatewayError(503, "cannot look the request up right now; retry shortly") from None
        if owner is None:
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    if owner is not None and key.may_use(owner[0]):
        return owner
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
    raise GatewayError(404, f"no request {request_id!r} is known", param=field_name)


async def receive_feedback(state: GatewayState, request: Request) -> Response:
    """Check, scope and queue one feedback event: 202 accepted, 200 duplicate, or a 4xx."""
    key = key_of(state, request)
    payload = await json_body(state, request)
    try:
        feedback = FeedbackRequest.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise GatewayError(400, f"{where}: {first['msg']}", param=where) from None
    line, user, adapter = await _owner_of(state, key, feedback.request_id)
    REQUEST_CONTEXT.set(RequestContext(line, adapter, feedback.request_id))
    quotas = quotas_for("feedback", limit_scopes(state, key, line))
    if quotas:
        verdict = await check_limits(state, line, quotas, [1.0] * len(quotas))
        if not verdict.allowed:
            return too_many(verdict)
    if feedback.replaced_by is not None:
        replacement_line, _, _ = await _owner_of(state, key, feedback.replaced_by, "replaced_by")
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
        return Response(accepted.model_dump_json().encode(), status_code=202, media_type=JSON_TYPE)
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
        return Response(orjson.dumps(duplicate), status_code=200, media_type=JSON_TYPE)
    state.recorder.record_feedback(event)
    if feedback.type is FeedbackType.EDIT:
        _remember(state.live_edits, feedback.request_id, signal)
    else:
        _remember(state.given_signals, signal, None)
    state.metrics.feedback.labels(line, adapter or NO_ADAPTER, feedback.type.value).inc()
    return Response(accepted.model_dump_json().encode(), status_code=202, media_type=JSON_TYPE)


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
        try:
            held = await asyncio.to_thread(state.store.feedback_claim, stored)
        except STORE_DOWN_ERRORS:
            held = None  # the store's unique key still keeps the first; say 202 as before
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


def _remember(memory: OrderedDict[str, Any], key: str, value: Any) -> None:
    memory[key] = value
    memory.move_to_end(key)
    if len(memory) > CLAIMED_KEYS:
        memory.popitem(last=False)


async def _already_given(state: GatewayState, signal: str, feedback: FeedbackRequest) -> bool:
    """Whether this signal (type and content) was already given on this answer, by this
    replica lately or by any replica in the store. An edit is a duplicate only of the live
    edit: a user's newer edit replaces the older one (the store keeps one per answer and
    user), so going back to an earlier text is a change, not a copy."""
    if feedback.type is FeedbackType.EDIT:
        live = state.live_edits.get(feedback.request_id)
        if live is not None:
            return live == signal
    elif signal in state.given_signals:
        return True
    lookup = asyncio.to_thread(state.store.signals_on, feedback.request_id, feedback.type.value)
    try:
        stored = await asyncio.wait_for(lookup, timeout=0.5)
    except (TimeoutError, *STORE_DOWN_ERRORS):
        return False  # the spool replays it; the store's unique key still holds
    outcome = feedback.outcome.value if feedback.outcome else None
    return (feedback.edited_text, outcome, feedback.replaced_by) in stored


def _default_key(feedback: FeedbackRequest) -> str:
    """One event per request and type, unless the content differs (a second, different edit)."""
    detail = feedback.edited_text or feedback.replaced_by or ""
    suffix = hashlib.sha256(detail.encode()).hexdigest()[:16] if detail else "1"
    return f"gw:{feedback.request_id}:{feedback.type.value}:{suffix}"
