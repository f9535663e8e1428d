"""Shadow mirroring: a sampled share of a line's requests answered again by its shadow adapter.

A request that the line's champion (or the base model, on a line without one)
answered well is, for a stable share of request ids, sent once more to vLLM
under the shadow adapter's name once the user's answer is complete. The shadow's
answer is stored beside the interaction it shadowed (same request id: its
lineage) and is never returned to anyone. The user pays nothing for it: the
mirror is started from the request's finish as a background task, is not charged
to the caller's rate limits, and is no arm of the canary (canary requests are
never mirrored, and shadow answers live in their own table).

Its cost is capped twice: by the line's share (``shadow_fraction`` of the
routing table) and by the shadow requests in flight on this process
(``shadow_max_concurrency``); a sampled request beyond the cap is skipped and
counted, never queued, so a slow shadow adapter cannot pile up work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from feedback.answers import output_tokens
from gateway.recorder import SHADOW_OUTPUT, FinishedRequest, answer_text
from gateway.upstream import Replica, UpstreamUnavailableError, spawn
from registry.names import parse_adapter_name
from registry.routing import RoutingTable, split_point

if TYPE_CHECKING:
    from gateway.state import GatewayState

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ShadowTraffic:
    """This process's shadow requests: how many are in flight, which failures were logged."""

    in_flight: int = 0
    logged: set[tuple[str, str]] = field(default_factory=set)


def shadow_point(request_id: str, shadow: str) -> float:
    """A stable point of [0, 1) for a request under a shadow adapter (sampled below the share);
    salted apart from the canary's user split."""
    return split_point(request_id, f"shadow\x1f{shadow}")


def shadow_for(table: RoutingTable, finished: FinishedRequest) -> str | None:
    """The shadow adapter that should answer ``finished`` again, or None: only a request that
    ended well on the line's champion (the base model when the line has none), never the
    canary's or a conversation pinned elsewhere, and only the sampled share of request ids."""
    shadow = table.shadow
    if shadow is None or table.shadow_fraction <= 0 or finished.status != "ok":
        return None
    if finished.arm == "canary" or finished.adapter_name != table.champion:
        return None
    if shadow_point(finished.request_id, shadow) >= table.shadow_fraction:
        return None
    return shadow


def shadow_body(payload: dict[str, Any], adapter: str) -> bytes:
    """The request body the shadow answers: the caller's request under ``adapter``, one
    non-streamed choice."""
    body = {**payload, "model": adapter, "stream": False, "n": 1}
    for unwanted in ("stream_options", "best_of"):
        body.pop(unwanted, None)
    return orjson.dumps(body)


def shadow_output_event(
    finished: FinishedRequest,
    adapter: str,
    *,
    status: str,
    latency_ms: float,
    answer: bytes | None = None,
    error: str | None = None,
    created_at: datetime | None = None,
) -> dict[str, Any]:
    """The record the recorder stores for one shadow answer to ``finished``."""
    text, usage = "", None
    if answer is not None and status == "ok":
        text, usage = answer_text(dataclasses.replace(finished, body=answer, chunks=None))
    parsed = parse_adapter_name(adapter)
    metadata: dict[str, Any] = {}
    if usage:
        metadata["usage"] = usage
    if error:
        metadata["error"] = error[:500]
    return {
        "type": SHADOW_OUTPUT,
        "request_id": finished.request_id,
        "business_line": finished.business_line,
        "adapter_name": adapter,
        "adapter_version": parsed[1] if parsed else None,
        "response": text,
        "latency_ms": latency_ms,
        "ttft_ms": None,  # not streamed: the first token's time is not seen
        "output_tokens": output_tokens(usage, text) if status == "ok" else None,
        "status": status,
        "metadata": metadata or None,
        "created_at": (created_at or datetime.now(UTC)).isoformat(),
    }


def maybe_shadow(state: GatewayState, finished: FinishedRequest, payload: dict[str, Any]) -> bool:
    """Mirror a finished request to the line's shadow adapter in the background when it is
    sampled and the cap allows; True when a mirror was started. No I/O here."""
    if not payload:
        return False
    table = state.snapshot.table(finished.business_line)
    adapter = shadow_for(table, finished)
    if adapter is None:
        return False
    traffic = state.shadow_traffic
    busy = state.gateway.shadow_max_user_requests
    if busy and state.requests_in_flight >= busy:
        state.metrics.shadow_skipped.labels(finished.business_line, adapter, "busy").inc()
        return False
    if traffic.in_flight >= state.gateway.shadow_max_concurrency:
        state.metrics.shadow_skipped.labels(finished.business_line, adapter, "cap").inc()
        return False
    traffic.in_flight += 1
    path = "/v1/completions" if finished.completion_api else "/v1/chat/completions"
    body = shadow_body(payload, adapter)
    spawn(_mirror(state, finished, adapter, path, body, table.replicas), state.tasks)
    return True


async def _mirror(
    state: GatewayState,
    finished: FinishedRequest,
    adapter: str,
    path: str,
    body: bytes,
    placement: tuple[str, ...] | None,
) -> None:
    """Ask the shadow adapter, then hand its answer (or its failure) to the recorder."""
    started = time.perf_counter()
    status, answer, error = "ok", None, None
    try:
        async with asyncio.timeout(state.gateway.shadow_timeout_s):
            missing: list[Replica] = []
            replica, response = await state.upstreams.post(
                path, body, missing=missing, placement=placement, adapter=adapter
            )
            try:
                answer = await response.read()
            finally:
                response.release()
            if missing and response.status != 404:
                spawn(state.upstreams.heal(adapter, missing, replica), state.tasks)
        if response.status != 200:
            status = "error"
            error = f"vLLM answered {response.status}: {answer[:300].decode(errors='replace')}"
            _log_once(state, adapter, f"HTTP {response.status}")
    except (UpstreamUnavailableError, aiohttp.ClientError, TimeoutError) as exc:
        status, error = "error", repr(exc)[:300]
        _log_once(state, adapter, type(exc).__name__)
    finally:
        state.shadow_traffic.in_flight -= 1
    latency_ms = (time.perf_counter() - started) * 1000
    record = shadow_output_event(
        finished, adapter, status=status, latency_ms=latency_ms, answer=answer, error=error
    )
    state.recorder.record_shadow(record)
    state.metrics.shadow_requests.labels(finished.business_line, adapter, status).inc()


def _log_once(state: GatewayState, adapter: str, kind: str) -> None:
    # Each kind of failure once per adapter and process: a broken shadow must not flood
    # the log. Never the prompt: only the adapter and the kind.
    if (adapter, kind) in state.shadow_traffic.logged:
        return
    state.shadow_traffic.logged.add((adapter, kind))
    logger.warning("gateway: shadow requests to %s fail (%s); stored as errors", adapter, kind)
