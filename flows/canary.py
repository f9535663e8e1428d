"""Prefect flow: the canary watch, every few minutes, for every business line.

Reads like the rollout's half of the design: the replicas brought to the plan,
then per line the shadow stage, the canary and the freshly promoted champion
judged on their users' online signals (``flows.rollout``; the decisions
themselves are pure, in ``registry``).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from composition.clients import open_clients
from flywheel.settings import current_settings


@flow(name="flywheel-canary")
def canary_watch(lines: list[str] | None = None) -> list[dict[str, Any]]:
    """Every replica brought to the adapters the routing tables name (a restarted one gets
    them back); then for each line: a shadow's answers against the champion's (on to the
    canary, rolled back, or wait), the canary against the champion (promote, step up, roll
    back or wait, after its soak time), and a newly promoted champion against ``previous``
    (reverted when it regresses). Each decision is recorded with its numbers."""
    from flows.rollout import judge_canary, judge_shadow_stage, sync_adapters, watch_champion
    from registry.vllm_admin import vllm_in_flight

    settings = current_settings()
    chosen = lines or list(settings.business_lines)
    gateway = settings.gateway
    in_flight = vllm_in_flight(gateway.upstreams)
    results = []
    with open_clients(settings) as clients:
        try:
            synced = sync_adapters(settings, clients, gateway.upstreams, in_flight=in_flight)
        except Exception:  # one replica's trouble must not stop the decisions
            get_run_logger().exception("reconciling the replicas failed")
        else:
            for replica, changes in synced.items():
                if changes["loaded"] or changes["unloaded"] or changes["failed"]:
                    get_run_logger().info("reconciled %s: %s", replica, changes)
        for line in chosen:
            shadow = judge_shadow_stage(
                settings,
                clients,
                line,
                upstreams=gateway.upstreams,
                in_flight=in_flight,
            )
            outcome = judge_canary(
                settings,
                clients,
                line,
                upstreams=gateway.upstreams,
                in_flight=in_flight,
            )
            watched = watch_champion(
                settings,
                clients,
                line,
                upstreams=gateway.upstreams,
                in_flight=in_flight,
            )
            results.append(
                {
                    "business_line": line,
                    "action": outcome.action,
                    "reason": outcome.reason,
                    "champion_watch": watched.action,
                    "champion_watch_reason": watched.reason,
                    "shadow": shadow.action,
                    "shadow_reason": shadow.reason,
                }
            )
    create_table_artifact(key="canary-decisions", table=results, description="canary decisions")
    return results
