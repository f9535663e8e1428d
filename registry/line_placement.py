"""Planning and moving where each business line's adapters live (``registry.placement``
decides; this reads the traffic and applies a placement to the replicas and the routes).

A move never leaves a line without its adapters: they are loaded on the replicas the
line gains first, then the placement is written (every gateway follows within
``routes_refresh_s``), then they are unloaded from the replicas it loses, each after
that replica's own requests for them drained.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from flywheel.settings import Settings
from registry.names import version_of
from registry.placement import Placement, placement_moves, plan_placement, traffic_shares
from registry.replicas import load_checked
from registry.rollout import DRAIN_TIMEOUT_S, LineClients, RoutesChangedError
from registry.routing import RoutingTable

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LinePlacement:
    """One line's traffic over the window, where it is placed now and where the plan puts it."""

    business_line: str
    requests: int
    share: float
    current: Placement
    planned: Placement

    @property
    def changes(self) -> bool:
        """Whether applying the plan moves the line."""
        return self.current != self.planned


@dataclass(slots=True)
class PlacementMove:
    """What moving one line did, replica by replica."""

    business_line: str
    placement: Placement
    loaded_on: list[str] = field(default_factory=list)
    unloaded_from: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def plan_lines(
    settings: Settings,
    clients: LineClients,
    upstreams: Sequence[str],
    *,
    hours: float,
    hot_share: float,
    cold_replicas: int,
    now: datetime | None = None,
) -> list[LinePlacement]:
    """Every configured or routed line's requests over the last ``hours``, its placement
    now and the planned one (:func:`registry.placement.plan_placement`)."""
    since = (now or datetime.now(UTC)) - timedelta(hours=hours)
    counts = clients.store.requests_per_line(since)
    snapshot = clients.routes.snapshot()
    lines = sorted(set(settings.business_lines) | snapshot.tables.keys() | counts.keys())
    traffic = {line: counts.get(line, 0) for line in lines}
    shares = traffic_shares(traffic)
    plan = plan_placement(traffic, upstreams, hot_share=hot_share, cold_replicas=cold_replicas)
    return [
        LinePlacement(line, traffic[line], shares[line], snapshot.table(line).replicas, plan[line])
        for line in lines
    ]


def move_line(
    settings: Settings,
    clients: LineClients,
    line: str,
    placement: Placement,
    upstreams: Sequence[str],
    *,
    actor: str,
    reason: str,
    in_flight_on: Callable[[str], Callable[[str], int]] | None = None,
) -> PlacementMove:
    """Place ``line`` on ``placement`` (None: every replica): its routed adapters loaded on
    the replicas it gains, the placement written (refused when the line's adapters changed
    meanwhile), then the adapters unloaded from the replicas it loses once drained there
    (``in_flight_on(replica)`` counts that replica's requests per adapter; None: vLLM's
    metrics). A load that fails stops the move before the routes change."""
    routes = clients.routes
    table = routes.table(line)
    gained, lost = placement_moves(table.replicas, placement, upstreams)
    registry = clients.registry
    paths = {a: registry.adapter_path(line, version_of(a)) for a in sorted(table.adapters)}
    move = PlacementMove(line, placement)
    for url in gained:
        with clients.vllm_admin(url) as client:
            for adapter, path in paths.items():
                load_checked(client, adapter, path, clients.replicas)
        move.loaded_on.append(url)

    def edit(current: RoutingTable) -> RoutingTable:
        if current.adapters != table.adapters:
            raise RoutesChangedError(
                f"{line}'s adapters changed meanwhile ({', '.join(sorted(current.adapters))}); "
                "its placement was not changed, plan again"
            )
        return current.placed_on(placement)

    routes.change(line, edit, action="placement_set", actor=actor, reason=reason)
    for url in lost:
        if _unload_drained(clients, url, list(paths), in_flight_on, move):
            move.unloaded_from.append(url)
    return move


def _unload_drained(
    clients: LineClients,
    url: str,
    adapters: list[str],
    in_flight_on: Callable[[str], Callable[[str], int]] | None,
    move: PlacementMove,
) -> bool:
    """Unload ``adapters`` from ``url``, each once that replica has no request for it; a
    failure is noted on ``move`` and left to the reconciler."""
    from registry.vllm_admin import (
        AdapterNotLoadedError,
        VllmAdminError,
        vllm_in_flight,
        wait_drained,
    )

    in_flight = (in_flight_on or (lambda replica: vllm_in_flight([replica])))(url)
    done = True
    for adapter in adapters:
        try:
            wait_drained(adapter, in_flight, timeout_s=DRAIN_TIMEOUT_S)
            with clients.vllm_admin(url) as client, contextlib.suppress(AdapterNotLoadedError):
                client.unload_adapter(adapter)
        except VllmAdminError as exc:
            logger.warning("could not unload %s from %s: %s", adapter, url, exc)
            move.failed.append(f"{url}: {adapter}: {exc}")
            done = False
    return done
