"""Applying A/B experiments to the real parts: routing, vLLM, the store and MLflow (in the
composition layer: each reads the line's recipe and goes through its rollout).

- ``start_experiment``: checks the line runs no canary, shadow or experiment, resolves
  the arms (registry versions, ``champion``, ``base``), loads and probes each adapter
  arm on the replicas the line is placed on (as a canary deploy does), records the
  experiment, then routes its split (checked unchanged since it was read) and opens
  its MLflow run.
- ``look_experiment``: each arm's counts since the start, the verdict
  (``registry.experiments.judge_experiment``), recorded as a look (store and MLflow);
  the first decision is kept.
- ``stop_experiment``: every user back on the champion; arms no route names unloaded.
- ``promote_experiment``: the winner becomes the line's champion through the rollout
  (``composition.rollout.set_champion``: routing and the MLflow alias together), then the
  split ends; refused while the test has not decided, unless forced with a reason.

Nothing here decides: the verdict is ``registry.experiments``'s, the champion change
``registry.lifecycle``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from composition.clients import Clients
from composition.recipes import Recipe, recipe_for
from composition.rollout import Rollout, rollout, set_champion
from feedback.contributions import LookBound
from feedback.store import FeedbackStore
from flywheel.errors import FlywheelError, UsageError
from flywheel.settings import Settings
from registry.experiment_runs import (
    close_experiment_run,
    log_experiment_look,
    open_experiment_run,
)
from registry.experiment_store import (
    ARM_LABELS,
    FAILED,
    PROMOTED,
    STOPPED,
    ExperimentRecord,
    create_experiment,
    current_look,
    decide,
    end_experiment,
    get_experiment,
    live_experiment,
    record_look,
    set_run_id,
)
from registry.experiments import (
    SATISFACTION,
    ArmLabel,
    ExperimentLook,
    ExperimentPolicy,
    arm_reference,
    judge_satisfaction,
    metric_named,
    start_refusal,
)
from registry.lifecycle import LoraBudget, Transition
from registry.names import adapter_name
from registry.placement import placed
from registry.replicas import serving_lora_limits
from registry.rollout import RoutesChangedError
from registry.routing import ExperimentSplit, RoutingTable

ACTOR = "flywheel:experiment"
logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ExperimentStatus:
    """An experiment with its latest look (None for one that ended without looks)."""

    record: ExperimentRecord
    look: ExperimentLook | None
    look_number: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the experiment and its look's numbers."""
        return {
            **self.record.as_dict(),
            "look": self.look.as_dict() if self.look else None,
            "look_number": self.look_number,
        }


def _now(now: datetime | None) -> datetime:
    return now or datetime.now(UTC)


def _resolve_arm(parts: Rollout, table: RoutingTable, ref: str) -> str | None:
    """The adapter an arm argument names (None: the base model), checked in the registry."""
    try:
        named = arm_reference(ref, parts.line)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if named == "base":
        return None
    if named == "champion":
        return table.champion
    try:
        parts.registry.version_tags(parts.line, named)
    except FlywheelError as exc:
        raise UsageError(f"arm {ref!r}: {exc}") from None
    return adapter_name(parts.line, named)


def _probe(parts: Rollout, adapters: Sequence[str], replicas: Sequence[str]) -> list[str]:
    """Load and probe each adapter on every replica (the canary deploy's check); on a
    failure, unload what this call loaded and refuse. Returns what it loaded."""
    from registry.replicas import load_checked
    from registry.vllm_admin import VllmAdminError

    loaded: list[str] = []
    try:
        for adapter in adapters:
            path = parts.adapter_path(adapter)
            for url in replicas:
                with parts.clients.vllm_admin(url) as client:
                    loads = load_checked(client, adapter, path, parts.clients.replicas)
                    if loads and adapter not in loaded:
                        loaded.append(adapter)
                    probe = client.probe_adapter(adapter)
                if not probe.passed:
                    raise UsageError(
                        f"{adapter} failed its probe on {url}: {'; '.join(probe.reasons)}"
                    )
    except VllmAdminError as exc:
        _unload(parts, loaded, replicas)
        raise UsageError(f"cannot load or probe the arms: {exc}") from None
    except UsageError:
        _unload(parts, loaded, replicas)
        raise
    return loaded


