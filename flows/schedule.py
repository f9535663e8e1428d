"""``flywheel schedule``: a local Prefect server and the two deployments, in one command.

Prefect's ephemeral API runs flows but has no scheduler, so schedules need a
server: this starts ``prefect server start`` on loopback (its database under
``FLYWHEEL_HOME/prefect``), then serves the nightly deployment (cron, 02:00 by
default) and the canary deployment (every N minutes, a new run cancelled while
one is still going) until interrupted. docker-compose expresses the same two
deployments for a work pool (``prefect.yaml``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import httpx

from flywheel.errors import FlywheelError


@contextmanager
def prefect_server(home: Path, port: int, timeout_s: float = 180.0) -> Iterator[str]:
    """``prefect server start`` on 127.0.0.1:``port``; yields its API URL."""
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
    }
    env.pop("PREFECT_API_URL", None)
    home.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip
    with (home / "server.log").open("ab") as log:
        process = subprocess.Popen(  # noqa: S603 (our own argv, no shell)
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise FlywheelError(
                    f"prefect server exited ({process.returncode}): {home}/server.log"
                )
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise FlywheelError(f"prefect server did not start in {timeout_s:.0f} s")
            time.sleep(0.5)
        yield api
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def serve_schedules(cron: str, timezone: str, canary_every: timedelta) -> None:
    """Serve the nightly and canary deployments until interrupted (blocks)."""
    from prefect import serve
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.schedules import Cron, Interval

    from flows.nightly import canary_watch, nightly

    one_at_a_time = ConcurrencyLimitConfig(
        limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW
    )
    serve(
        nightly.to_deployment(
            name="nightly", schedule=Cron(cron, timezone=timezone), concurrency_limit=one_at_a_time
        ),
        canary_watch.to_deployment(
            name="canary", schedule=Interval(canary_every), concurrency_limit=one_at_a_time
        ),
    )
