"""``flywheel schedule``: a local Prefect server and the two deployments, in one command.

Prefect's ephemeral API runs flows but has no scheduler, so schedules need a
server: this starts ``prefect server start`` on loopback (its database under
``FLYWHEEL_HOME/prefect``), then serves the nightly deployment (cron, 02:00 by
default) and the canary deployment (every N minutes, a new run cancelled while
one is still going) until interrupted. The deployments are declared once, in
``flows.deployments``, from which ``prefect.yaml`` (docker-compose's work pools) is
generated. A Prefect server flywheel starts, or prints the command of, never tries to
send telemetry (these machines are often offline): :data:`flows.prefect_env.TELEMETRY_OFF`.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from flows.prefect_env import TELEMETRY_OFF
from flywheel.processes import service_process


def prefect_server_command(home: Path) -> str:
    """The shell command that starts Prefect's server (and UI) on flywheel's Prefect
    database under ``home``, telemetry off: what the demo prints for reading its runs."""
    variables = {"PREFECT_HOME": str(home), **TELEMETRY_OFF}
    words = [f"{name}={shlex.quote(value)}" for name, value in variables.items()]
    return " ".join([*words, ".venv/bin/prefect", "server", "start"])


@contextmanager
def prefect_server(home: Path, port: int, timeout_s: float = 180.0) -> Iterator[str]:
    """``prefect server start`` on 127.0.0.1:``port``; yields its API URL."""
    env = {**os.environ, "PREFECT_HOME": str(home), **TELEMETRY_OFF}
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
    """Serve the scheduled deployments of ``flows.deployments`` until interrupted (blocks):
    the nightly at ``cron`` in ``timezone``, the canary every ``canary_every``."""
    from prefect import serve

    from flows.deployments import served_deployments

    serve(*served_deployments(cron=cron, timezone=timezone, canary_every=canary_every))
