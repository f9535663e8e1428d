"""The gateway's side of the rate limits (:mod:`gateway.limits`): which quotas a request
draws on, the 429, and settling tokens and stream slots once an answer is done."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi.responses import Response

from gateway.keys import ApiKey
from gateway.limits import Limits, Quota, Verdict, quotas_for
from gateway.recorder import (
    FinishedRequest,
    used_tokens,
)
from gateway.state import GatewayState
from gateway.wire import GatewayError, OutputCap


@dataclass(slots=True)
class Admission:
    """What a completion took from the rate limits: tokens are charged and the stream slot
    given back when it finishes."""

    tokens: list[Quota]
    streams: list[Quota]
    slot: str | None


def limit_scopes(state: GatewayState, key: ApiKey, line: str) -> list[tuple[str, Limits | None]]:
    """The limit scopes a request of ``key`` on ``line`` draws on."""
    return [(f"key:{key.name}", key.limits), (f"line:{line}", state.keys.line_limits.get(line))]


def output_cap(state: GatewayState, key: ApiKey, line: str) -> OutputCap:
    """The most output tokens an answer of ``key`` on ``line`` may have: the smallest of the
    gateway's cap and the key's and the line's ``max_output_tokens``."""
    cap = OutputCap(state.gateway.max_output_tokens, "this gateway's")
    line_limits = state.keys.line_limits.get(line)
    for owner, limits in ((f"key {key.name!r}'s", key.limits), (f"line {line!r}'s", line_limits)):
        tokens = limits.max_output_tokens if limits is not None else None
        if tokens is not None and tokens < cap.tokens:
            cap = OutputCap(tokens, owner)
    return cap


def too_many(verdict: Verdict) -> Response:
    """The 429 for a refused verdict, with Retry-After and the x-ratelimit headers."""
    assert verdict.refused is not None
    headers = verdict.headers()
    wait = headers["retry-after"]
    error = GatewayError(429, f"rate limit reached: {verdict.refused.label}; retry in {wait} s")
    return error.response(headers)


async def check_limits(
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


async def admit_completion(
    state: GatewayState, key: ApiKey, line: str
) -> tuple[Admission | None, Verdict | None]:
    """Count a completion against its key's and line's limits: (admission, None) when it may
    go on, (None, refusal) when a limit is reached; (None, None) when nothing is limited."""
    scopes = limit_scopes(state, key, line)
    requests = quotas_for("requests", scopes)
    tokens = quotas_for("tokens", scopes)
    streams = quotas_for("streams", scopes)
    if not (requests or tokens or streams):
        return None, None
    costs = [1.0] * len(requests) + [0.0] * len(tokens)
    verdict = await check_limits(state, line, [*requests, *tokens], costs, streams)
    if not verdict.allowed:
        return None, verdict
    return Admission(tokens, streams, verdict.stream_slot), verdict


async def settle(
    state: GatewayState, admitted: Admission, finished: FinishedRequest | None
) -> None:
    """Charge the tokens a finished completion used (None: it never reached vLLM) and give
    back its stream slot."""
    amount = used_tokens(finished) if admitted.tokens and finished is not None else 0
    await state.limiter.settle(admitted.tokens, amount, admitted.streams, admitted.slot)
