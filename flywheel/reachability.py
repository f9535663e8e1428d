"""Whether a service flywheel needs answers, asked quickly before any long work.

A client library left to itself waits long on a server that is down (MLflow retries for
about four minutes, a blackholed address holds a TCP connect for two) and then fails with
its own words. The edges that build a client ask here first, within the service's
connection timeout, and a service that does not answer becomes the service's
:class:`~flywheel.errors.ServiceUnavailableError`: its own exit code and a message with
the URL (password hidden), what happened and the setting to change, e.g. ``MLflow at
http://127.0.0.1:5999 refused the connection (FLYWHEEL_MLFLOW_TRACKING_URI); is the server
running?``. Any answer at all counts as reachable (a 401 or a 404 is the client's to
explain); only a connection refused, a timeout or a name that does not resolve fails here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from flywheel.errors import (
    MlflowUnavailableError,
    PrefectUnavailableError,
    RedisUnavailableError,
    ServiceUnavailableError,
)

if TYPE_CHECKING:
    import httpx

# Query parameters whose value is a credential (a token in a Redis or MLflow URL).
_SECRET_PARAMS = ("password", "token", "secret", "key", "auth")
HIDDEN = "***"


@dataclass(frozen=True)
class Service:
    """A service as a user configures it: its name, the setting that holds its URL, the
    one that sets how long to wait for it, and the error (exit code) of its absence."""

    name: str
    url_setting: str
    timeout_setting: str
    error: type[ServiceUnavailableError]


MLFLOW = Service(
    "MLflow", "FLYWHEEL_MLFLOW_TRACKING_URI", "FLYWHEEL_MLFLOW_TIMEOUT_S", MlflowUnavailableError
)
PREFECT = Service(
    "Prefect's API", "PREFECT_API_URL", "FLYWHEEL_PREFECT_TIMEOUT_S", PrefectUnavailableError
)
REDIS = Service(
    "Redis", "FLYWHEEL_REDIS_URL", "FLYWHEEL_GATEWAY_REDIS_TIMEOUT_S", RedisUnavailableError
)


def shown_url(url: str) -> str:
    """``url`` fit to print: the password of its user part and credential-like query
    values replaced by ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        name, has_password, _ = user.partition(":")
        netloc = f"{name}:{HIDDEN}@{host}" if has_password else f"{user}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        hidden = [
            (key, HIDDEN if any(word in key.lower() for word in _SECRET_PARAMS) else value)
            for key, value in pairs
        ]
        query = urlencode(hidden, safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _refused(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception it was raised from is a refused connection."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ConnectionRefusedError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return "Connection refused" in str(exc)


def what_happened(exc: BaseException, timeout_s: float) -> str:
    """What a failed connection attempt means, in words: ``refused the connection``, ``did
    not answer within 10 s``, or ``could not be reached (<the reason>)``."""
    import httpx

    if isinstance(exc, httpx.ConnectTimeout):
        return f"did not accept a connection within {timeout_s:g} s"
    if isinstance(exc, httpx.TimeoutException | TimeoutError) or type(exc).__name__ == (
        "TimeoutError"  # redis.exceptions.TimeoutError, a subclass of neither
    ):
        return f"did not answer within {timeout_s:g} s"
    if _refused(exc):
        return "refused the connection"
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"could not be reached ({reason})"


def unavailable(
    service: Service, url: str, exc: BaseException, timeout_s: float
) -> ServiceUnavailableError:
    """The error that says ``service`` at ``url`` did not answer (from ``exc``)."""
    happened = what_happened(exc, timeout_s)
    message = (
        f"{service.name} at {shown_url(url)} {happened} ({service.url_setting}); "
        "is the server running?"
    )
    if "within" in happened:
        message += f" ({service.timeout_setting} sets how long to wait)"
    return service.error(message)


def check_http(
    service: Service,
    url: str,
    timeout_s: float,
    *,
    path: str = "/health",
    transport: httpx.BaseTransport | None = None,
) -> None:
    """Raise the service's error unless ``url`` + ``path`` gives any HTTP answer within
    ``timeout_s`` (to connect, and again to answer); one try, no retries."""
    import httpx

    try:
        with httpx.Client(timeout=timeout_s, transport=transport) as client:
            client.get(url.rstrip("/") + path)
    except httpx.TransportError as exc:
        raise unavailable(service, url, exc, timeout_s) from None


def check_prefect_api(timeout_s: float) -> None:
    """Raise :class:`~flywheel.errors.PrefectUnavailableError` unless the Prefect server
    this process is pointed at (``PREFECT_API_URL``, else as Prefect resolves it from its
    profile) answers within ``timeout_s``; without one, Prefect runs its own ephemeral API
    and there is nothing to ask. Call once Prefect's environment is set."""
    url = os.environ.get("PREFECT_API_URL")
    if url is None:  # asked first: importing Prefect takes seconds
        from prefect.settings import get_current_settings

        url = get_current_settings().api.url
    if url:
        check_http(PREFECT, url, timeout_s)
