"""Prefect flow: the canary watch, every few minutes, for every business line.

Reads like the rollout's half of the design: the replicas brought to the plan,
then per line the shadow stage, the canary and the freshly promoted champion
judged on their users' online signals (``composition.rollout``; the decisions
themselves are pure, in ``registry``). Every decision is also a line of the flow run's log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from composition.clients import Clients, open_clients
from flywheel.settings import Settings, current_settings

# What a stage's action did, in the words of a log line.
ACTION_WORDS = {
    "promote": "promoted",
    "step_up": "stepped up",
    "rollback": "rolled back",
    "revert": "reverted",
    "wait": "waiting",
    "watch": "watching",
    "advance": "advanced to the canary",
    "reject": "rejected",
}


def describe_decisions(result: dict[str, Any]) -> list[str]:
    """A line's decisions of this run, one log line each (shadow, canary, champion watch):
    e.g. "customer_service: canary: promoted: ..."; a line with nothing to judge says so."""
    line = result["business_line"]
    said = [
        f"{line}: {stage}: {ACTION_WORDS.get(action, action)}: {result[reason]}"
        for stage, action, reason in (
            ("shadow", result["shadow"], "shadow_reason"),
            ("canary", result["action"], "reason"),
            ("champion watch", result["champion_watch"], "champion_watch_reason"),
        )
        if action != "none"
    ]
    return said or [f"{line}: nothing to judge (no shadow, no canary, no champion on watch)"]


def describe_sync(replica: str, changes: dict[str, list[str]]) -> str:
    """What reconciling one replica changed: e.g. "http://vllm:8000: loaded cs-v3; unloaded
    cs-v1"."""
    done = [
        f"{what} {', '.join(changes[what])}"
        for what in ("loaded", "unloaded", "failed")
        if changes.get(what)
    ]
    return f"{replica}: {'; '.join(done)}"


@flow(name="flywheel-canary")
def canary_watch(lines: list[str] | None = None) -> list[dict[str, Any]]:
    """Every replica brought to the adapters the routing tables name (a restarted one gets
    them back); then for each line: a shadow's answers against the champion's (on to the
    canary, rolled back, or wait), the canary against the champion (promote, step up, roll
    back or wait, after its soak time), and a newly promoted champion against ``previous``
    (reverted when it regresses). Each decision is recorded with its numbers."""
    from registry.vllm_admin import vllm_in_flight

    settings = current_settings()
    chosen = lines or list(settings.business_lines)
    in_flight = vllm_in_flight(settings.gateway.upstreams)
    results = []
    with open_clients(settings) as clients:
        _sync_replicas(settings, clients, in_flight)
        for line in chosen:
            results.append(_judge_line(settings, clients, line, in_flight))
            for said in describe_decisions(results[-1]):
                get_run_logger().info("%s", said)
    create_table_artifact(key="canary-decisions", table=results, description="canary decisions")
    return results


def _sync_replicas(settings: Settings, clients: Clients, in_flight: Callable[[str], int]) -> None:
    """Every replica brought to the routing tables; what changed logged, a failure too (one
    replica's trouble must not stop the decisions)."""
    from registry.adapter_sync import sync_adapters

    try:
        synced = sync_adapters(settings, clients, settings.gateway.upstreams, in_flight=in_flight)
    except Exception as exc:  # one replica's trouble must not stop the decisions
        get_run_logger().exception(
            "reconciling the replicas failed (the decisions go on): %s: %s",
            type(exc).__name__,
            exc,
        )
        return
    for replica, changes in synced.items():
        if changes["loaded"] or changes["unloaded"] or changes["failed"]:
            get_run_logger().log(
                logging.WARNING if changes["failed"] else logging.INFO,
                "reconciled %s",
                describe_sync(replica, changes),
            )


def _judge_line(
    settings: Settings, clients: Clients, line: str, in_flight: Callable[[str], int]
) -> dict[str, Any]:
    """The line's three judges in turn (shadow, canary, champion watch), as one result row."""
    from composition.rollout import judge_canary, judge_shadow_stage, watch_champion

    upstreams = settings.gateway.upstreams
    shadow = judge_shadow_stage(settings, clients, line, upstreams=upstreams, in_flight=in_flight)
    outcome = judge_canary(settings, clients, line, upstreams=upstreams, in_flight=in_flight)
    watched = watch_champion(settings, clients, line, upstreams=upstreams, in_flight=in_flight)
    return {
        "business_line": line,
        "action": outcome.action,
        "reason": outcome.reason,
        "champion_watch": watched.action,
        "champion_watch_reason": watched.reason,
        "shadow": shadow.action,
        "shadow_reason": shadow.reason,
    }
