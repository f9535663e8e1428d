"""The clients of one process, built in one place from one settings tree.

:func:`build_clients` is the one function that constructs the services flywheel talks
to: the feedback store, its routing tables, the MLflow registry, vLLM admin clients, the
PII scrubber and Redis, each from :class:`~flywheel.settings.Settings`. Nothing else in
the product constructs them (``tests/unit/test_clients_built_once.py`` reads the code for
it); the layers below take them as arguments.

Each is built to fail fast: a service that does not answer within its connection timeout
is its own :class:`~flywheel.errors.ServiceUnavailableError` (exit code, URL with the
password hidden, the setting to change; :mod:`flywheel.reachability`), not minutes of a
library's retries. An MLflow server is asked once before MLflow is even imported.

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

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from flywheel.errors import StoreUnavailableError
from flywheel.file_modes import private_home
from flywheel.reachability import MLFLOW, REDIS, check_http, shown_url, unavailable
from flywheel.settings import Settings

if TYPE_CHECKING:
    from feedback.pii import Scrubber
    from feedback.store import FeedbackStore
    from registry.replicas import ReplicaStore
    from registry.routes import RouteStore
    from registry.tracking import Registry
    from registry.vllm_admin import VllmAdminClient

_LAZY = ("store", "routes", "registry", "scrubber", "redis")

# MLflow's own HTTP settings where the user set none: its defaults (120 s a request, 7
# retries with a backoff factor of 2) hold a command about four minutes on a server that
# went away. A server that is down from the start is caught sooner, by the check before
# MLflow's first request (FLYWHEEL_MLFLOW_TIMEOUT_S).
MLFLOW_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}


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

    @property
    def replicas(self) -> ReplicaStore:
        """The vLLM replicas' records (base model, LoRA limits), kept in the feedback store."""
        from registry.replicas import ReplicaStore

        return ReplicaStore(self.store.engine)

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
    (``FLYWHEEL_MLFLOW_TRACKING_URI``; a server checked first, :func:`check_mlflow`), the
    scrubber of ``settings.scrubber``, vLLM admin clients (the gateway's connect timeout),
    and Redis when ``FLYWHEEL_REDIS_URL`` is set (with the gateway's timeouts)."""

    def store() -> FeedbackStore:
        from sqlalchemy.exc import OperationalError

        # Every package's tables declared, so the store's erasures reach each one.
        import composition.tables  # noqa: F401
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

    def checked_registry() -> Registry:
        check_mlflow(settings)
        return registry()

    def scrubber() -> Scrubber:
        from feedback.pii import build_scrubber
        from feedback.pii.product_names import deployment_names

        return build_scrubber(settings.scrubber, product_names=deployment_names(settings))

    def vllm_admin(url: str) -> VllmAdminClient:
        from registry.vllm_admin import VllmAdminClient

        return VllmAdminClient(
            url,
            connect_timeout=settings.gateway.connect_timeout_s,
            url_setting="FLYWHEEL_GATEWAY_UPSTREAMS",
            connect_timeout_setting="FLYWHEEL_GATEWAY_CONNECT_TIMEOUT_S",
        )

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
        registry=checked_registry,
        scrubber=scrubber,
        vllm_admin=vllm_admin,
        redis=redis,
    )


def check_mlflow(settings: Settings) -> None:
    """Before MLflow's first request to a tracking server: give MLflow's HTTP client
    timeouts and retries of a few seconds (:data:`MLFLOW_HTTP_DEFAULTS`; a value the user
    set wins), and raise :class:`~flywheel.errors.MlflowUnavailableError` (exit 4) unless
    the server answers within ``FLYWHEEL_MLFLOW_TIMEOUT_S``. A local store needs neither."""
    uri = settings.mlflow_tracking_uri
    if not uri or not uri.startswith(("http://", "https://")):
        return
    for name, value in MLFLOW_HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    check_http(MLFLOW, uri, settings.mlflow_timeout_s)


def check_redis_url(settings: Settings) -> None:
    """Raise :class:`~flywheel.errors.RedisUnavailableError` (exit 6) unless the Redis of
    ``FLYWHEEL_REDIS_URL``, when set, answers within the gateway's Redis timeout: a server
    that starts on a wrong URL would count its rate limits alone without a word."""
    if settings.redis_url is None or not settings.redis_url.get_secret_value():
        return
    import redis
    import redis.exceptions

    url = settings.redis_url.get_secret_value()
    timeout_s = settings.gateway.redis_timeout_s
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    except (redis.exceptions.AuthenticationError, redis.exceptions.ResponseError) as exc:
        # It answered: the URL's password or database number is what to change.
        raise REDIS.error(
            f"Redis at {shown_url(url)} refused flywheel: {exc} ({REDIS.url_setting})"
        ) from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        raise unavailable(REDIS, url, exc, timeout_s) from None
    finally:
        client.close()


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
    if "timeout" in reason:  # libpq's "connection timeout expired"
        reason += (
            f" after {settings.store.connect_timeout_s} s "
            "(FLYWHEEL_STORE_CONNECT_TIMEOUT_S sets how long to wait)"
        )
    return (
        f"cannot reach the feedback store at {shown_store_url(settings)} "
        f"(FLYWHEEL_DATABASE_URL): {reason}"
    )


def shown_store_url(settings: Settings) -> str:
    """The store URL with the password hidden."""
    from sqlalchemy.engine import make_url

    return make_url(settings.resolved_database_url).render_as_string(hide_password=True)
