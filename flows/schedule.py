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
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from flywheel.processes import service_process


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
    argv = [
        sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip
    api = f"http://127.0.0.1:{port}/api"
    with service_process(
        argv,
        name="prefect server",
        ready_url=f"{api}/health",
        log_path=home / "server.log",
        env=env,
        timeout_s=timeout_s,
    ):
        yield api


def serve_schedules(cron: str, timezone: str, canary_every: timedelta) -> None:
    """Serve the nightly and canary deployments until interrupted (blocks)."""
    from prefect import serve
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.schedules import Cron, Interval

    from flows.canary import canary_watch
    from flows.nightly import nightly

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
