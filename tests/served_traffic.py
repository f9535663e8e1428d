"""A generated store that looks served: adapter versions, a canary, routing history.

The traffic simulator (``lab.simulation.stored_traffic``) logs every request against the base
model. The page is about adapter versions, so this module replays the same
traffic as if each line had moved from ``<line>-v1`` to ``<line>-v2`` part way
through, with ``<line>-v3`` as a sticky canary on a share of the users since a
later point, and writes the routing history that says so (timestamped in the
simulated time). Tests, the browser tests and the page benchmark use it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from feedback.store import FeedbackStore, IngestReport
from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator
from registry.routes import RouteStore
from tests.routing import set_canary, set_champion

ACTOR = "demo-store"


@dataclass(frozen=True, slots=True)
class ServingPlan:
    """When each line switched champion and started its canary (fractions of the span)."""

    promote_at: float = 0.5
    canary_at: float = 0.75
    canary_fraction: float = 0.2

    def adapter_for(
        self, line: str, user: str | None, when: datetime, start: datetime, span: timedelta
    ) -> tuple[str, int, str]:
        """``(adapter name, version, arm)`` that served ``user`` at ``when`` (pure)."""
        progress = (when - start) / span if span else 1.0
        if progress < self.promote_at:
            return f"{line}-v1", 1, "champion"
        if progress >= self.canary_at and _bucket(user) < self.canary_fraction:
            return f"{line}-v3", 3, "canary"
        return f"{line}-v2", 2, "champion"


def _bucket(user: str | None) -> float:
    digest = hashlib.sha256((user or "").encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def served_events(
    simulator: TrafficSimulator, plan: ServingPlan, *, limit: int | None = None
) -> Iterator[dict[str, Any]]:
    """The simulator's events with each interaction stamped with the adapter that served it."""
    settings = simulator.settings
    for count, event in enumerate(simulator.events()):
        if limit is not None and count >= limit:
            return
        if event["type"] == "interaction":
            when = datetime.fromisoformat(event["created_at"].replace("Z", "+00:00"))
            name, version, arm = plan.adapter_for(
                event["business_line"], event.get("user_id"), when, settings.start, settings.span
            )
            yield {**event, "adapter_name": name, "adapter_version": version, "arm": arm}
        else:
            yield event


def fill_demo_store(
    store: FeedbackStore,
    settings: SimulationSettings,
    *,
    plan: ServingPlan | None = None,
    track_pii: bool = False,
    limit: int | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[TrafficSimulator, IngestReport]:
    """Ingest served traffic into ``store`` and write each line's routing history."""
    plan = plan or ServingPlan()
    simulator = TrafficSimulator(settings, track_pii=track_pii)
    report = store.ingest(
        served_events(simulator, plan, limit=limit), source="demo-store", on_progress=on_progress
    )
    for line in settings.business_lines:
        write_routes(store, line, settings.start, settings.span, plan)
    return simulator, report


def write_routes(
    store: FeedbackStore, line: str, start: datetime, span: timedelta, plan: ServingPlan
) -> None:
    """The line's routing history as the plan has it, each change at its simulated time."""
    moments = iter(
        [
            start,
            start + span * plan.promote_at,
            start + span * plan.canary_at,
        ]
    )
    routes = RouteStore(store.engine, clock=lambda: next(moments))
    set_champion(routes, line, f"{line}-v1", actor=ACTOR, reason="first adapter")
    set_champion(routes, line, f"{line}-v2", actor=ACTOR, reason="promoted after its canary")
    set_canary(
        routes, line, f"{line}-v3", plan.canary_fraction, actor=ACTOR, reason="nightly candidate"
    )
