"""The rollout's use cases over the flow's settings, clients and recipe.

Every function here gathers what a judge needs (the arms' windows, the shadow's
pairs) and goes through the one door, :class:`registry.rollout.LineRollout`, which
advances the state machine (``registry.lifecycle``), applies its effects and
records the decision. Nothing here decides, and nothing here writes a route.

- ``deploy_canary``: a gated version is loaded and probed on every replica the
  line is placed on (``registry.placement``; every replica without one), then
  gets the recipe's first canary share (or waits behind a live canary, or is
  refused by the LoRA budget, with the reason).
- ``judge_canary``: the canary flow's look (anytime-valid test, soak time):
  wait, step up, promote or roll back; every look is logged with its numbers.
- ``judge_shadow_stage``: the canary flow's look at a shadow (a recipe's shadow
  stage): its answers against the champion's on the same requests; on to the
  first canary share, rolled back, or left to answer more.
- ``watch_champion``: a promoted champion against ``previous`` for the
  recipe's ``watch_s``; a regression reverts routing and alias together.
- ``set_champion``: the champion by hand, routing and alias together.

They live in the composition layer because each reads the line's recipe; what every
replica serves and the check of it are ``registry.adapter_sync``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from composition.clients import Clients, open_clients
from composition.recipes import recipe_for
from feedback.online import adapter_windows
from flywheel.errors import FlywheelError
from flywheel.settings import Settings
from registry.canary import ArmNames, CanaryAction, CanaryDecision, _arm, _recorded, decide_canary
from registry.decisions import looks_since
from registry.lifecycle import (
    CanaryLooked,
    ChampionJudged,
    ChampionSetByHand,
    Event,
    LineState,
    LoraBudget,
    ShadowLooked,
    Transition,
    shadow_since,
    watching,
)
from registry.names import adapter_name, version_of
from registry.records import CanaryRecord, canary_record
from registry.rollout import ACTOR, LineRollout, Look
from registry.routing import RoutingTable
from registry.shadow import judge_shadow, shadow_report

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class DeployOutcome:
    """What ``deploy_canary`` did."""

    business_line: str
    adapter: str
    status: str  # canary | shadow | failed | kept_canary | kept_shadow | refused | none
    reason: str
    loaded_on: list[str] = field(default_factory=list)


@dataclass(slots=True)
class CanaryOutcome:
    """What ``judge_canary`` or ``watch_champion`` decided and did."""

    business_line: str
    action: str  # promote | step_up | rollback | wait | revert | watch | none
    reason: str
    table: RoutingTable | None = None
    decision: CanaryDecision | None = None
    numbers: dict[str, Any] = field(default_factory=dict)


class Rollout(LineRollout):
    """One line's rollout door (``registry.rollout``) on a flow's clients, under the line's
    recipe; with the settings, clients, store and recipe the use cases read."""

    def __init__(
        self,
        settings: Settings,
        clients: Clients,
        line: str,
        upstreams: Sequence[str],
        in_flight: Callable[[str], int] | None = None,
        actor: str = ACTOR,
        now: datetime | None = None,
    ) -> None:
        self.settings, self.clients = settings, clients
        self.store = clients.store
        self.recipe = recipe_for(settings, line)
        super().__init__(
            line,
            clients.routes_stamped(now) if now else clients.routes,
            clients,
            upstreams,
            policy=self.recipe.rollout,
            steps=self.recipe.canary_steps,
            max_loras=settings.vllm_max_loras,
            actor=actor,
            in_flight=in_flight,
        )

    def budget(self) -> LoraBudget:
        """Every line's routed adapters against the ``--max-loras`` of the replicas this line
        is placed on: the smallest, as they recorded it at their start (else as vLLM reports
        it, else ``FLYWHEEL_VLLM_MAX_LORAS``), per replica."""
        from registry.replicas import serving_lora_limits

        table = self.routes.table(self.line)
        limits = serving_lora_limits(self.settings, self.clients.replicas, table, self.upstreams)
        tables = self.routes.snapshot().tables
        return LoraBudget(limits.max_loras, tables, self.upstreams, limits.max_loras_source)


def rollout(
    settings: Settings,
    clients: Clients,
    line: str,
    upstreams: Sequence[str],
    *,
    in_flight: Callable[[str], int] | None = None,
    actor: str = ACTOR,
    now: datetime | None = None,
) -> Rollout:
    """The rollout of one line through these clients."""
    return Rollout(settings, clients, line, tuple(upstreams), in_flight, actor, now)


# --------------------------------------------------------------------------- deploy


def deploy_canary(
    settings: Settings,
    clients: Clients,
    line: str,
    version: int,
    upstreams: Sequence[str],
    *,
    actor: str = ACTOR,
) -> DeployOutcome:
    """Load ``<line>-v<version>`` on every replica the line is placed on, probe it, then
    route the recipe's first canary share to it; or say why not (a live canary kept, the
    LoRA budget, a failed probe, which rejects the version and unloads it from every
    replica it reached). Safe to rerun:
    a version that already serves changes nothing."""
    parts = rollout(settings, clients, line, upstreams, actor=actor)
    adapter = adapter_name(line, version)
    done, passed = parts.deploy(version)
    if done.action in ("canary", "shadow"):
        return DeployOutcome(line, adapter, done.action, done.reason, passed)
    if done.action == "probe_failed":
        return DeployOutcome(line, adapter, "failed", done.reason)
    return DeployOutcome(line, adapter, done.action, done.reason)


# --------------------------------------------------------------------------- canary looks


@dataclass(frozen=True, slots=True)
class Judgement:
    """What one look of a judge found: the event for the state machine (from ``state``), the
    look recorded with its outcome, the statistical decision behind it, and what goes to
    the judged adapter's training run once the transition is known (None: nothing)."""

    state: LineState
    event: Event
    look: Look
    decision: CanaryDecision | None = None
    training_run: Callable[[Transition], CanaryRecord | None] = lambda transition: None


