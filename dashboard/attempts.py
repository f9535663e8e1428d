"""Failed key checks per client: a client that keeps presenting unknown keys (the login
form, or ``Authorization: Bearer`` on the page and its API) is refused for a while.

Each client holds an allowance of ``allowed`` failures that refills evenly over
``window_s`` (a token bucket): a person who mistypes a key a few times never notices,
a script trying keys gets ``429`` with ``Retry-After`` once the allowance is spent, and
the refusal comes before its key is looked at, so a refused guess teaches it nothing.

Why these choices:

- The client is the address the connection comes from (as the page's loopback check
  reads it; no forwarding header is trusted). An IPv6 client is its /64, the block one
  subscriber is given, or a single machine could try from 2^64 addresses.
- Tenancy: the table knows addresses only, never keys, names or lines, so one tenant's
  failures cost no other client anything and a key cannot be locked out by someone who
  does not hold it. A valid key does not refill the allowance: otherwise a tenant's own
  key would buy unlimited guesses at the others'. A browser already logged in keeps its
  session (a cookie is not a key check).
- Memory: at most ``capacity`` clients are followed; a new one pushes out the one that
  failed least recently, and a client whose allowance has refilled is forgotten. Each
  server process keeps its own table (``--workers N``: up to N allowances per client).
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

CLIENTS_KEPT = 10_000


def client_of(host: str | None) -> str:
    """The client a failure is counted against: the address, an IPv6 one as its /64."""
    if not host:
        return "unknown"
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class FailedKeyAttempts:
    """Each client's allowance of failed key checks; ``clock`` is the time source (tests
    move it). Thread-safe: the page checks keys on the event loop and in its thread pool."""

    def __init__(
        self,
        allowed: int,
        window_s: float,
        *,
        capacity: int = CLIENTS_KEPT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if allowed < 1 or window_s <= 0 or capacity < 1:
            raise ValueError("allowed and capacity must be at least 1, window_s above 0")
        self.allowed = allowed
        self.window_s = window_s
        self.capacity = capacity
        self.clock = clock
        self._per_s = allowed / window_s
        self._lock = threading.Lock()
        # client -> (allowance left, when it was left so)
        self._left: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._left)

    def _now_left(self, client: str, now: float) -> float:
        left, at = self._left.get(client, (float(self.allowed), now))
        return min(float(self.allowed), left + (now - at) * self._per_s)

    def retry_after(self, client: str) -> int | None:
        """Whole seconds until ``client`` may have a key checked again; None while it may."""
        with self._lock:
            now = self.clock()
            left = self._now_left(client, now)
            if left >= 1:
                if left >= self.allowed:
                    self._left.pop(client, None)  # refilled: nothing left to remember
                return None
            return max(1, math.ceil((1 - left) / self._per_s - 1e-9))

    def failed(self, client: str) -> None:
        """Count one failed key check of ``client``."""
        with self._lock:
            now = self.clock()
            self._left[client] = (max(0.0, self._now_left(client, now) - 1), now)
            self._left.move_to_end(client)
            while len(self._left) > self.capacity:
                self._left.popitem(last=False)