def _unload(parts: Rollout, adapters: Sequence[str], replicas: Sequence[str]) -> None:
    for adapter in adapters:
        parts.unload(adapter, replicas)


def start_experiment(
    settings: Settings,
    clients: Clients,
    line: str,
    arm_a: str,
    arm_b: str,
    upstreams: Sequence[str],
    *,
    share: float = 0.5,
    metric: str,
    alpha: float | None = None,
    min_samples: int | None = None,
    mixture_scale: float | None = None,
    actor: str = ACTOR,
    reason: str | None = None,
    now: datetime | None = None,
) -> ExperimentRecord:
    """Start an A/B experiment on ``line``: ``share`` of its users (sticky) on ``arm_b``,
    the rest on ``arm_a``, judged on ``metric`` at ``alpha`` (the recipe's canary alpha and
    minimum per arm unless given). Refused (UsageError) while a canary, a shadow or another
    experiment is live, for an unknown arm, or when an arm fails its probe."""
    try:
        chosen = metric_named(metric)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not 0 < share < 1:
        raise UsageError(f"--share must be between 0 and 1 (exclusive), got {share}")
    parts = rollout(settings, clients, line, upstreams, actor=actor)
    table = parts.routes.table(line)
    refusal = start_refusal(table)
    if refusal is not None:
        raise UsageError(f"cannot start an experiment: {refusal} (one rollout at a time)")
    a, b = _resolve_arm(parts, table, arm_a), _resolve_arm(parts, table, arm_b)
    if a == b:
        raise UsageError(f"arms A and B are both {a or 'the base model'}: nothing to compare")
    policy = _experiment_policy(parts.recipe, line, chosen, alpha, min_samples, mixture_scale)
    _check_budget(
        settings, parts, table.with_experiment(ExperimentSplit(id=1, a=a, b=b, share=share))
    )
    replicas = placed(table, upstreams)
    loaded = _probe(parts, [adapter for adapter in (a, b) if adapter is not None], replicas)
    when = _now(now)
    experiment_id = create_experiment(
        clients.store.engine, business_line=line, arm_a=a, arm_b=b, share=share, metric=chosen,
        policy=policy, actor=actor, reason=reason, when=when,
    )  # fmt: skip
    split = ExperimentSplit(id=experiment_id, a=a, b=b, share=share)
    why = reason or f"A/B experiment {experiment_id} on {chosen}"
    try:
        _route_split(parts, table, split, why)
    except FlywheelError as exc:
        end_experiment(clients.store.engine, experiment_id, FAILED, str(exc), when)
        _unload(parts, loaded, replicas)
        raise
    return _with_run(parts, experiment_id)


def _experiment_policy(
    recipe: Recipe,
    line: str,
    metric: str,
    alpha: float | None,
    min_samples: int | None,
    mixture_scale: float | None,
) -> ExperimentPolicy:
    """The experiment's test: the given settings, else the recipe's canary's; refused for the
    satisfaction metric on a line whose recipe has no reviews."""
    canary = recipe.canary
    if metric == SATISFACTION and recipe.review is None:
        raise UsageError(
            f"the satisfaction metric needs blind reviews of both arms: {line}'s recipe has "
            "no review block (share, rubric, min_reviews)"
        )
    try:
        return ExperimentPolicy(
            alpha=alpha if alpha is not None else canary.alpha,
            min_samples=min_samples if min_samples is not None else canary.min_requests,
            min_reviews=_min_reviews(recipe),
            **({"mixture_scale": mixture_scale} if mixture_scale is not None else {}),
        )
    except ValueError as exc:
        raise UsageError(f"bad test settings: {exc}") from None


