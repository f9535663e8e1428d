"""Routing tables arranged by hand, for tests.

Tests arrange routing tables directly; the product changes them through the rollout's door
(``registry.rollout``, served by :meth:`RouteStore.change`), which also loads, probes, moves
MLflow's aliases and unloads. Each function here moves the table alone: one
:meth:`RouteStore.change` with the action the history records.
"""

from __future__ import annotations

from registry.routes import RouteStore
from registry.routing import DEFAULT_CANARY_FRACTION, RoutingTable


def set_canary(
    routes: RouteStore,
    business_line: str,
    adapter: str,
    fraction: float = DEFAULT_CANARY_FRACTION,
    *,
    actor: str,
    reason: str | None = None,
) -> RoutingTable:
    """Send ``fraction`` of the line's users (sticky) to ``adapter`` (the table alone)."""
    return routes.change(
        business_line,
        lambda table: table.with_canary(adapter, fraction),
        action="canary_set",
        actor=actor,
        reason=reason,
    )


def clear_canary(
    routes: RouteStore, business_line: str, *, actor: str, reason: str | None = None
) -> RoutingTable:
    """Every user of the line back on the champion at once (the table alone)."""
    return routes.change(
        business_line,
        lambda table: table.without_canary(),
        action="canary_clear",
        actor=actor,
        reason=reason,
    )


def set_shadow(
    routes: RouteStore,
    business_line: str,
    adapter: str,
    fraction: float,
    *,
    actor: str,
    reason: str | None = None,
) -> RoutingTable:
    """Mirror ``fraction`` of the line's champion requests to ``adapter`` (the table alone)."""
    return routes.change(
        business_line,
        lambda table: table.with_shadow(adapter, fraction),
        action="shadow_set",
        actor=actor,
        reason=reason,
    )


def clear_shadow(
    routes: RouteStore, business_line: str, *, actor: str, reason: str | None = None
) -> RoutingTable:
    """Stop mirroring the line's requests to its shadow adapter (the table alone)."""
    return routes.change(
        business_line,
        lambda table: table.without_shadow(),
        action="shadow_clear",
        actor=actor,
        reason=reason,
    )


def set_champion(
    routes: RouteStore,
    business_line: str,
    adapter: str | None,
    *,
    actor: str,
    reason: str | None = None,
) -> RoutingTable:
    """Make ``adapter`` (None: the base model) the champion, the old one previous (the table
    alone: MLflow's alias does not follow)."""
    return routes.change(
        business_line,
        lambda table: table.with_champion(adapter),
        action="champion_set",
        actor=actor,
        reason=reason,
    )
