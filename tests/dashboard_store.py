"""A generated store for the feedback page's tests: served traffic, a dataset, API keys.

Shared by the app, PII, PostgreSQL and browser tests. The store is filled once
per module (``build_page_home``); the real scrubber is built once per session.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from feedback.rollup import feedback_signal, floor_hour
from feedback.schema import feedback_table, interactions_table
from feedback.store import FeedbackStore
from flywheel.settings import Settings, load_settings
from gateway.keys import add_key
from lab.simulation.stored_traffic import PlantedPii, SimulationSettings
from registry.routes import RouteStore
from tests.served_traffic import fill_demo_store

if TYPE_CHECKING:
    from fastapi import FastAPI

    from feedback.pii import Scrubber

START = datetime(2026, 11, 1, tzinfo=UTC)
LINES = ("customer_service", "medical", "legal")
TRAINED_LINE = "legal"


@cache
def shared_scrubber() -> Scrubber:
    """The project's scrubber, loaded once per test session (spaCy + jieba: a second or two)."""
    from feedback.pii import build_scrubber

    return build_scrubber()


@dataclass
class PageHome:
    """A flywheel home with a filled store, a dataset for one line, and API keys."""

    settings: Settings
    store: FeedbackStore
    planted: list[PlantedPii]
    keys: dict[str, str]

    def app(self, **overrides: Any) -> FastAPI:
        """The feedback page on this home (rollup folds everything at once: no grace)."""
        from dashboard.app import create_app
        from flywheel.settings.dashboard import DashboardSettings

        options = {"rollup_grace_s": 0, "rollup_interval_s": 0, "page_size": 20} | overrides
        return create_app(
            self.settings,
            DashboardSettings(**options),
            store=self.store,
            routes=RouteStore(self.store.engine),
            keys_file=self.settings.home / "gateway-keys.yaml",
            scrubber_factory=shared_scrubber,
        )

    def bearer(self, name: str) -> dict[str, str]:
        """An Authorization header with one of the keys."""
        return {"Authorization": f"Bearer {self.keys[name]}"}


def build_page_home(
    home: Path,
    *,
    requests: int = 300,
    database_url: str | None = None,
    pii_share: float = 0.3,
    seed: int = 11,
    with_dataset: bool = True,
    with_keys: bool = True,
    days: int = 3,
) -> PageHome:
    """Fill a store under ``home`` with served traffic over ``days`` days."""
    settings = load_settings(
        home=home, database_url=database_url or f"sqlite:///{home / 'flywheel.db'}"
    )
    store = FeedbackStore.open(settings)
    simulation = SimulationSettings(
        requests=requests,
        seed=seed,
        start=START,
        span=timedelta(days=days),
        pii_share=pii_share,
        business_lines=LINES,
    )
    simulator, report = fill_demo_store(store, simulation, track_pii=True)
    assert report.quarantined == 0, report.rejections
    if with_dataset:
        from feedback.cleaning import clean_line, scrub_with
        from flywheel.settings.cleaning import CleaningSettings

        clean_line(
            store.engine,
            TRAINED_LINE,
            scrub=scrub_with(shared_scrubber()),
            settings=CleaningSettings(),
            dataset_root=settings.datasets_dir,
        )
    keys: dict[str, str] = {}
    if with_keys:
        path = settings.home / "gateway-keys.yaml"
        keys = {
            "support": add_key(path, "support", ["customer_service"]),
            "counsel": add_key(path, "counsel", ["legal", "medical"]),
            "admin": add_key(path, "admin", ["*"]),
        }
    return PageHome(settings, store, list(simulator.planted), keys)


def recount(store: FeedbackStore) -> Counter[tuple[str, str, datetime, str]]:
    """The rollup's numbers straight from the raw tables (a request once per signal)."""
    f = feedback_table.c
    counts: Counter[tuple[str, str, datetime, str]] = Counter()
    with store.engine.connect() as connection:
        served = {}
        for row in connection.execute(select(interactions_table)):
            key = (row.business_line, row.adapter_name or "base", floor_hour(row.created_at))
            served[row.request_id] = key
            counts[(*key, "requests")] += 1
            if row.status != "ok":
                counts[(*key, "errors")] += 1
        seen: set[tuple[str, str, str | None]] = set()
        for row in connection.execute(select(f.request_id, f.type, f.outcome)):
            if row.type != "rank" and (row.request_id, row.type, row.outcome) not in seen:
                seen.add((row.request_id, row.type, row.outcome))
                counts[(*served[row.request_id], feedback_signal(row.type, row.outcome))] += 1
    return counts
