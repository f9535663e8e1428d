"""Conversations: which adapter a session is pinned to, and the route of a request
(the pin while its adapter is still routed, otherwise the sticky split)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from gateway.recorder import STORE_DOWN_ERRORS
from registry.routing import RoutingTable, arm_of, choose_arm

if TYPE_CHECKING:  # the state holds the pins; the routes only read it
    from gateway.state import GatewayState


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


async def pin_from_store(state: GatewayState, line: str, session: str) -> tuple[bool, str | None]:
    """The adapter a conversation of ``line`` used last, from the store (another replica may
    have served it); not found when the store cannot say."""
    try:
        lookup = asyncio.to_thread(state.store.session_adapter, line, session)
        return await asyncio.wait_for(lookup, timeout=0.5)
    except (TimeoutError, *STORE_DOWN_ERRORS):
        return False, None


async def route_request(
    state: GatewayState,
    table: RoutingTable,
    key: str,
    session: str | None,
    messages: list[dict[str, str]],
) -> tuple[str, str | None]:
    """The arm and adapter for a request: a session keeps the adapter it began with (this
    replica's pin, or the store's last answer when the caller sends a history), otherwise
    the user's sticky split."""
    if session is None:
        return choose_arm(table, key)
    now = time.monotonic()
    line = table.business_line
    pinned = state.pins.get(line, session, now)
    if not pinned[0] and any(m["role"] == "assistant" for m in messages):
        pinned = await pin_from_store(state, line, session)
    arm, adapter = pinned_route(table, key, pinned)
    state.pins.set(line, session, adapter, now)
    return arm, adapter
