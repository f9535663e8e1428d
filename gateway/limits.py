"""Rate limits and quotas (限流): per API key and per business line.

Three kinds of counter, each a sliding window of ``window_s`` (a minute):

- ``requests`` — completions accepted in the window (``requests_per_min``);
- ``tokens`` — prompt + completion tokens used in the window (``tokens_per_min``):
  a request is admitted while the window is under the limit and charged what vLLM
  reports it used once it finished, so a long answer can overdraw the window and
  the next requests wait until it drains;
- ``feedback`` — feedback events accepted in the window (``feedback_per_min``);

and one gauge, ``streams`` — completions in flight at once, streamed or not
(``concurrent_streams``).

A sliding window is estimated from two fixed windows, the current one and the
previous one weighted by the share of it still inside the sliding window (the
approach of Cloudflare's and nginx's limiters): exact at the window's start, never
above the limit by more than one request's cost, and two integers per counter.

With a Redis URL every gateway replica and worker shares the counters: one Lua
script checks every quota of a request and takes from all of them or none, on
Redis's clock. Without one, or while Redis does not answer, each process counts
on its own (``MemoryLimiter``) and says so in its log: limits then hold per process.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

logger = logging.getLogger(__name__)

Kind = Literal["requests", "tokens", "feedback", "streams"]
REDIS_RETRY_S = 5.0
KEY_PREFIX = "fw:rl"


class Limits(BaseModel):
    """The limits of one API key or one business line; unset means unlimited."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_min: int | None = Field(default=None, ge=1, description="Completions a minute.")
    tokens_per_min: int | None = Field(
        default=None, ge=1, description="Prompt + completion tokens a minute."
    )
    concurrent_streams: int | None = Field(
        default=None, ge=1, description="Completions in flight at once, streamed or not."
    )
    feedback_per_min: int | None = Field(
        default=None, ge=1, description="Feedback events a minute."
    )
    max_output_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Most tokens one answer may have (below the gateway's max_output_tokens): "
        "a request asking for more is refused, one asking for no limit is given this one.",
    )

    def limit_of(self, kind: Kind) -> int | None:
        """The limit of ``kind``: per window, or the number of slots for ``streams``."""
        return {
            "requests": self.requests_per_min,
            "tokens": self.tokens_per_min,
            "feedback": self.feedback_per_min,
            "streams": self.concurrent_streams,
        }[kind]


@dataclass(frozen=True, slots=True)
class Quota:
    """One counter a request draws on: ``kind`` for ``scope`` (``key:<name>``,
    ``line:<line>``) up to ``limit`` per window."""

    scope: str
    kind: Kind
    limit: int

    @property
    def label(self) -> str:
        """How the refusal names it."""
        what, _, name = self.scope.partition(":")
        if self.kind == "streams":
            return f"completions in flight at once for {what} {name!r} ({self.limit})"
        unit = {"requests": "requests", "tokens": "tokens", "feedback": "feedback events"}
        return f"{unit[self.kind]} per minute for {what} {name!r} ({self.limit})"


@dataclass(frozen=True, slots=True)
class Standing:
    """Where one quota stands after a check: what is left and when the window frees up."""

    quota: Quota
    used: float
    reset_s: float

    @property
    def remaining(self) -> int:
        """Whole units left in the sliding window."""
        return max(0, math.floor(self.quota.limit - self.used))