# A judge looks at a line's state at a time: what it found, or why there is nothing to judge.
Judge = Callable[[Rollout, LineState, datetime], Judgement | str]


def _judge(
    settings: Settings,
    clients: Clients,
    line: str,
    judge: Judge,
    *,
    upstreams: Sequence[str],
    in_flight: Callable[[str], int] | None,
    now: datetime | None,
    actor: str,
) -> CanaryOutcome:
    """The canary flow's three judges in one skeleton: read the line's state, let ``judge``
    look, then through the door (advance, apply, record the look) and, for a decision that
    ends a stage, onto the training run of the adapter judged."""
    until = now or datetime.now(UTC)
    # Route changes made by this decision are stamped with the decision's time.
    parts = rollout(settings, clients, line, upstreams, in_flight=in_flight, actor=actor, now=until)
    state = parts.state()
    found = judge(parts, state, until)
    if isinstance(found, str):
        return CanaryOutcome(line, "none", found, state.table)
    transition = parts.decide(found.state, found.event, found.look)
    numbers = dict(found.look.numbers)
    record = found.training_run(transition)
    if record is not None:
        _log_to_training_run(parts, found.look.adapter, record, numbers)
    return CanaryOutcome(
        line, transition.action, transition.reason, transition.table, found.decision, numbers
    )


