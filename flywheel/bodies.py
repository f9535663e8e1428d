"""Reading a request body on a budget, for both servers (gateway and feedback page): never
more than a limit, never waiting forever on a client that stalls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


class BodyTooLargeError(Exception):
    """The body is, or says it is, over the limit; nothing past the limit was read."""


class BodyStalledError(Exception):
    """Nothing of the body arrived for the whole timeout."""


async def read_body(
    stream: AsyncIterator[bytes], declared: str | None, limit: int, stall_timeout_s: float
) -> bytes:
    """The whole body from ``stream``: refused up front when its declared length
    (``Content-Length``) is over ``limit``, cut once it grows over it, and given up when
    no piece arrives for ``stall_timeout_s``."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(f"the body is {declared} bytes, over the {limit} byte limit")
    chunks: list[bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    # One deadline moved on with each piece: asyncio.wait_for on Python 3.11 makes a task
    # for every piece it waits on, a cost on every request's hot path.
    try:
        async with asyncio.timeout(stall_timeout_s) as deadline:
            async for chunk in stream:
                size += len(chunk)
                if size > limit:
                    raise BodyTooLargeError(f"the body is over the {limit} byte limit")
                chunks.append(chunk)
                deadline.reschedule(loop.time() + stall_timeout_s)
    except TimeoutError:
        raise BodyStalledError(
            f"the body did not arrive: nothing for {stall_timeout_s:g} s; send it whole"
        ) from None
    return b"".join(chunks)


def nests_deeper(value: object, limit: int) -> bool:
    """Whether the parsed JSON ``value`` nests arrays and objects more than ``limit`` deep (a
    top-level object is 1 deep). Only arrays and objects are visited, each at most once, and
    the walk stops at the first one past the limit."""
    if not isinstance(value, dict | list):
        return False
    if limit <= 0:
        return True
    for child in value.values() if isinstance(value, dict) else value:
        if type(child) in _CONTAINERS and nests_deeper(child, limit - 1):
            return True
    return False


_CONTAINERS = (dict, list)
