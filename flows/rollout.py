"""Putting a gated adapter in front of users, and the canary's fate: plain functions.

``deploy_canary`` hot-loads a registered version into every vLLM replica,
probes it on each, and only then sends a sticky share of the line's users to
it. ``judge_canary`` compares canary and champion on the gateway's logs since
the canary's share last changed and applies the decision: step up to the next
share, promote (champion alias and all traffic; the old champion stays loaded
as ``previous``), roll back (no traffic at once, then drain and unload), or
wait. The Prefect flows call these; so does ``flywheel canary``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from feedback.online import adapter_windows
from feedback.store import FeedbackStore
from flows.stages import recipe_for
from flywheel.errors import FlywheelError
from flywheel.settings import Settings
from gateway.routes import RouteStore
from gateway.routing import RoutingTable, parse_adapter_name
from registry.canary import ArmStats, CanaryAction, CanaryDecision, decide_canary

ACTOR = "flywheel:canary"


@dataclass(slots=True)
class DeployOutcome:
    """What ``deploy_canary`` did."""

    business_line: str
    adapter: str
    status: str  # canary | failed
    reason: str
    loaded_on: list[str] = field(default_factory=list)


@dataclass(slots=True)
class CanaryOutcome:
    """What ``judge_canary`` decided and did."""

    business_line: str
    action: str  # promote | step_up | rollback | wait | none
    reason: str
    table: RoutingTable | None = None
    decision: CanaryDecision | None = None
    numbers: dict[str, Any] = field(default_factory=dict)


def _version_of(adapter: str) -> int:
    parsed = parse_adapter_name(adapter)
    if parsed is None:
        raise FlywheelError(f"{adapter!r} is not a flywheel adapter name (<line>-v<version>)")
    return parsed[1]


def deploy_canary(
    settings: Settings,
    store: FeedbackStore,
    line: str,
    version: int,
    upstreams: Sequence[str],
    *,
    actor: str = ACTOR,
) -> DeployOutcome:
    """Load ``<line>-v<version>`` on every replica, probe it, then route the recipe's first
    canary share to it. Safe to rerun: loads and the routing change are idempotent."""
    from registry.records import adapter_name
    from registry.tracking import Registry
    from registry.vllm_admin import VllmAdminClient

    recipe = recipe_for(settings, line)
    registry = Registry.for_home(settings.home, settings.mlflow_tracking_uri)
    adapter = adapter_name(line, version)
    path = registry.adapter_path(line, version)
    outcome = DeployOutcome(line, adapter, "canary", "")
    for upstream in upstreams:
        with VllmAdminClient(upstream) as client:
            client.ensure_loaded(adapter, path)
            probe = client.probe_adapter(adapter)
        if not probe.passed:
            outcome.status = "failed"
            outcome.reason = f"probe failed on {upstream}: {'; '.join(probe.reasons)}"
            return outcome
        outcome.loaded_on.append(upstream)
    routes = RouteStore(store.engine)
    current = routes.table(line)
    fraction = recipe.canary_steps[0]
    if current.canary != adapter or current.canary_fraction != fraction:
        routes.set_canary(
            line, adapter, fraction, actor=actor, reason=f"v{version} passed the gate and probes"
        )
    registry.set_alias(line, "canary", version)
    outcome.reason = f"{adapter} loaded and probed on {len(upstreams)} replica(s); {fraction:.0%}"
    return outcome


def _arm(windows: dict[str | None, Any], adapter: str | None) -> ArmStats:
    window = windows[adapter]
    return ArmStats(
        adapter=adapter,
        requests=window.requests,
        thumbs_down=window.signals["thumbs_down"],
        regenerate=window.signals["regenerate"],
        edit=window.signals["edit"],
        error=window.errors,
        abandon=window.signals["abandon"],
        task_failure=window.signals["task_failure"],
        dissatisfied=window.signals["dissatisfied"],
        p99_latency_ms=window.p99_latency_ms,
    )


def canary_since(routes: RouteStore, line: str) -> datetime | None:
    """When the line's canary got its current share (the comparison window starts there)."""
    for change in routes.history(line, limit=200):
        if change.action == "canary_set":
            return change.created_at
    return None


def judge_canary(
    settings: Settings,
    store: FeedbackStore,
    line: str,
    *,
    look: int | None = None,
    upstreams: Sequence[str] = (),
    in_flight: Callable[[str], int] | None = None,
    now: datetime | None = None,
    force: CanaryAction | None = None,
    reason: str | None = None,
    actor: str = ACTOR,
) -> CanaryOutcome:
    """Decide on the line's canary and apply it (``force`` skips the test); the decision is
    recorded with its numbers. ``look`` counts this canary share's decisions so far + 1."""
    until = now or datetime.now(UTC)
    # Route changes made by this decision are stamped with the decision's time.
    routes = RouteStore(store.engine, clock=lambda: until)
    table = routes.table(line)
    if table.canary is None:
        return CanaryOutcome(line, "none", "no canary on this line", table)
    recipe = recipe_for(settings, line)
    since = canary_since(routes, line) or datetime.min.replace(tzinfo=UTC)
    windows = adapter_windows(store.engine, line, [table.champion, table.canary], since, until)
    champion, canary = _arm(windows, table.champion), _arm(windows, table.canary)
    if look is None:
        look = _looks_so_far(store, line, table.canary, since) + 1
    numbers: dict[str, Any] = {
        "window_start": since.isoformat(),
        "window_end": until.isoformat(),
        "champion": asdict(windows[table.champion]),
        "canary": asdict(windows[table.canary]),
    }
    if force is None:
        decision = decide_canary(champion, canary, recipe.canary, look=look)
        action, why = decision.action, "; ".join(decision.reasons)
    else:
        decision, action, why = None, force, reason or f"by hand ({force.value})"
    if decision is not None:
        numbers["checks"] = [asdict(check) for check in decision.checks]
        numbers["worse_alpha"] = decision.worse_alpha
        numbers["non_inferior_alpha"] = decision.non_inferior_alpha
    outcome = CanaryOutcome(line, action.value, why, table, decision, numbers)
    if action is CanaryAction.PROMOTE:
        _promote(settings, routes, table, recipe.canary_steps, outcome, actor)
    elif action is CanaryAction.ROLLBACK:
        _roll_back(settings, routes, table, upstreams, in_flight, outcome, actor)
    _record(store, table, look, outcome, actor, until)
    return outcome


