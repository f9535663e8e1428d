"""Prefect's environment for flywheel, set before Prefect is imported (it reads it once).

Prefect keeps its database under ``FLYWHEEL_HOME/prefect``, and there the one
result it persists: the training flow's (``flows.training``), which the nightly
reads back from another process. No other task or flow result is persisted or
cached by Prefect, on purpose: a rerun's idempotence is the domain's — the
store window a line's run reopens (``feedback.watermarks``), the dataset's
content hash, and the registered version found by dataset, recipe and base
model (``registry.tracking.Registry.find_version``) — so a crashed night redoes
nothing it finished, whoever reruns it, with or without Prefect's cache.
A flow run's logs are where a night is read: the run logger's lines and the
project's own loggers' (:data:`RUN_LOGS`) go to Prefect's API at INFO, while the
terminal stays at WARNING. Telemetry is off (these machines and many users' are
offline); the ephemeral API server gets a start-up timeout that a busy 2-core machine
can meet. Values already in the environment win.
"""

from __future__ import annotations

import os
import sys

from flywheel.file_modes import private_home
from flywheel.reachability import check_prefect_api
from flywheel.settings import Settings

# Prefect's server sends usage telemetry, and its client analytics events, unless told not
# to; offline, each attempt logs an error. Set wherever flywheel starts a Prefect server or
# prints the command that starts one (flows.schedule).
TELEMETRY_OFF = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}

# The packages a flow run calls into: what their loggers say shows in the run's logs.
PROJECT_LOGGERS = ("flows", "feedback", "registry", "eval", "training", "composition", "flywheel")

# A flow run's INFO lines go to Prefect's API (the run's page): the run logger's, and the
# project's loggers' through Prefect's API handler (PREFECT_LOGGING_EXTRA_LOGGERS). Prefect
# gives those loggers a handler but no level, so the root level lets their INFO through: no
# other setting reaches a logger Prefect's logging config does not name, and a flow run
# started by a worker or `flywheel schedule` reads only its environment. The terminal stays
# at WARNING (the CLI prints its own progress); outside a run the loggers send nothing.
RUN_LOGS = {
    "PREFECT_LOGGING_LEVEL": "INFO",
    "PREFECT_LOGGING_ROOT_LEVEL": "INFO",
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
    "PREFECT_LOGGING_EXTRA_LOGGERS": ",".join(PROJECT_LOGGERS),
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
}

DEFAULTS = {
    **TELEMETRY_OFF,
    **RUN_LOGS,
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_UI_ENABLED": "false",
    "DASK_LOGGING__DISTRIBUTED": "warning",
}


def configure_prefect(settings: Settings, *, check_api: bool = True) -> None:
    """Point Prefect at ``FLYWHEEL_HOME/prefect``, its run logs at INFO and its terminal at
    WARNING; call before importing flows. A Prefect server it is pointed at
    (``PREFECT_API_URL``) must answer within ``FLYWHEEL_PREFECT_TIMEOUT_S`` (exit 5), unless
    ``check_api`` is False."""
    if "prefect" in sys.modules and "PREFECT_HOME" not in os.environ:
        # Too late to move its home; say so instead of silently using ~/.prefect.
        raise RuntimeError("configure_prefect() must run before prefect is imported")
    home = private_home(settings.home) / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(home))
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
    if check_api:
        check_prefect_api(settings.prefect_timeout_s)
