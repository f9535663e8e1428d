"""The vLLM replicas behind the gateway: one pooled HTTP client, round robin, failover.

A request goes to the next replica in turn; when a replica refuses or drops the
connection before any answer began, the request moves on to the next one and
that replica is skipped for a few seconds. Once an answer has begun it is never
re-sent elsewhere.

A request for an adapter that one replica does not serve (404, e.g. it just
restarted) also moves on, and :meth:`Upstreams.heal` loads the adapter back on
that replica from the folder a replica that does serve it lists (vLLM's
``/v1/models`` names each adapter's path): the gateway repairs a restarted
replica on the first request, before the reconciler's next round.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

COOL_DOWN_S = 3.0
HEAL_RETRY_S = 10.0
logger = logging.getLogger(__name__)


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
        self._healing: dict[tuple[str, str], float] = {}

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
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        missing: list[Replica] | None = None,
    ) -> tuple[Replica, aiohttp.ClientResponse]:
        """Send ``body`` to the first replica that accepts it; the caller releases the response.

        With ``missing`` (a request for an adapter), a replica answering 404 is passed over
        while another is left and appended to ``missing``; the last one's 404 is returned.
        """
        if self._session is None:
            raise RuntimeError("Upstreams.start() was not called")
        refused: list[str] = []
        order = self._order()
        for position, replica in enumerate(order):
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
            if missing is not None and response.status == 404 and position < len(order) - 1:
                response.release()
                missing.append(replica)
                continue
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

    async def heal(self, adapter: str, missing: Sequence[Replica], source: Replica) -> list[str]:
        """Load ``adapter`` on the ``missing`` replicas from the path ``source`` serves it from;
        returns the replicas it was loaded on. At most one try per replica and adapter every
        few seconds, whatever the traffic."""
        if self._session is None or not missing:
            return []
        now = time.monotonic()
        due = [r for r in missing if self._healing.get((r.base_url, adapter), 0.0) <= now]
        if not due:
            return []
        for replica in due:
            self._healing[(replica.base_url, adapter)] = now + HEAL_RETRY_S
        root = await self._adapter_root(source, adapter)
        if root is None:
            return []
        healed = []
        for replica in due:
            try:
                async with self._session.post(
                    replica.base_url + "/v1/load_lora_adapter",
                    json={"lora_name": adapter, "lora_path": root},
                    headers=self._headers,
                    timeout=aiohttp.ClientTimeout(total=60),
                ) as response:
                    text = await response.text()
                    # 400 "already loaded": another gateway worker was first.
                    if response.status == 200 or "already" in text.lower():
                        healed.append(replica.base_url)
                    else:
                        logger.warning(
                            "could not reload %s on %s: %s %s",
                            adapter,
                            replica.base_url,
                            response.status,
                            text[:200],
                        )
            except (aiohttp.ClientError, TimeoutError) as exc:
                logger.warning("could not reload %s on %s: %r", adapter, replica.base_url, exc)
        if healed:
            logger.info("reloaded %s on %s", adapter, ", ".join(healed))
        return healed

    async def _adapter_root(self, source: Replica, adapter: str) -> str | None:
        listing = await self.served(source)
        return (listing or {}).get(adapter) or None  # no folder listed: nothing to load from

    async def served(self, replica: Replica) -> dict[str, str] | None:
        """The adapters ``replica`` serves, by name, with the folder each was loaded from;
        None when it does not answer."""
        if self._session is None:
            return None
        try:
            async with self._session.get(
                replica.base_url + "/v1/models",
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=5),
            ) as response:
                response.raise_for_status()
                listing = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        served = {}
        for model in listing.get("data", []) if isinstance(listing, dict) else []:
            # An adapter has a parent (the base model) and the folder it came from as root.
            if isinstance(model, dict) and model.get("parent") and model.get("id"):
                served[str(model["id"])] = str(model.get("root") or "")
        return served

    async def listings(self) -> dict[str, dict[str, str] | None]:
        """What every replica serves (see :meth:`served`), read concurrently."""
        found = await asyncio.gather(*(self.served(r) for r in self.replicas))
        return {r.base_url: listing for r, listing in zip(self.replicas, found, strict=True)}

    async def reconcile(
        self, routed: frozenset[str], listings: Mapping[str, dict[str, str] | None]
    ) -> list[tuple[str, str]]:
        """Load every ``routed`` adapter a replica lacks (per ``listings``, read by the caller
        before it read the routing tables) from the folder another replica serves it from;
        returns (adapter, replica) for each load. Unrouted adapters are left to the rollout,
        which drains before it unloads."""
        by_url = {r.base_url: r for r in self.replicas}
        loaded: list[tuple[str, str]] = []
        for adapter in sorted(routed):
            sources = [url for url, listing in listings.items() if listing and adapter in listing]
            lacking = [
                by_url[url]
                for url, listing in listings.items()
                if listing is not None and adapter not in listing and url in by_url
            ]
            if not sources or not lacking:
                continue
            for url in await self.heal(adapter, lacking, by_url[sources[0]]):
                loaded.append((adapter, url))
        return loaded


def spawn(coroutine: object, tasks: list[asyncio.Task[None]]) -> None:
    """Run ``coroutine`` in the background, keeping a reference until it is done."""
    task = asyncio.ensure_future(coroutine)  # type: ignore[arg-type]
    tasks.append(task)
    task.add_done_callback(tasks.remove)
