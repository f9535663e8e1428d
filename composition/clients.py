"""The clients of one process, built in one place from one settings tree.

:func:`build_clients` is the one function that constructs the services flywheel talks
to: the feedback store, its routing tables, the MLflow registry, vLLM admin clients, the
PII scrubber and Redis, each from :class:`~flywheel.settings.Settings`. Nothing else in
the product constructs them (``tests/unit/test_clients_built_once.py`` reads the code for
it); the layers below take them as arguments.

A :class:`Clients` set builds each client on first use, so a command that never scrubs
never loads spaCy and one that never trains never imports MLflow, and closes what it
built together (it is a context manager). Tests build a set of the same class from other
factories (``tests/fake_clients.py``) and put it in use with :func:`clients_in_use`; the
edges (a CLI command, a flow's start) ask :func:`open_clients`, which yields that set, or
else the real one for their settings, closed when the block ends. A server factory, whose
set lives as long as the server, calls :func:`build_clients` and hands its ``close`` to the
app's shutdown.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from flywheel.errors import StoreUnavailableError
from flywheel.file_modes import private_home
from flywheel.settings import Settings

if TYPE_CHECKING:
    from feedback.pii import Scrubber
    from feedback.store import FeedbackStore
    from registry.routes import RouteStore
    from registry.tracking import Registry
    from registry.vllm_admin import VllmAdminClient

_LAZY = ("store", "routes", "registry", "scrubber", "redis")


class Clients:
    """The clients one process (a command, a flow run, a server worker) uses.

    ``store``, ``routes``, ``registry``, ``scrubber`` and ``redis`` are each built once, on
    first use, by the factory given for it (thread-safe: a flow's tasks share the set);
    :meth:`vllm_admin` gives a client to one vLLM replica, which its caller closes (``with
    clients.vllm_admin(url) as client``). :meth:`close` releases the store's connections;
    the Redis client is asynchronous and is closed by its user on its own event loop (the
    gateway's rate limiter, at shutdown).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        store: Callable[[], FeedbackStore],
        routes: Callable[[FeedbackStore, Callable[[], datetime] | None], RouteStore],
        registry: Callable[[], Registry],
        scrubber: Callable[[], Scrubber],
        vllm_admin: Callable[[str], VllmAdminClient],
        redis: Callable[[], Any] = lambda: None,
    ) -> None:
        self.settings = settings
        self._factories: dict[str, Callable[[], Any]] = {
            "store": store,
            "routes": lambda: routes(self.store, None),
            "registry": registry,
            "scrubber": scrubber,
            "redis": redis,
        }
        self._routes = routes
        self._vllm_admin = vllm_admin
        self._built: dict[str, Any] = {}
        # One lock per client: the scrubber loading spaCy must not hold up the store.
        self._locks = {name: threading.Lock() for name in _LAZY}

    def _get(self, name: str) -> Any:
        with self._locks[name]:
            if name not in self._built:
                self._built[name] = self._factories[name]()
            return self._built[name]

    @property
    def store(self) -> FeedbackStore:
        """The feedback store, migrated to the newest schema when first used."""
        store: FeedbackStore = self._get("store")
        return store

    @property
    def routes(self) -> RouteStore:
        """The routing tables, kept in the feedback store."""
        routes: RouteStore = self._get("routes")
        return routes

    def routes_stamped(self, when: datetime) -> RouteStore:
        """The routing tables, their changes stamped ``when`` (a decision's time)."""
        return self._routes(self.store, lambda: when)

    @property
    def registry(self) -> Registry:
        """The MLflow registry (runs, versions, aliases) of the settings' home."""
        registry: Registry = self._get("registry")
        return registry

    @property
    def scrubber(self) -> Scrubber:
        """The PII scrubber of ``settings.scrubber`` (spaCy and jieba load on first use)."""
        scrubber: Scrubber = self._get("scrubber")
        return scrubber

    @property
    def redis(self) -> Any:
        """The asynchronous Redis client gateway replicas share (``None`` without
        ``FLYWHEEL_REDIS_URL``: each process keeps its own counters)."""
        return self._get("redis")

    def vllm_admin(self, url: str) -> VllmAdminClient:
        """A new admin client to the vLLM replica at ``url``; the caller closes it."""
        return self._vllm_admin(url)

    def built(self) -> frozenset[str]:
        """The names of the clients built so far."""
        return frozenset(self._built)

    def close(self) -> None:
        """Release the store's pooled connections (a later use opens it again, with its
        routing tables); the other clients hold no connection and stay built."""
        with self._locks["routes"], self._locks["store"]:  # the order routes takes them
            store = self._built.pop("store", None)
            self._built.pop("routes", None)
        if store is not None:
            store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def build_clients(settings: Settings, *, migrate: bool = True) -> Clients:
    """The real clients for ``settings``: the configured store (brought to the newest schema
    unless ``migrate`` is False; unreachable: :class:`StoreUnavailableError` with its URL,
    password hidden), the routing tables in it, the MLflow registry of ``settings.home``
    (``FLYWHEEL_MLFLOW_TRACKING_URI``), the scrubber of ``settings.scrubber``, vLLM admin
    clients, and Redis when ``FLYWHEEL_REDIS_URL`` is set (with the gateway's timeouts)."""

    def store() -> FeedbackStore:
        from sqlalchemy.exc import OperationalError

        from feedback.store import FeedbackStore

        try:
            return FeedbackStore.open(settings, migrate=migrate)
        except OperationalError as exc:
            raise StoreUnavailableError(store_error(settings, exc)) from None

    def routes(store: FeedbackStore, clock: Callable[[], datetime] | None) -> RouteStore:
        from registry.routes import RouteStore

        return RouteStore(store.engine, clock=clock)

    def registry() -> Registry:
        from registry.tracking import Registry

        private_home(settings.home)
        return Registry.for_home(settings.home, settings.mlflow_tracking_uri)

    def scrubber() -> Scrubber:
        from feedback.pii import build_scrubber
        from feedback.pii.product_names import deployment_names

        return build_scrubber(settings.scrubber, product_names=deployment_names(settings))

    def vllm_admin(url: str) -> VllmAdminClient:
        from registry.vllm_admin import VllmAdminClient

        return VllmAdminClient(url)

    def redis() -> Any:
        if settings.redis_url is None or not settings.redis_url.get_secret_value():
            return None
        import redis.asyncio

        timeout_s = settings.gateway.redis_timeout_s
        # A Redis slower than this counts as down: limits fall back to this process rather
        # than hold every request.
        return redis.asyncio.Redis.from_url(
            settings.redis_url.get_secret_value(),
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            decode_responses=True,
        )

    return Clients(
        settings,
        store=store,
        routes=routes,
        registry=registry,
        scrubber=scrubber,
        vllm_admin=vllm_admin,
        redis=redis,
    )


_IN_USE: ContextVar[Clients | None] = ContextVar("flywheel_clients", default=None)


@contextmanager
def clients_in_use(clients: Clients) -> Iterator[Clients]:
    """Run the block with ``clients`` as the set :func:`open_clients` yields (in this
    context: commands and flows called from it use them; the caller closes them)."""
    token = _IN_USE.set(clients)
    try:
        yield clients
    finally:
        _IN_USE.reset(token)


@contextmanager
def open_clients(settings: Settings, *, migrate: bool = True) -> Iterator[Clients]:
    """The clients of an edge (a command, a flow run): the set a caller put in use with
    :func:`clients_in_use`, left open; else the real set for ``settings``, closed at the
    block's end."""
    in_use = _IN_USE.get()
    if in_use is not None:
        yield in_use
        return
    with build_clients(settings, migrate=migrate) as clients:
        yield clients


def store_error(settings: Settings, exc: Exception) -> str:
    """Why the store could not be reached, with its URL (password hidden)."""
    reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
    return f"cannot reach the feedback store at {shown_store_url(settings)}: {reason}"


def shown_store_url(settings: Settings) -> str:
    """The store URL with the password hidden."""
    from sqlalchemy.engine import make_url

    return make_url(settings.resolved_database_url).render_as_string(hide_password=True)