def _check_budget(settings: Settings, parts: Rollout, planned: RoutingTable) -> None:
    """Refuse arms that would make the replicas the line is placed on serve more adapters
    at once than their ``--max-loras``."""
    table = parts.routes.table(parts.line)
    limits = serving_lora_limits(settings, parts.clients.replicas, table, parts.upstreams)
    budget = LoraBudget(
        limits.max_loras,
        {**parts.routes.snapshot().tables, parts.line: planned},
        parts.upstreams,
    )
    if budget.most_on_one_replica() > budget.max_loras:
        raise UsageError(
            f"the arms would make {budget.most_on_one_replica()} adapters served at once, over "
            f"the server's --max-loras {budget.max_loras} ({limits.max_loras_source}): "
            f"{budget.describe()}"
        )


def _route_split(parts: Rollout, table: RoutingTable, split: ExperimentSplit, why: str) -> None:
    """The experiment's split into the line's routing table, checked unchanged since
    ``table`` was read."""

    def edit(current: RoutingTable) -> RoutingTable:
        if current != table:
            raise RoutesChangedError(
                f"{parts.line}'s routing changed meanwhile; the experiment was not started, "
                "try again"
            )
        return current.with_experiment(split)

    parts.routes.change(parts.line, edit, action="experiment_start", actor=parts.actor, reason=why)


def _with_run(parts: Rollout, experiment_id: int) -> ExperimentRecord:
    """The started experiment with its MLflow run opened and recorded."""
    engine = parts.store.engine
    record = get_experiment(engine, experiment_id)
    assert record is not None
    set_run_id(engine, experiment_id, open_experiment_run(parts.registry, record))
    started = get_experiment(engine, experiment_id)
    assert started is not None
    return started


def _min_reviews(recipe: Recipe) -> int:
    """Reviews per arm before a satisfaction experiment decides: the canary's satisfaction
    test's, else the review block's, else 30; at least 2."""
    test = recipe.canary.satisfaction
    wanted = (
        test.min_reviews
        if test is not None
        else (recipe.review.min_reviews if recipe.review else 0)
    )
    return max(2, wanted or 30)


def _live(store: FeedbackStore, line: str) -> ExperimentRecord:
    record = live_experiment(store.engine, line)
    if record is None:
        raise UsageError(f"no experiment is live on {line} (flywheel experiment start)")
    return record


def look_experiment(
    settings: Settings,
    clients: Clients,
    line: str,
    *,
    actor: str = ACTOR,
    now: datetime | None = None,
) -> ExperimentStatus:
    """Look at the line's live experiment: its verdict recorded as the next look (store and
    MLflow); the first decision is kept as the experiment's."""
    store = clients.store
    record = _live(store, line)
    when = _now(now)
    # Each user's first answers and each key's share, bounded as the line's canary bounds them.
    bound = recipe_for(settings, line).canary.bound
    if record.metric == SATISFACTION:
        look = _satisfaction_look(settings, clients, record, when, bound)
    else:
        look = current_look(store.engine, record, when, bound)
    number = record_look(
        store.engine,
        record.id,
        verdict=look.verdict.value,
        numbers=look.as_dict(),
        actor=actor,
        when=when,
    )
    if look.winner is not None and record.winner is None:
        decide(store.engine, record.id, look.winner, number, when)
    updated = get_experiment(store.engine, record.id)
    assert updated is not None
    log_experiment_look(clients.registry, updated, look, number)
    return ExperimentStatus(updated, look, number)


def _satisfaction_look(
    settings: Settings,
    clients: Clients,
    record: ExperimentRecord,
    until: datetime,
    bound: LookBound,
) -> ExperimentLook:
    """Each arm's satisfaction on every answer since the experiment started (the line's
    satisfaction model rectified by the blind reviews), judged A against B."""
    from composition.satisfaction import arm_satisfaction

    arms = {label: (record.arm(label), ARM_LABELS[label]) for label in ("a", "b")}
    samples, _scorer = arm_satisfaction(
        settings,
        clients,
        record.business_line,
        [adapter for adapter, _ in arms.values()],
        record.started_at,
        record.ended_at or until,
        bound,
        arm_labels=[label for _, label in arms.values()],
    )
    return judge_satisfaction(samples[ARM_LABELS["a"]], samples[ARM_LABELS["b"]], record.policy)


