"""The vLLM replicas behind the gateway: one pooled HTTP client, round robin, failover.

A request goes to the next replica in turn; when a replica refuses or drops the
connection before any answer began, the request moves on to the next one and
that replica is skipped for a few seconds. Once an answer has begun it is never
re-sent elsewhere.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

COOL_DOWN_S = 3.0


class UpstreamUnavailableError(Exception):
    """No replica accepted the request."""


@dataclass(slots=True)
class Replica:
    """One vLLM server and when it may be tried again."""

    base_url: str
    down_until: float = 0.0


class Upstreams:
    """A pooled client over the replicas; create and close it inside the event loop."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 600.0,
        api_key: str | None = None,
    ) -> None:
        self.replicas = [Replica(url.rstrip("/")) for url in urls]
        self._turn = itertools.count()
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the connection pool."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, force_close=False)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )

    async def close(self) -> None:
        """Close the pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _order(self) -> list[Replica]:
        start = next(self._turn) % len(self.replicas)
        ordered = self.replicas[start:] + self.replicas[:start]
        now = time.monotonic()
        alive = [r for r in ordered if r.down_until <= now]
        # When every replica looks down, try them all anyway: one may be back.
        return alive or ordered

    async def post(
        self, path: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> tuple[Replica, aiohttp.ClientResponse]:
        """Send ``body`` to the first replica that accepts it; the caller releases the response."""
        if self._session is None:
            raise RuntimeError("Upstreams.start() was not called")
        refused: list[str] = []
        for replica in self._order():
            try:
                response = await self._session.post(
                    replica.base_url + path,
                    data=body,
                    headers={**self._headers, **(headers or {})},
                )
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
                # Refused, reset or closed before any answer (e.g. a replica killed under
                # load): no answer started, so the next replica may take the request.
                replica.down_until = time.monotonic() + COOL_DOWN_S
                refused.append(f"{replica.base_url} ({type(exc).__name__})")
                continue
            replica.down_until = 0.0
            return replica, response
        raise UpstreamUnavailableError(
            "no vLLM replica accepted the request: " + ", ".join(refused)
        )

    async def get_json(self, path: str) -> object:
        """GET ``path`` from the first replica that answers, as JSON."""
        if self._session is None:
            raise RuntimeError("Upstreams.start() was not called")
        refused: list[str] = []
        for replica in self._order():
            try:
                async with self._session.get(
                    replica.base_url + path,
                    headers=self._headers,
                    timeout=aiohttp.ClientTimeout(total=5),
                ) as response:
                    response.raise_for_status()
                    return await response.json()
            except (aiohttp.ClientError, TimeoutError) as exc:
                refused.append(f"{replica.base_url} ({type(exc).__name__})")
        raise UpstreamUnavailableError("no vLLM replica answered: " + ", ".join(refused))
