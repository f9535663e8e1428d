"""Shared fixtures: settings on a temporary home, and a fresh PostgreSQL database per test."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from flywheel.settings import Settings, load_settings

# Property tests check properties, not speed: hypothesis's 200 ms deadline per example fails
# them on a loaded 2-core CI machine (speed is measured in the benchmarks).
hypothesis_settings.register_profile("flywheel", deadline=None)
hypothesis_settings.load_profile("flywheel")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
POSTGRES_ADMIN_URL = os.environ.get(
    "FLYWHEEL_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def pytest_configure(config: pytest.Config) -> None:
    """Prefect reads its settings once, at import: quiet, offline defaults and a private
    home for the whole session (values already in the environment win)."""
    import atexit
    import shutil
    import tempfile

    if "PREFECT_HOME" not in os.environ:
        home = tempfile.mkdtemp(prefix="flywheel-prefect-")
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        os.environ["PREFECT_HOME"] = home
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    if config.getoption("verbose") > 0:
        config.pluginmanager.register(_Elapsed(config), "flywheel-elapsed")


# Epoch seconds after which no slow test starts (CI sets it from its own time limit: on a
# 2-core CPU without AVX-512 the slow tier's trainings run in float32, several times slower,
# and a run past the limit lands nothing).
SLOW_TIER_DEADLINE = "FLYWHEEL_SLOW_TIER_DEADLINE"


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip, saying so, a slow test that would start after the slow tier's deadline."""
    deadline = os.environ.get(SLOW_TIER_DEADLINE)
    if deadline and item.get_closest_marker("slow") is not None and time.time() > float(deadline):
        pytest.skip(f"{SLOW_TIER_DEADLINE} has passed: no time left in CI's budget to start it")


class _Elapsed:
    """With ``-v``, each test's line ends with the minutes since the run began: a run that
    CI stops at its time limit still shows where the time went (``--durations`` is printed
    only at the end)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.started = time.monotonic()

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write(f" [{(time.monotonic() - self.started) / 60:.1f} min]")


def shared_file(relative: str) -> Path:
    """A file of ../shared/data, or a clean skip when this checkout has none."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"{path} is absent (public test data lives beside the repo, not in it)")
    return path


def services_required() -> bool:
    """CI sets FLYWHEEL_REQUIRE_SERVICES=1 so a missing service fails instead of skipping."""
    return os.environ.get("FLYWHEEL_REQUIRE_SERVICES") == "1"


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings on an empty home folder with the embedded SQLite store."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    return load_settings()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A brand-new PostgreSQL database on the real server, dropped afterwards."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError

    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"flywheel_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        if services_required():
            raise
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL}: {exc.orig}")
    url = make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


REDIS_URL = os.environ.get("FLYWHEEL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def redis_url() -> str:
    """The real Redis of this machine, or a clean skip (a failure under CI) without one."""
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except redis.exceptions.ConnectionError as exc:
        if services_required():
            raise
        pytest.skip(f"Redis is not reachable at {REDIS_URL}: {exc}")
    return REDIS_URL