@dataclass(slots=True)
class Verdict:
    """A limiter's answer: admitted (and counted) or refused with when to retry."""

    allowed: bool
    standings: list[Standing] = field(default_factory=list)
    refused: Quota | None = None
    retry_after_s: float = 0.0
    stream_slot: str | None = None

    def headers(self) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for the tightest quota of each kind."""
        headers: dict[str, str] = {}
        names = {"requests": "requests", "tokens": "tokens"}
        for kind, name in names.items():
            mine = [s for s in self.standings if s.quota.kind == kind]
            if not mine:
                continue
            tightest = min(mine, key=lambda s: (s.remaining, -s.reset_s))
            headers[f"x-ratelimit-limit-{name}"] = str(tightest.quota.limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(tightest.remaining)
            headers[f"x-ratelimit-reset-{name}"] = f"{tightest.reset_s:.3f}s"
        if not self.allowed:
            headers["retry-after"] = str(max(1, math.ceil(self.retry_after_s)))
        return headers


def sliding_count(previous: float, current: float, elapsed: float, window_s: float) -> float:
    """The sliding window's estimate ``elapsed`` seconds into the current fixed window."""
    return previous * max(0.0, 1.0 - elapsed / window_s) + current


def retry_after(
    previous: float, current: float, elapsed: float, window_s: float, cost: float, limit: int
) -> float:
    """Seconds until ``cost`` more fits under ``limit`` if nothing else is counted."""
    over = sliding_count(previous, current, elapsed, window_s) + cost - limit
    if over <= 0:
        return 0.0
    left = window_s - elapsed
    if previous > 0:
        # The previous window's weight falls by previous / window_s each second.
        wait = over * window_s / previous
        if wait <= left:
            return wait
    # Into the next window: the current count becomes the previous one and falls likewise.
    over_next = current + cost - limit
    if current <= 0 or over_next <= 0:
        return left
    return left + min(window_s, over_next * window_s / current)


class Limiter(Protocol):
    """What the gateway asks of a limiter (one per process)."""

    backend: str

    async def admit(
        self, quotas: Sequence[Quota], costs: Sequence[float], streams: Sequence[Quota]
    ) -> Verdict:
        """Check every quota; when all have room, count ``costs`` and take a stream slot in
        every ``streams`` quota (their ``limit`` is the number of slots)."""
        ...

    async def charge(self, quotas: Sequence[Quota], amount: float) -> None:
        """Count ``amount`` (tokens used) on ``quotas`` after the fact."""
        ...

    async def release(self, streams: Sequence[Quota], slot: str) -> None:
        """Give back a stream slot taken by :meth:`admit`."""
        ...

    async def settle(
        self, tokens: Sequence[Quota], amount: float, streams: Sequence[Quota], slot: str | None
    ) -> None:
        """:meth:`charge` and :meth:`release` for one finished completion, together."""
        ...

    async def close(self) -> None:
        """Let go of connections."""
        ...