def _looks_so_far(store: FeedbackStore, line: str, adapter: str, since: datetime) -> int:
    from sqlalchemy import func, select

    from feedback.schema import canary_decisions_table as decisions

    query = select(func.count()).where(
        decisions.c.business_line == line,
        decisions.c.adapter == adapter,
        decisions.c.created_at > since,  # a decision made at a change belongs before it
    )
    with store.engine.connect() as connection:
        return int(connection.execute(query).scalar_one())


def _record(
    store: FeedbackStore,
    table: RoutingTable,
    look: int,
    outcome: CanaryOutcome,
    actor: str,
    when: datetime,
) -> None:
    from sqlalchemy import insert

    from feedback.schema import canary_decisions_table as decisions

    assert table.canary is not None
    with store.engine.begin() as connection:
        connection.execute(
            insert(decisions).values(
                business_line=table.business_line,
                adapter=table.canary,
                canary_fraction=table.canary_fraction,
                look=look,
                action=outcome.action,
                reasons=outcome.reason,
                numbers=outcome.numbers,
                actor=actor,
                created_at=when,
            )
        )


def canary_decisions(store: FeedbackStore, line: str, limit: int = 20) -> list[dict[str, Any]]:
    """The line's latest canary decisions, newest first."""
    from sqlalchemy import select

    from feedback.schema import canary_decisions_table as decisions

    query = (
        select(decisions)
        .where(decisions.c.business_line == line)
        .order_by(decisions.c.id.desc())
        .limit(limit)
    )
    with store.engine.connect() as connection:
        return [dict(row._mapping) for row in connection.execute(query)]


def _promote(
    settings: Settings,
    routes: RouteStore,
    table: RoutingTable,
    steps: Sequence[float],
    outcome: CanaryOutcome,
    actor: str,
) -> None:
    from registry.tracking import Registry

    assert table.canary is not None
    higher = [step for step in steps if step > table.canary_fraction + 1e-9]
    if higher and higher[0] < 1.0:
        outcome.action = "step_up"
        outcome.table = routes.set_canary(
            table.business_line, table.canary, higher[0], actor=actor, reason=outcome.reason
        )
        return
    version = _version_of(table.canary)
    registry = Registry.for_home(settings.home, settings.mlflow_tracking_uri)
    registry.promote(table.business_line, version, actor=actor, reason=outcome.reason)
    registry.remove_alias(table.business_line, "canary")
    outcome.table = routes.set_champion(
        table.business_line, table.canary, actor=actor, reason=outcome.reason
    )


def _roll_back(
    settings: Settings,
    routes: RouteStore,
    table: RoutingTable,
    upstreams: Sequence[str],
    in_flight: Callable[[str], int] | None,
    outcome: CanaryOutcome,
    actor: str,
) -> None:
    from registry.tracking import Registry
    from registry.vllm_admin import AdapterNotLoadedError, VllmAdminClient, wait_drained

    assert table.canary is not None
    adapter = table.canary
    # Traffic first: every gateway stops sending users to it within a second.
    outcome.table = routes.clear_canary(table.business_line, actor=actor, reason=outcome.reason)
    registry = Registry.for_home(settings.home, settings.mlflow_tracking_uri)
    registry.reject(table.business_line, _version_of(adapter), outcome.reason, actor=actor)
    if in_flight is not None:
        wait_drained(adapter, in_flight, timeout_s=120)
    for upstream in upstreams:
        with VllmAdminClient(upstream) as client, contextlib.suppress(AdapterNotLoadedError):
            client.unload_adapter(adapter)


def sync_adapters(
    settings: Settings, store: FeedbackStore, upstreams: Sequence[str]
) -> dict[str, Any]:
    """Load on every replica each adapter a routing table names (champion, canary, previous),
    e.g. after a replica restarted; unload flywheel adapters no table names. Returns what
    changed per replica."""
    from registry.tracking import Registry
    from registry.vllm_admin import VllmAdminClient, reconcile

    registry = Registry.for_home(settings.home, settings.mlflow_tracking_uri)
    desired: dict[str, Any] = {}
    for line, table in RouteStore(store.engine).snapshot().tables.items():
        for adapter in sorted(table.adapters):
            desired[adapter] = registry.adapter_path(line, _version_of(adapter))
    clients = {url: VllmAdminClient(url) for url in upstreams}
    try:
        report = reconcile(clients.values(), desired)
        summary: dict[str, Any] = {}
        for replica in report.replicas:
            # A load is not done until the probe shows the adapter answers and differs.
            failed = [str(f) for f in replica.failures]
            for adapter in replica.loaded:
                probe = clients[replica.replica].probe_adapter(adapter)
                if not probe.passed:
                    failed.append(f"{adapter}: probe failed: {'; '.join(probe.reasons)}")
            summary[replica.replica] = {
                "loaded": replica.loaded,
                "kept": replica.kept,
                "unloaded": replica.unloaded,
                "failed": failed,
            }
    finally:
        for client in clients.values():
            client.close()
    return summary
