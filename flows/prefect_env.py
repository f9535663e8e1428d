"""Prefect's environment for flywheel, set before Prefect is imported (it reads it once).

Prefect keeps its database under ``FLYWHEEL_HOME/prefect``, and there the one
result it persists: the training flow's (``flows.training``), which the nightly
reads back from another process. No other task or flow result is persisted or
cached by Prefect, on purpose: a rerun's idempotence is the domain's — the
store window a line's run reopens (``feedback.watermarks``), the dataset's
content hash, and the registered version found by dataset, recipe and base
model (``registry.tracking.Registry.find_version``) — so a crashed night redoes
nothing it finished, whoever reruns it, with or without Prefect's cache.
Telemetry is off (these machines and many users' are offline); the ephemeral
API server gets a start-up timeout that a busy 2-core machine can meet.
Values already in the environment win.
"""

from __future__ import annotations

import os
import sys

from flywheel.file_modes import private_home
from flywheel.settings import Settings

DEFAULTS = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_UI_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "DASK_LOGGING__DISTRIBUTED": "warning",
}


def configure_prefect(settings: Settings) -> None:
    """Point Prefect at ``FLYWHEEL_HOME/prefect`` and quiet it; call before importing flows."""
    if "prefect" in sys.modules and "PREFECT_HOME" not in os.environ:
        # Too late to move its home; say so instead of silently using ~/.prefect.
        raise RuntimeError("configure_prefect() must run before prefect is imported")
    home = private_home(settings.home) / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(home))
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