class MemoryLimiter:
    """Counters in this process (no Redis URL, or Redis down)."""

    backend = "memory"

    def __init__(self, window_s: float = 60.0, stream_ttl_s: float = 3_600.0) -> None:
        self.window_s = window_s
        self.stream_ttl_s = stream_ttl_s
        self._windows: dict[tuple[str, str], tuple[int, float, float]] = {}
        self._streams: dict[str, dict[str, float]] = {}

    def _counts(self, quota: Quota, now: float) -> tuple[float, float, float]:
        index = int(now // self.window_s)
        elapsed = now - index * self.window_s
        held = self._windows.get((quota.scope, quota.kind))
        if held is None:
            return 0.0, 0.0, elapsed
        at, previous, current = held
        if at == index:
            return previous, current, elapsed
        if at == index - 1:
            return current, 0.0, elapsed
        return 0.0, 0.0, elapsed

    def _add(self, quota: Quota, now: float, amount: float) -> None:
        previous, current, _ = self._counts(quota, now)
        self._windows[(quota.scope, quota.kind)] = (
            int(now // self.window_s),
            previous,
            current + amount,
        )

    def _live_streams(self, quota: Quota, now: float) -> dict[str, float]:
        slots = self._streams.setdefault(quota.scope, {})
        for slot in [s for s, at in slots.items() if at < now - self.stream_ttl_s]:
            del slots[slot]
        return slots

    async def admit(
        self, quotas: Sequence[Quota], costs: Sequence[float], streams: Sequence[Quota]
    ) -> Verdict:
        """See :meth:`Limiter.admit`."""
        return self.admit_at(time.time(), quotas, costs, streams)

    def admit_at(
        self,
        now: float,
        quotas: Sequence[Quota],
        costs: Sequence[float],
        streams: Sequence[Quota],
    ) -> Verdict:
        """:meth:`admit` at a given time (the clock is a parameter for tests)."""
        standings = []
        for quota, cost in zip(quotas, costs, strict=True):
            previous, current, elapsed = self._counts(quota, now)
            used = sliding_count(previous, current, elapsed, self.window_s)
            # A zero cost (tokens) only needs the window not to be spent already.
            if used + max(cost, 1e-9) > quota.limit:
                wait = retry_after(previous, current, elapsed, self.window_s, cost, quota.limit)
                reset = Standing(quota, used, wait)
                return Verdict(False, [*standings, reset], quota, wait)
            standings.append(Standing(quota, used + cost, self.window_s - elapsed))
        for quota in streams:
            if len(self._live_streams(quota, now)) >= quota.limit:
                return Verdict(False, standings, quota, 1.0)
        for quota, cost in zip(quotas, costs, strict=True):
            if cost:
                self._add(quota, now, cost)
        slot = None
        if streams:
            slot = uuid.uuid4().hex
            for quota in streams:
                self._streams[quota.scope][slot] = now
        return Verdict(True, standings, stream_slot=slot)

    async def charge(self, quotas: Sequence[Quota], amount: float) -> None:
        """See :meth:`Limiter.charge`."""
        now = time.time()
        for quota in quotas:
            self._add(quota, now, amount)

    async def release(self, streams: Sequence[Quota], slot: str) -> None:
        """See :meth:`Limiter.release`."""
        for quota in streams:
            self._streams.get(quota.scope, {}).pop(slot, None)

    async def settle(
        self, tokens: Sequence[Quota], amount: float, streams: Sequence[Quota], slot: str | None
    ) -> None:
        """See :meth:`Limiter.settle`."""
        if slot is not None:
            await self.release(streams, slot)
        await self.charge(tokens, amount)

    async def close(self) -> None:
        """Nothing to let go of."""


# KEYS: per window quota its counter's prefix (+ ':<window index>'), then per stream quota
# its set.
# ARGV: window_s, stream_ttl_s, n_windows, n_streams, slot, then per window quota
# (limit, cost). Returns {allowed, refused index (1-based; windows first), per window
# quota: used, elapsed, previous, current}; counts are taken only when all have room.
_ADMIT = """
local window = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local m = tonumber(ARGV[4])
local slot = ARGV[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local index = math.floor(now / window)
local elapsed = now - index * window
local out = {1, 0}
for i = 1, n do
  local cur_key = KEYS[i] .. ':' .. string.format('%d', index)
  local prev_key = KEYS[i] .. ':' .. string.format('%d', index - 1)
  local current = tonumber(redis.call('GET', cur_key) or '0')
  local previous = tonumber(redis.call('GET', prev_key) or '0')
  local limit = tonumber(ARGV[4 + 2 * i])
  local cost = tonumber(ARGV[5 + 2 * i])
  local used = previous * math.max(0, 1 - elapsed / window) + current
  local need = cost
  if need <= 0 then need = 1e-9 end
  if out[1] == 1 and used + need > limit then
    out[1] = 0
    out[2] = i
  end
  table.insert(out, tostring(used))
  table.insert(out, tostring(elapsed))
  table.insert(out, tostring(previous))
  table.insert(out, tostring(current))
end
if out[1] == 1 then
  for j = 1, m do
    local set = KEYS[n + j]
    redis.call('ZREMRANGEBYSCORE', set, '-inf', tostring(now - ttl))
    local limit = tonumber(ARGV[5 + 2 * n + j])
    if redis.call('ZCARD', set) >= limit then
      out[1] = 0
      out[2] = n + j
      break
    end
  end
end
if out[1] == 1 then
  for i = 1, n do
    local cost = tonumber(ARGV[5 + 2 * i])
    if cost > 0 then
      local cur_key = KEYS[i] .. ':' .. string.format('%d', index)
      redis.call('INCRBYFLOAT', cur_key, tostring(cost))
      redis.call('EXPIRE', cur_key, math.ceil(window * 2) + 1)
    end
  end
  for j = 1, m do
    local set = KEYS[n + j]
    redis.call('ZADD', set, tostring(now), slot)
    redis.call('EXPIRE', set, math.ceil(ttl) + 1)
  end
end
return out
"""

# KEYS: the token counters' prefixes, then the stream sets; ARGV: window_s, amount,
# how many token counters, the slot to give back ('' for none).
_CHARGE = """
local window = tonumber(ARGV[1])
local n = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local index = math.floor(now / window)
for i = 1, n do
  local cur_key = KEYS[i] .. ':' .. string.format('%d', index)
  redis.call('INCRBYFLOAT', cur_key, ARGV[2])
  redis.call('EXPIRE', cur_key, math.ceil(window * 2) + 1)
end
if ARGV[4] ~= '' then
  for j = n + 1, #KEYS do
    redis.call('ZREM', KEYS[j], ARGV[4])
  end
end
return 1
"""


class RedisLimiter:
    """Counters shared by every gateway replica and worker through Redis; while Redis does
    not answer, this process falls back to its own counters and retries every few seconds.

    ``client`` is an asynchronous Redis client (``redis.asyncio``) that decodes responses,
    with short socket timeouts (a Redis slower than them counts as down:
    ``composition.clients`` builds it so); the limiter closes it.
    """

    backend = "redis"

    def __init__(
        self,
        client: Any,
        window_s: float = 60.0,
        stream_ttl_s: float = 3_600.0,
        namespace: str = "flywheel",
    ) -> None:
        self.prefix = f"{KEY_PREFIX}:{namespace}"
        self.window_s = window_s
        self.stream_ttl_s = stream_ttl_s
        self._client: Any = client
        self._admit = self._client.register_script(_ADMIT)
        self._charge = self._client.register_script(_CHARGE)
        self.fallback = MemoryLimiter(window_s, stream_ttl_s)
        self._down_until = 0.0
        # Slots taken from the fallback are given back there.
        self._local_slots: set[str] = set()

    @property
    def up(self) -> bool:
        """Whether Redis answered last time it was asked."""
        return self._down_until <= time.monotonic()

    def _failed(self, exc: Exception) -> None:
        if self.up:
            logger.warning(
                "gateway: Redis does not answer (%s): rate limits count per process for now",
                exc,
            )
        self._down_until = time.monotonic() + REDIS_RETRY_S

    def _back(self) -> None:
        if self._down_until:
            logger.info("gateway: Redis answers again: rate limits are shared again")
            self._down_until = 0.0

    def _key(self, quota: Quota) -> str:
        return f"{self.prefix}:{quota.kind}:{quota.scope}"

    async def admit(
        self, quotas: Sequence[Quota], costs: Sequence[float], streams: Sequence[Quota]
    ) -> Verdict:
        """See :meth:`Limiter.admit`."""
        if not self.up:
            return await self._local_admit(quotas, costs, streams)
        import redis.exceptions

        slot = uuid.uuid4().hex
        keys = [self._key(q) for q in quotas]
        keys += [f"{self.prefix}:streams:{q.scope}" for q in streams]
        args: list[Any] = [self.window_s, self.stream_ttl_s, len(quotas), len(streams), slot]
        for quota, cost in zip(quotas, costs, strict=True):
            args += [quota.limit, cost]
        args += [q.limit for q in streams]
        try:
            out = await self._admit(keys=keys, args=args)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            self._failed(exc)
            return await self._local_admit(quotas, costs, streams)
        self._back()
        allowed, refused_at = int(out[0]), int(out[1])
        standings = []
        verdict = Verdict(bool(allowed))
        for i, (quota, cost) in enumerate(zip(quotas, costs, strict=True)):
            used, elapsed, previous, current = (float(x) for x in out[2 + 4 * i : 6 + 4 * i])
            if refused_at == i + 1:
                wait = retry_after(previous, current, elapsed, self.window_s, cost, quota.limit)
                standings.append(Standing(quota, used, wait))
                verdict.refused, verdict.retry_after_s = quota, wait
            else:
                standings.append(Standing(quota, used + cost, self.window_s - elapsed))
        if refused_at > len(quotas):
            verdict.refused, verdict.retry_after_s = streams[refused_at - len(quotas) - 1], 1.0
        verdict.standings = standings
        verdict.stream_slot = slot if allowed and streams else None
        return verdict

    async def _local_admit(
        self, quotas: Sequence[Quota], costs: Sequence[float], streams: Sequence[Quota]
    ) -> Verdict:
        verdict = await self.fallback.admit(quotas, costs, streams)
        if verdict.stream_slot:
            self._local_slots.add(verdict.stream_slot)
        return verdict

    async def charge(self, quotas: Sequence[Quota], amount: float) -> None:
        """See :meth:`Limiter.charge`."""
        if not quotas or amount <= 0:
            return
        if not self.up:
            await self.fallback.charge(quotas, amount)
            return
        import redis.exceptions

        try:
            keys = [self._key(q) for q in quotas]
            await self._charge(keys=keys, args=[self.window_s, amount, len(keys), ""])
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            self._failed(exc)
            await self.fallback.charge(quotas, amount)

    async def release(self, streams: Sequence[Quota], slot: str) -> None:
        """See :meth:`Limiter.release`."""
        if slot in self._local_slots:
            self._local_slots.discard(slot)
            await self.fallback.release(streams, slot)
            return
        import redis.exceptions

        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for quota in streams:
                    pipe.zrem(f"{self.prefix}:streams:{quota.scope}", slot)
                await pipe.execute()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            # The slot expires after stream_ttl_s on its own.
            self._failed(exc)

    async def settle(
        self, tokens: Sequence[Quota], amount: float, streams: Sequence[Quota], slot: str | None
    ) -> None:
        """See :meth:`Limiter.settle`: one round trip for both."""
        if not self.up or (slot is not None and slot in self._local_slots):
            if slot is not None:
                await self.release(streams, slot)
            await self.charge(tokens, amount)
            return
        import redis.exceptions

        keys = [self._key(q) for q in tokens] if amount > 0 else []
        if slot is not None:
            keys += [f"{self.prefix}:streams:{q.scope}" for q in streams]
        if not keys:
            return
        args = [self.window_s, amount, len(tokens) if amount > 0 else 0, slot or ""]
        try:
            await self._charge(keys=keys, args=args)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            # The slot expires after stream_ttl_s on its own; the tokens count here instead.
            self._failed(exc)
            await self.fallback.charge(tokens, amount)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()


def build_limiter(
    redis: Any, window_s: float, stream_ttl_s: float, namespace: str = "flywheel"
) -> Limiter:
    """The shared limiter over an asynchronous Redis client, else (None) this process's own."""
    if redis is not None:
        return RedisLimiter(redis, window_s, stream_ttl_s, namespace)
    return MemoryLimiter(window_s, stream_ttl_s)


def quotas_for(kind: Kind, scopes: Sequence[tuple[str, Limits | None]]) -> list[Quota]:
    """The ``kind`` quotas of ``scopes`` that have a limit (``streams``: the slots)."""
    found = []
    for scope, limits in scopes:
        limit = limits.limit_of(kind) if limits is not None else None
        if limit is not None:
            found.append(Quota(scope, kind, limit))
    return found
