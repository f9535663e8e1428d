"""Watermarks, line leases and the canary judge on the embedded store (no Prefect, no MLflow)."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from composition.recipes import packaged_recipes_dir
from composition.rollout import judge_canary
from feedback.store import FeedbackStore
from feedback.watermarks import WatermarkStore
from flywheel.settings import Settings, load_settings
from registry.decisions import canary_decisions
from registry.records import CanaryRecord
from registry.routes import RouteStore
from tests.fake_clients import fake_clients
from tests.reactions import arm_events
from tests.routing import set_canary, set_champion

T0 = datetime(2026, 11, 30, 2, 0, tzinfo=UTC)


@pytest.fixture
def rates_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Settings:
    """The packaged recipes with customer service's canary on the users' signal rates alone
    (no satisfaction test: these cases are about the rates' rule)."""
    folder = tmp_path / "recipes"
    shutil.copytree(packaged_recipes_dir(), folder, ignore=shutil.ignore_patterns("demo"))
    path = folder / "customer_service.yaml"
    recipe = yaml.safe_load(path.read_text())
    recipe.pop("canary", None)
    path.write_text(yaml.safe_dump(recipe))
    monkeypatch.setenv("FLYWHEEL_RECIPES_DIR", str(folder))
    return load_settings()


def test_a_rerun_gets_the_same_window_and_the_watermark_moves_only_at_the_end(
    settings: Settings,
) -> None:
    store = FeedbackStore.open(settings)
    marks = WatermarkStore(store.engine)
    first = marks.open_window("legal", T0)
    assert (first.since, first.until, first.resumed) == (None, T0, False)
    # The run crashed; the rerun an hour later works on the same window.
    again = marks.open_window("legal", T0 + timedelta(hours=1))
    assert (again.since, again.until, again.resumed) == (None, T0, True)
    marks.close_window(again, run_id="run-1", outcome="deployed", now=T0 + timedelta(hours=1))
    assert marks.watermarks()["legal"]["watermark"] == T0
    following = marks.open_window("legal", T0 + timedelta(days=1))
    assert (following.since, following.until) == (T0, T0 + timedelta(days=1))
    # Too few examples: the window is given back and the watermark stays.
    marks.release_window(following, outcome="skipped", now=T0 + timedelta(days=1))
    state = marks.watermarks()["legal"]
    assert (state["watermark"], state["pending_until"]) == (T0, None)
    store.close()


def test_one_run_per_line_holds_the_lease_and_a_dead_run_s_lease_expires(
    settings: Settings,
) -> None:
    store = FeedbackStore.open(settings)
    marks = WatermarkStore(store.engine)
    assert marks.acquire("legal", "run-a", 60, T0)
    assert not marks.acquire("legal", "run-b", 60, T0 + timedelta(seconds=30))
    assert marks.acquire("medical", "run-b", 60, T0)
    assert marks.renew("legal", "run-a", 60, T0 + timedelta(seconds=50))
    assert not marks.acquire("legal", "run-b", 60, T0 + timedelta(seconds=100))
    # run-a died without releasing: its lease runs out.
    assert marks.acquire("legal", "run-b", 60, T0 + timedelta(seconds=111))
    assert not marks.renew("legal", "run-a", 60, T0 + timedelta(seconds=112))
    marks.release("legal", "run-b")
    assert marks.acquire("legal", "run-c", 60, T0 + timedelta(seconds=113))
    store.close()


def _traffic(adapter: str, n: int, thumbs_down: int, start: datetime) -> list[dict[str, Any]]:
    return arm_events("customer_service", adapter, n, thumbs_down, start)


def test_the_canary_judge_waits_then_steps_up_and_records_every_look(
    rates_settings: Settings,
) -> None:
    settings = rates_settings
    store = FeedbackStore.open(settings)
    clients = fake_clients(settings, store=store)
    routes = RouteStore(store.engine)
    set_champion(routes, "customer_service", "customer_service-v1", actor="t")
    set_canary(routes, "customer_service", "customer_service-v2", 0.05, actor="t")
    since = routes.history("customer_service")[0].created_at
    start = since + timedelta(seconds=1)
    store.ingest(_traffic("customer_service-v2", 50, 2, start), source="t")
    early = judge_canary(settings, clients, "customer_service", now=start + timedelta(hours=2))
    assert early.action == "wait"
    assert "waiting for data" in early.reason
    store.ingest(_traffic("customer_service-v1", 6000, 300, start), source="t")
    store.ingest(
        [e for e in _traffic("customer_service-v2", 3000, 120, start) if "-v2-" in e["request_id"]],
        source="t",
    )
    later = judge_canary(settings, clients, "customer_service", now=start + timedelta(hours=3))
    assert later.action == "step_up", later.reason
    assert later.table is not None
    assert later.table.canary_fraction == 0.10
    assert later.numbers["canary"]["requests"] == 3000
    decisions = canary_decisions(store, "customer_service")
    assert [(d["look"], d["action"]) for d in decisions] == [(2, "step_up"), (1, "wait")]
    assert decisions[0]["numbers"]["checks"][0]["metric"] == "thumbs_down_rate"
    # A new share starts a new window: the next look is the first of it, and has no data.
    fresh = judge_canary(settings, clients, "customer_service", now=start + timedelta(hours=4))
    assert fresh.action == "wait"
    assert canary_decisions(store, "customer_service")[0]["look"] == 1
    store.close()


def test_the_canary_judge_rolls_a_worse_canary_back_at_once(
    rates_settings: Settings,
) -> None:
    settings = rates_settings
    store = FeedbackStore.open(settings)
    routes = RouteStore(store.engine)
    set_champion(routes, "customer_service", "customer_service-v1", actor="t")
    set_canary(routes, "customer_service", "customer_service-v2", 0.05, actor="t")
    start = routes.history("customer_service")[0].created_at + timedelta(seconds=1)
    store.ingest(_traffic("customer_service-v1", 4000, 200, start), source="t")
    store.ingest(_traffic("customer_service-v2", 600, 200, start), source="t")

    class Registry:  # the MLflow side is tested in the integration tier
        rejected: ClassVar[list[tuple[str, int, str]]] = []

        logged: ClassVar[list[tuple[int, CanaryRecord]]] = []

        @classmethod
        def reject(cls, line: str, version: int, reason: str, *, actor: str) -> None:
            cls.rejected.append((line, version, reason))

        @classmethod
        def log_canary_outcome(
            cls, line: str, version: int, record: CanaryRecord, numbers: object
        ) -> str:
            cls.logged.append((version, record))
            return "run"

    clients = fake_clients(settings, store=store, registry=Registry)
    outcome = judge_canary(settings, clients, "customer_service", now=start + timedelta(hours=1))
    assert outcome.action == "rollback"
    assert "thumbs-down rate higher on the canary" in outcome.reason
    table = routes.table("customer_service")
    assert (table.champion, table.canary) == ("customer_service-v1", None)
    assert Registry.rejected[0][:2] == ("customer_service", 2)
    ((version, record),) = Registry.logged  # on the run that trained v2
    assert (version, record.tags["canary.decision"]) == (2, "rollback")
    assert record.tags["canary.reason"] == outcome.reason
    assert record.metrics["canary.canary_requests"] == 600
    store.close()


def test_no_flow_takes_settings_or_a_secret_as_a_parameter() -> None:
    """Prefect stores a flow run's parameters in its database and shows them in its UI:
    the store's URL (with its password) must never be one."""
    import inspect
    import re

    from flows.canary import canary_watch
    from flows.cleaning import clean_line_partitioned
    from flows.nightly import line_nightly, nightly

    for flow in (clean_line_partitioned, line_nightly, nightly, canary_watch):
        names = set(inspect.signature(flow.fn).parameters)
        assert not names & {"settings", "database_url", "redis_url"}, (flow.name, names)
        for parameter in inspect.signature(flow.fn).parameters.values():
            # The whole Settings (CleaningSettings and the like hold no secret).
            assert not re.search(r"\bSettings\b", str(parameter.annotation)), (flow.name, parameter)