def judge_canary(
    settings: Settings,
    clients: Clients,
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
    """Decide on the line's canary and apply it (``force`` skips the test and the soak); the
    decision is recorded with its numbers. ``look`` counts this share's decisions so far + 1."""
    judge = partial(_canary_look, look=look, force=force, reason=reason)
    return _judge(settings, clients, line, judge, upstreams=upstreams, in_flight=in_flight,
                  now=now, actor=actor)  # fmt: skip


def _canary_look(
    parts: Rollout,
    state: LineState,
    until: datetime,
    *,
    look: int | None,
    force: CanaryAction | None,
    reason: str | None,
) -> Judgement | str:
    """The canary against the champion since its share started (the anytime-valid test, or
    the operator's ``force``)."""
    table, line = state.table, parts.line
    if table.canary is None:
        return "no canary on this line"
    adapter, arms = table.canary, [table.champion, table.canary]
    since = state.step_started or datetime.min.replace(tzinfo=UTC)
    policy = parts.recipe.canary_policy()
    # Each user's first answers and each key's share, as the policy bounds them.
    windows = adapter_windows(parts.store.engine, line, arms, since, until, policy.bound)
    satisfaction, scorer = None, None
    if policy.satisfaction is not None and force is None:
        from composition.satisfaction import arm_satisfaction

        satisfaction, scorer = arm_satisfaction(
            parts.settings, parts.clients, line, arms, since, until, policy.bound
        )
    champion, canary = (_arm(windows, arm, satisfaction) for arm in arms)
    number = look if look is not None else looks_since(parts.store.engine, line, adapter, since) + 1
    numbers: dict[str, Any] = {
        "window_start": since.isoformat(),
        "window_end": until.isoformat(),
        "champion": _recorded(windows[table.champion]),
        "canary": _recorded(windows[adapter]),
    }
    if scorer is not None:
        numbers["satisfaction_scored_by"] = scorer
    decision = None
    if force is not None:
        event = CanaryLooked(force, (reason or f"by hand ({force.value})",), until)
        state = LineState(table, None, state.champion_since)  # by hand: no soak
    else:
        decision = decide_canary(champion, canary, policy, look=number)
        event = CanaryLooked(decision.action, decision.reasons, until)
        numbers["checks"] = [asdict(check) for check in decision.checks]
        numbers["worse_alpha"] = decision.worse_alpha
        numbers["non_inferior_alpha"] = decision.non_inferior_alpha
        if policy.satisfaction is not None:
            # Satisfaction's own level (its share of the rollback budget), beside the guardrails'.
            numbers["satisfaction_worse_alpha"] = policy.satisfaction_worse_alpha

    def training_run(transition: Transition) -> CanaryRecord | None:
        if transition.action not in ("promote", "rollback"):
            return None
        return canary_record(transition.action, transition.reason, adapter, actor=parts.actor,
                             decided_at=until, fraction=table.canary_fraction, look=number,
                             requests=(champion.requests, canary.requests),
                             checks=decision.checks if decision is not None else ())  # fmt: skip

    judged = Look(adapter, table.canary_fraction, number, until, numbers)
    return Judgement(state, event, judged, decision, training_run)


def _log_to_training_run(
    parts: Rollout, adapter: str, record: CanaryRecord, numbers: dict[str, Any]
) -> None:
    """The decision on the run that trained ``adapter``, where its offline evaluation is.

    Best effort: the decision is applied and recorded in the store by now, and MLflow
    failing here must not make the flow report it as not taken.
    """
    from mlflow.exceptions import MlflowException

    try:
        parts.registry.log_canary_outcome(parts.line, version_of(adapter), record, numbers)
    except (MlflowException, FlywheelError, OSError) as exc:
        logger.warning(
            "%s: %s of %s not logged to its training run in MLflow: %s",
            parts.line,
            record.action,
            adapter,
            exc,
        )


# --------------------------------------------------------------------------- shadow looks


def judge_shadow_stage(
    settings: Settings,
    clients: Clients,
    line: str,
    *,
    upstreams: Sequence[str] = (),
    in_flight: Callable[[str], int] | None = None,
    now: datetime | None = None,
    actor: str = ACTOR,
) -> CanaryOutcome:
    """Judge the line's shadow on its answers so far (``registry.shadow``) and apply it: on to
    the recipe's first canary share, rolled back (unloaded, the version rejected), or left
    to answer more. Recorded with the canary's decisions, with its numbers."""
    return _judge(settings, clients, line, _shadow_look, upstreams=upstreams,
                  in_flight=in_flight, now=now, actor=actor)  # fmt: skip


def _shadow_look(parts: Rollout, state: LineState, until: datetime) -> Judgement | str:
    """The shadow's answers against the champion's on the same requests since it started."""
    table = state.table
    if table.shadow is None:
        return "no shadow on this line"
    history = parts.routes.history(parts.line, limit=500)
    since = shadow_since(history, table) or datetime.min.replace(tzinfo=UTC)
    report = shadow_report(parts.store, table, history, until)
    decision = judge_shadow(report, parts.recipe.rollout.shadow)
    numbers = {
        "window_start": since.isoformat(),
        "window_end": until.isoformat(),
        "shadow": report.as_dict(),
        "checks": [asdict(check) for check in decision.checks],
    }
    look = looks_since(parts.store.engine, parts.line, table.shadow, since) + 1
    event = ShadowLooked(decision.action, decision.reasons, until)
    return Judgement(state, event, Look(table.shadow, table.shadow_fraction, look, until, numbers))


# --------------------------------------------------------------------------- champion watch


def watch_champion(
    settings: Settings,
    clients: Clients,
    line: str,
    *,
    upstreams: Sequence[str] = (),
    in_flight: Callable[[str], int] | None = None,
    now: datetime | None = None,
    actor: str = ACTOR,
) -> CanaryOutcome:
    """While the recipe's ``watch_s`` runs after a promotion: the champion since then against
    ``previous`` over the ``watch_s`` before it, on the canary's test; shown worse → revert
    (routing and alias together, ``previous`` reloaded, the reason in MLflow)."""
    return _judge(settings, clients, line, _champion_look, upstreams=upstreams,
                  in_flight=in_flight, now=now, actor=actor)  # fmt: skip


def _champion_look(parts: Rollout, state: LineState, until: datetime) -> Judgement | str:
    """The champion since its promotion against ``previous`` before it."""
    table, line = state.table, parts.line
    if not watching(state, until, parts.recipe.rollout):
        return "the champion is not under watch"
    assert state.champion_since is not None
    assert table.champion is not None
    since, champion, previous = state.champion_since, table.champion, table.previous
    # previous as champion over the watch period before the promotion (at least as long as
    # the champion has served since): its settled numbers, not a few minutes of them.
    before = since - max(until - since, timedelta(seconds=parts.recipe.rollout.watch_s))
    policy, engine = parts.recipe.canary_policy(), parts.store.engine
    then = adapter_windows(engine, line, [previous], before, since, policy.bound)
    lately = adapter_windows(engine, line, [champion], since, until, policy.bound)
    # The test of "worse" is anytime-valid; look 1 keeps max_looks (a canary's patience)
    # from turning "not proven non-inferior yet" into a revert.
    watched = ArmNames(champion="previous champion", canary="new champion")
    decision = decide_canary(
        _arm(then, previous), _arm(lately, champion), policy, look=1, names=watched
    )
    numbers = {
        "window_start": before.isoformat(),
        "promoted_at": since.isoformat(),
        "window_end": until.isoformat(),
        "previous": _recorded(then[previous]),
        "champion": _recorded(lately[champion]),
        "checks": [asdict(check) for check in decision.checks],
    }
    look = looks_since(engine, line, champion, since) + 1
    event = ChampionJudged(decision.action is CanaryAction.ROLLBACK, decision.reasons, until)

    def training_run(transition: Transition) -> CanaryRecord | None:
        if transition.action != "revert":
            return None
        return canary_record("revert", transition.reason, champion, actor=parts.actor,
                             decided_at=until, fraction=1.0, look=1,
                             requests=(then[previous].requests, lately[champion].requests),
                             checks=decision.checks, prefix="watch",
                             arms=("previous", "champion"))  # fmt: skip

    judged = Look(champion, 1.0, look, until, numbers)
    return Judgement(state, event, judged, decision, training_run)


def set_champion(
    settings: Settings,
    clients: Clients,
    line: str,
    adapter: str | None,
    upstreams: Sequence[str],
    *,
    reason: str,
    actor: str,
) -> Transition:
    """Make ``adapter`` (None: the base model) the champion by hand: loaded everywhere, then
    routing and MLflow's aliases moved together; the adapter leaving ``previous`` unloaded."""
    return rollout(settings, clients, line, upstreams, actor=actor).by_hand(
        ChampionSetByHand(adapter, reason)
    )


def live_canary_wait(settings: Settings, line: str) -> str | None:
    """Why the line's night waits: a canary still live under ``on_live_canary: keep``."""
    if recipe_for(settings, line).rollout.on_live_canary != "keep":
        return None
    with open_clients(settings) as clients:
        table = clients.routes.table(line)
    if table.canary is None:
        return None
    return (
        f"canary {table.canary} is still live at {table.canary_fraction:.0%}; the line waits "
        "for its decision (rollout.on_live_canary: keep), its new data stays for next night"
    )
