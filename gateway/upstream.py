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

A line placed on some replicas (``RoutingTable.replicas``, see
``registry.placement``) is sent to those first, in turn, and to the others only
when none of the placed ones is up. Its adapter is loaded only where the line is
placed; so when no replica tried serves it (its replica restarted, or is down
and the request failed over to one that never held it) the gateway loads it
there on demand, from the folder it was last listed with, and sends the
request again: failover still answers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from registry.placement import placed_replicas

COOL_DOWN_S = 3.0
# Idle pooled connections are dropped before the model server drops them (vLLM's and
# uvicorn's keep-alive is 5 s): a request written on a connection the server is closing
# gets no answer at all.
KEEPALIVE_S = 3.0
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
        self._loading: dict[tuple[str, str], asyncio.Lock] = {}
        self._load_failed: dict[tuple[str, str], float] = {}
        # The folder each adapter was last listed with by any replica: an adapter placed on
        # one replica can be loaded elsewhere while that replica is down.
        self.roots: dict[str, str] = {}
        # Each replica's context length (max_model_len) as it last listed it.
        self._contexts: dict[str, int] = {}

    @property
    def context_tokens(self) -> int | None:
        """The longest context (prompt and answer, in tokens) a replica listed, or None while
        none has (vLLM lists ``max_model_len`` in /v1/models)."""
        return max(self._contexts.values(), default=None)

    async def start(self) -> None:
        """Open the connection pool."""
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0, keepalive_timeout=KEEPALIVE_S, force_close=False
            )
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

    def _home(self, placement: Sequence[str] | None) -> frozenset[str] | None:
        """The URLs of the replicas a placement names (None: no placement)."""
        if placement is None:
            return None
        return frozenset(placed_replicas(placement, [r.base_url for r in self.replicas]))

    def _order(self, home: frozenset[str] | None = None) -> list[Replica]:
        turn = next(self._turn)
        groups = [self.replicas]
        if home is not None:
            groups = [
                [r for r in self.replicas if r.base_url in home],
                [r for r in self.replicas if r.base_url not in home],
            ]
        ordered: list[Replica] = []
        for group in groups:
            if group:
                start = turn % len(group)
                ordered += group[start:] + group[:start]
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
        placement: Sequence[str] | None = None,
        adapter: str | None = None,
    ) -> tuple[Replica, aiohttp.ClientResponse]:
        """Send ``body`` to the first replica that accepts it; the caller releases the response.

        With ``missing`` (a request for an adapter), a replica answering 404 is passed over
        while another is left and appended to ``missing`` when the adapter belongs there;
        the last one's 404 is returned. With a ``placement`` (the line's replicas; None:
        all), those are tried first; and when none that was tried serves ``adapter``, it is
        loaded on demand where it belongs (a placed replica that is up, else the one the
        request failed over to) and the request is sent there again.
        """
        if self._session is None:
            raise RuntimeError("Upstreams.start() was not called")
        refused: list[str] = []
        home = self._home(placement)
        order = self._order(home)
        for position, replica in enumerate(order):
            try:
                response = await self._send(replica, path, body, headers)
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
                # Refused, reset or closed before any answer (e.g. a replica killed under
                # load): no answer started, so the next replica may take the request.
                replica.down_until = time.monotonic() + COOL_DOWN_S
                refused.append(f"{replica.base_url} ({type(exc).__name__})")
                continue
            replica.down_until = 0.0
            if missing is not None and response.status == 404 and position < len(order) - 1:
                response.release()
                if home is None or replica.base_url in home:
                    missing.append(replica)
                continue
            if response.status == 404 and adapter is not None and home is not None:
                target = missing[0] if missing else replica
                if await self._load_on_demand(adapter, target):
                    response.release()
                    if missing is not None and target in missing:
                        missing.remove(target)
                    return await self._post_again(target, path, body, headers)
            return replica, response
        raise UpstreamUnavailableError(
            "no vLLM replica accepted the request: " + ", ".join(refused)
        )

    async def _send(
        self, replica: Replica, path: str, body: bytes, headers: Mapping[str, str] | None
    ) -> aiohttp.ClientResponse:
        """POST to one replica; once more when the server closed the pooled connection as
        the request went out (no answer was started, so nothing ran twice; the closed
        connection is not pooled again)."""
        assert self._session is not None
        merged = {**self._headers, **(headers or {})}
        try:
            return await self._session.post(replica.base_url + path, data=body, headers=merged)
        except aiohttp.ServerDisconnectedError:
            return await self._session.post(replica.base_url + path, data=body, headers=merged)

    async def _post_again(
        self, replica: Replica, path: str, body: bytes, headers: Mapping[str, str] | None
    ) -> tuple[Replica, aiohttp.ClientResponse]:
        assert self._session is not None
        try:
            response = await self._session.post(
                replica.base_url + path, data=body, headers={**self._headers, **(headers or {})}
            )
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
            replica.down_until = time.monotonic() + COOL_DOWN_S
            raise UpstreamUnavailableError(
                f"no vLLM replica accepted the request: {replica.base_url} "
                f"({type(exc).__name__}) after loading the adapter there"
            ) from None
        return replica, response

    async def _load_on_demand(self, adapter: str, replica: Replica) -> bool:
        """Load ``adapter`` on ``replica`` from the folder it was last listed with; True once
        it serves there. Concurrent requests wait for one load; a failed load is not tried
        again on that replica for a few seconds."""
        key = (replica.base_url, adapter)
        async with self._loading.setdefault(key, asyncio.Lock()):
            if self._load_failed.get(key, 0.0) > time.monotonic():
                return False
            root = self.roots.get(adapter)
            if root is None:
                await self.listings()  # the folder may be listed by a replica not read yet
                root = self.roots.get(adapter)
            if root is not None and await self._load(replica, adapter, root):
                logger.info("loaded %s on %s on demand", adapter, replica.base_url)
                return True
            self._load_failed[key] = time.monotonic() + HEAL_RETRY_S
            return False

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

    async def heal(
        self, adapter: str, missing: Sequence[Replica], source: Replica | None
    ) -> list[str]:
        """Load ``adapter`` on the ``missing`` replicas from the path ``source`` serves it from
        (None: the folder it was last listed with); returns the replicas it was loaded on. At
        most one try per replica and adapter every few seconds, whatever the traffic."""
        if self._session is None or not missing:
            return []
        now = time.monotonic()
        due = [r for r in missing if self._healing.get((r.base_url, adapter), 0.0) <= now]
        if not due:
            return []
        for replica in due:
            self._healing[(replica.base_url, adapter)] = now + HEAL_RETRY_S
        root = (
            self.roots.get(adapter) if source is None else await self._adapter_root(source, adapter)
        )
        if root is None:
            return []
        healed = [r.base_url for r in due if await self._load(r, adapter, root)]
        if healed:
            logger.info("reloaded %s on %s", adapter, ", ".join(healed))
        return healed

    async def _load(self, replica: Replica, adapter: str, root: str) -> bool:
        """Load ``adapter`` from ``root`` on ``replica``; True when it serves it now."""
        assert self._session is not None
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
                    return True
                logger.warning(
                    "could not reload %s on %s: %s %s",
                    adapter,
                    replica.base_url,
                    response.status,
                    text[:200],
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("could not reload %s on %s: %r", adapter, replica.base_url, exc)
        return False

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
            elif isinstance(model, dict) and type(model.get("max_model_len")) is int:
                self._contexts[replica.base_url] = model["max_model_len"]
        self.roots.update({name: root for name, root in served.items() if root})
        return served

    async def listings(self) -> dict[str, dict[str, str] | None]:
        """What every replica serves (see :meth:`served`), read concurrently."""
        found = await asyncio.gather(*(self.served(r) for r in self.replicas))
        return {r.base_url: listing for r, listing in zip(self.replicas, found, strict=True)}

    async def reconcile(
        self,
        routed: frozenset[str],
        listings: Mapping[str, dict[str, str] | None],
        placement: Mapping[str, Sequence[str] | None] | None = None,
    ) -> list[tuple[str, str]]:
        """Load every ``routed`` adapter a replica it is placed on lacks (per ``listings``,
        read by the caller before it read the routing tables; ``placement``: per adapter, its
        line's replicas, none or None meaning all) from the folder another replica serves it
        from, or else the folder it was last listed with; returns (adapter, replica) for each
        load. Unrouted adapters are left to the rollout, which drains before it unloads."""
        by_url = {r.base_url: r for r in self.replicas}
        loaded: list[tuple[str, str]] = []
        for adapter in sorted(routed):
            home = self._home((placement or {}).get(adapter))
            sources = [url for url, listing in listings.items() if listing and adapter in listing]
            lacking = [
                by_url[url]
                for url, listing in listings.items()
                if listing is not None
                and adapter not in listing
                and url in by_url
                and (home is None or url in home)
            ]
            if not lacking or not (sources or adapter in self.roots):
                continue
            source = by_url[sources[0]] if sources else None
            for url in await self.heal(adapter, lacking, source):
                loaded.append((adapter, url))
        return loaded


def spawn(coroutine: object, tasks: list[asyncio.Task[None]]) -> None:
    """Run ``coroutine`` in the background, keeping a reference until it is done."""
    task = asyncio.ensure_future(coroutine)  # type: ignore[arg-type]
    tasks.append(task)
    task.add_done_callback(tasks.remove)
