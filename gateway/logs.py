"""The gateway's log lines name the request they are about: line, adapter and request id.

The request path sets :data:`REQUEST_CONTEXT` once it knows the line, the adapter
and the request id; tasks spawned from it (a heal, a shadow request, a rate-limit
settlement) copy the context, so their lines carry the same ids. Lines from the
background loops (routes refresh, replica watch, the writer thread) show ``-``.
Messages never quote prompts or answers; the ids are the gateway's own or
validated names.
"""

from __future__ import annotations

import logging
import sys
from contextvars import ContextVar
from dataclasses import dataclass

LOG_FORMAT = (
    "%(asctime)s %(levelname)s %(name)s line=%(business_line)s adapter=%(adapter)s "
    "request=%(request_id)s %(message)s"
)


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a log line says about the request it was written for."""

    business_line: str
    adapter: str | None = None
    request_id: str | None = None


REQUEST_CONTEXT: ContextVar[RequestContext | None] = ContextVar("request_context", default=None)


class RequestContextFilter(logging.Filter):
    """Adds ``business_line``, ``adapter`` and ``request_id`` to every record ("-" when
    the line was not written for a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = REQUEST_CONTEXT.get()
        record.business_line = context.business_line if context else "-"
        record.adapter = (context.adapter if context else None) or "-"
        record.request_id = (context.request_id if context else None) or "-"
        return True


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is now (servers and tests swap it)."""

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def configure_gateway_logging(level: int = logging.INFO) -> logging.Handler:
    """One handler on the ``gateway`` loggers with the request's ids in every line (once
    per process; the app factory calls it, so every worker has it)."""
    log = logging.getLogger("gateway")
    for handler in log.handlers:
        if any(isinstance(f, RequestContextFilter) for f in handler.filters):
            return handler
    handler = _CurrentStderr()
    handler.addFilter(RequestContextFilter())
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    log.addHandler(handler)
    if log.level == logging.NOTSET or log.level > level:
        log.setLevel(level)
    return handler
