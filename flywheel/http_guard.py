"""The HTTP protocol both servers run under (gateway and feedback page): uvicorn's httptools
protocol with two guards it lacks, applied before any application code, so before
authentication:

- **header size**: a request whose request line and headers exceed ``MAX_HEADER_BYTES``
  is answered 431 and the connection closed (httptools would buffer any amount);
- **header time**: a request whose headers have not all arrived ``HEADER_TIMEOUT_S``
  after its first byte (or after the connection opened) is answered 408 and closed, so
  slow clients (slowloris) cannot hold connections open.

A body that stalls is the application's to cut (``flywheel.bodies.read_body``), and an
idle kept-alive connection uvicorn's own ``timeout_keep_alive``'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEADER_BYTES = 64 * 1024
HEADER_TIMEOUT_S = 10.0
_END = b"\r\n\r\n"
logger = logging.getLogger(__name__)


def _refusal(status: int, reason: str, message: str) -> bytes:
    kind = "invalid_request_error"
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header size limit and a header timeout."""

    max_header_bytes = MAX_HEADER_BYTES
    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """A new connection: its first request's headers are on the clock from now."""
        super().connection_made(transport)
        self._head_bytes = 0
        self._tail = b""
        self._in_head = True
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the clock with the connection."""
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
        self._head_timer = None

    def _refuse(self, status: int, reason: str, message: str) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(_refusal(status, reason, message))
            self.transport.close()

    def _too_slow(self) -> None:
        self._head_timer = None
        if self._in_head:
            self._refuse(
                408,
                "Request Timeout",
                f"the request headers did not arrive within {self.header_timeout_s:g} s",
            )

    def data_received(self, data: bytes) -> None:
        """Count the bytes of the headers before the parser buffers them."""
        if self._in_head:
            self._arm()
            window = self._tail + data
            end = window.find(_END)
            if end < 0:
                self._head_bytes += len(data)
                self._tail = window[-(len(_END) - 1) :]
            else:
                self._head_bytes += end + len(_END) - len(self._tail)
            if self._head_bytes > self.max_header_bytes:
                self._refuse(
                    431,
                    "Request Header Fields Too Large",
                    f"the request line and headers are over {self.max_header_bytes} bytes",
                )
                return
        super().data_received(data)

    def on_headers_complete(self) -> None:
        """The headers are in: the clock stops; the body is the application's to time."""
        self._in_head = False
        self._head_bytes = 0
        self._tail = b""
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """The next request on this connection starts its own count at its first byte."""
        super().on_message_complete()
        self._in_head = True


def where_it_failed(trace: TracebackType | None, kind: type[BaseException]) -> str:
    """An exception as a log line may show it: its type and the innermost frame's file and
    line, never its message (which may quote a prompt or stored text)."""
    frames = traceback.extract_tb(trace) if trace is not None else []
    place = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{kind.__name__}{place} (message withheld)"


class WithheldTracebacks(logging.Filter):
    """Keeps an exception's message and traceback out of the server's log: Starlette re-raises
    every unhandled exception after the app's own handler answered 500, and uvicorn then
    logs it whole — a message that may quote a prompt or stored text. The log keeps the
    exception's type and where the app's handler said it happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Strip the exception of a record that carries one."""
        if record.exc_info and record.exc_info[0] is not None:
            record.msg = (
                f"{record.getMessage()}: {where_it_failed(record.exc_info[2], record.exc_info[0])}"
            )
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


def withhold_tracebacks() -> None:
    """Install :class:`WithheldTracebacks` on uvicorn's error log (once per process; the
    app factories call it, so every worker process has it)."""
    log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, WithheldTracebacks) for f in log.filters):
        log.addFilter(WithheldTracebacks())


def server_options() -> dict[str, Any]:
    """The uvicorn options both servers run with."""
    return {"http": GuardedHttpToolsProtocol, "timeout_keep_alive": 5}