def stop_experiment(
    settings: Settings,
    clients: Clients,
    line: str,
    upstreams: Sequence[str],
    *,
    reason: str | None = None,
    actor: str = ACTOR,
    now: datetime | None = None,
) -> ExperimentStatus:
    """End the line's experiment without a promotion: a last look recorded, every user back
    on the champion, arms no route names any more unloaded (drained)."""
    store = clients.store
    final = look_experiment(settings, clients, line, actor=actor, now=now)
    record = final.record
    why = reason or f"experiment {record.id} stopped by hand"
    after = _end_split(settings, clients, line, upstreams, record, "experiment_stop", why, actor)
    end_experiment(store.engine, record.id, STOPPED, why, _now(now))
    ended = get_experiment(store.engine, record.id)
    assert ended is not None
    close_experiment_run(clients.registry, ended, after)
    return ExperimentStatus(ended, final.look, final.look_number)


def promote_experiment(
    settings: Settings,
    clients: Clients,
    line: str,
    upstreams: Sequence[str],
    *,
    arm: ArmLabel | None = None,
    force: bool = False,
    reason: str | None = None,
    actor: str = ACTOR,
    now: datetime | None = None,
) -> tuple[ExperimentStatus, Transition]:
    """Make the experiment's winner the line's champion (routing and MLflow alias together,
    through the rollout), then end the split. Refused while the test has not decided, or
    when ``arm`` is not the winner, unless ``force`` with a ``reason`` (recorded)."""
    store = clients.store
    if force and not (reason and reason.strip()):
        raise UsageError("--force needs --reason (it is recorded with the promotion)")
    final = look_experiment(settings, clients, line, actor=actor, now=now)
    record, look = final.record, final.look
    assert look is not None
    winner = record.winner
    if winner is None and not force:
        raise UsageError(
            f"experiment {record.id} has not decided: {look.reasons[0]}; "
            "--force --arm A|B --reason WHY promotes anyway"
        )
    if winner is None and arm is None:
        raise UsageError("the test has not decided: --force needs --arm A or B")
    if arm is not None and winner is not None and arm != winner and not force:
        raise UsageError(
            f"the test chose arm {winner.upper()}, not {arm.upper()}; --force --reason WHY "
            "overrides it"
        )
    chosen: ArmLabel = arm or winner  # type: ignore[assignment]
    adapter = record.arm(chosen)
    decided = f"experiment {record.id}: arm {chosen.upper()} ({adapter or 'base model'}) " + (
        f"won on {record.metric} at look {record.decided_look}"
        if winner == chosen
        else f"promoted by hand over the test ({look.verdict.value}): {reason}"
    )
    why = f"{decided}; {reason}" if reason and winner == chosen else decided
    transition = set_champion(settings, clients, line, adapter, upstreams, reason=why, actor=actor)
    after = _end_split(settings, clients, line, upstreams, record, "experiment_promote", why, actor)
    end_experiment(store.engine, record.id, PROMOTED, why, _now(now))
    ended = get_experiment(store.engine, record.id)
    assert ended is not None
    close_experiment_run(clients.registry, ended, after, promoted=chosen)
    return ExperimentStatus(ended, look, final.look_number), transition


def _end_split(
    settings: Settings,
    clients: Clients,
    line: str,
    upstreams: Sequence[str],
    record: ExperimentRecord,
    action: str,
    reason: str,
    actor: str,
) -> RoutingTable:
    """Take the experiment's split out of the routing table and unload (drained) the arms
    no route names any more; the table after."""
    from registry.vllm_admin import vllm_in_flight

    parts = rollout(
        settings, clients, line, upstreams, in_flight=vllm_in_flight(upstreams), actor=actor
    )

    def edit(current: RoutingTable) -> RoutingTable:
        if current.experiment is None or current.experiment.id != record.id:
            return current
        return current.without_experiment()

    after = parts.routes.change(line, edit, action=action, actor=actor, reason=reason)
    gone = [a for a in (record.arm_a, record.arm_b) if a is not None and a not in after.adapters]
    _unload(parts, gone, tuple(upstreams))
    return after
