"""The per-line lease: one nightly run or one training of a line at a time, whoever starts it.

The lease lives in the store (``feedback.watermarks``), so every process and machine that
shares the store agrees; it is renewed in the background while its holder works and runs
out ``LEASE_S`` after the last renewal when the holder dies.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from feedback.watermarks import WatermarkStore
from flywheel.errors import FlywheelError

LEASE_S = 600.0
logger = logging.getLogger(__name__)


class LineBusyError(FlywheelError):
    """Another run holds the line."""

    exit_code = 75  # EX_TEMPFAIL: try again later


def lease_owner() -> str:
    """A holder id that names this host and process (shown to whoever finds the line busy)."""
    return f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@contextmanager
def line_lease(watermarks: WatermarkStore, line: str, owner: str) -> Iterator[None]:
    """Hold the line's lease while the block runs (renewed in the background)."""
    if not watermarks.acquire(line, owner, LEASE_S, datetime.now(UTC)):
        raise LineBusyError(
            f"another run (a nightly or a training) holds {line}; try again when it finishes"
        )
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(LEASE_S / 3):
            try:
                if not watermarks.renew(line, owner, LEASE_S, datetime.now(UTC)):
                    logger.error("lost the lease on %s: another run may start", line)
            except Exception:  # a store hiccup: try again at the next beat
                logger.exception("could not renew the lease on %s", line)

    keeper = threading.Thread(target=renew, name=f"lease-{line}", daemon=True)
    keeper.start()
    try:
        yield
    finally:
        stop.set()
        keeper.join(5)
        watermarks.release(line, owner)
