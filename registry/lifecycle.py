"""A line's rollout as one pure state machine: (state, event) → transition.

The state is what serves (the routing table) and since when: when the
canary's current share started (its soak clock) and when the champion was
promoted (its watch clock), both read off the routing history by
:func:`step_started` and :func:`champion_since`. An event is something that
happened: a candidate passed the gate, probes ran on the replicas, the canary
flow looked, the watched champion was judged, someone moved the champion by
hand, a replica (re)appeared, someone started or stopped a canary or a shadow
by hand. :func:`advance` answers with the next table and
the effects that get there, in the order they must run: loads before the
routing change that needs them, the routing change before the registry's
aliases and tags, unloads last (after a drain). ``registry.rollout`` applies the
effects and nothing else decides.

Rules worth knowing:

- a candidate is refused while an A/B experiment is live on the line
  (``registry.experiments``): one rollout at a time;
- a candidate never silently replaces a live canary: the recipe's
  ``on_live_canary`` keeps the canary (the candidate waits) or replaces it
  with a recorded rollback of the old one;
- a candidate that already serves (it is the champion or the canary) changes
  nothing, so a rerun cannot knock a canary back to its first share;
- a canary steps up or is promoted only after its share soaked for the
  recipe's ``soak_s``; a rollback never waits;
- a probe failure on any replica unloads the candidate from every replica it
  reached and rejects it;
- by hand, a canary or a shadow is probed like a candidate and then replaces
  the one live in its role (rolled back, with the operator's reason); a stop by
  hand is a rollback: out of the routes, rejected, unloaded;
- a promotion unloads the adapter that drops out of ``previous``; the new
  champion is then watched against ``previous`` for ``watch_s`` and reverted
  when it regresses;
- every plan must fit the server's LoRA budget (``--max-loras``) over all lines,
  counted per replica when lines are placed on some replicas only
  (``registry.placement``); a line's adapters are loaded where it is placed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from registry.canary import CanaryAction
from registry.names import adapter_name, version_of
from registry.placement import adapters_by_replica, placed
from registry.routing import RoutingTable
from registry.shadow import ShadowAction, ShadowPolicy


class RolloutPolicy(BaseModel):
    """How a line's adapters go in front of users (a recipe setting: ``rollout``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    soak_s: float = Field(
        default=3_600.0,
        ge=0,
        description="Least time at each canary share before it steps up or is promoted "
        "(hours in production; the seed says 1-5% for a few hours).",
    )
    watch_s: float = Field(
        default=86_400.0,
        ge=0,
        description="After a promotion, how long the champion is judged against previous "
        "and reverted when it regresses (0: not watched).",
    )
    on_live_canary: Literal["keep", "replace"] = Field(
        default="keep",
        description="A candidate arriving while a canary (or a shadow) is live: keep it (the "
        "candidate waits for a later night) or replace it with a recorded rollback.",
    )
    shadow: ShadowPolicy = Field(
        default_factory=ShadowPolicy,
        description="With a fraction above 0, a new candidate first answers that share of the "
        "champion's requests in shadow (never shown) and goes on the canary once its answers "
        "are judged no worse (registry.shadow).",
    )


# --------------------------------------------------------------------------- state


class ChangeRecord(Protocol):
    """One routing change as the history gives it (``registry.routes.RouteChangeRecord``)."""

    @property
    def action(self) -> str: ...
    @property
    def table(self) -> RoutingTable: ...
    @property
    def created_at(self) -> datetime: ...


def step_started(history: Sequence[ChangeRecord], table: RoutingTable) -> datetime | None:
    """When ``table``'s canary got its current share (``history`` newest first); None when
    there is no canary or the history does not reach back to it."""
    if table.canary is None:
        return None
    start = None
    for change in history:
        same = (
            change.table.canary == table.canary
            and abs(change.table.canary_fraction - table.canary_fraction) < 1e-9
        )
        if not same:
            break
        start = change.created_at
    return start


def shadow_since(history: Sequence[ChangeRecord], table: RoutingTable) -> datetime | None:
    """When ``table``'s shadow started answering (``history`` newest first); None when there
    is no shadow or the history does not reach back to it."""
    if table.shadow is None:
        return None
    start = None
    for change in history:
        if change.table.shadow != table.shadow:
            break
        start = change.created_at
    return start


def champion_since(history: Sequence[ChangeRecord], table: RoutingTable) -> datetime | None:
    """When ``table``'s champion became champion (``history`` newest first)."""
    start = None
    for change in history:
        if change.table.champion != table.champion:
            break
        start = change.created_at
    return start


@dataclass(frozen=True, slots=True)
class LineState:
    """What serves a line and since when."""

    table: RoutingTable
    step_started: datetime | None = None
    champion_since: datetime | None = None

    @classmethod
    def of(cls, table: RoutingTable, history: Sequence[ChangeRecord]) -> LineState:
        """The state read off the line's table and its routing history (newest first)."""
        return cls(table, step_started(history, table), champion_since(history, table))


# --------------------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Load:
    """Load ``adapter`` (idempotent) on ``replicas``, every replica when None."""

    adapter: str
    replicas: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Unload:
    """Unload ``adapter`` from ``replicas`` (every replica when None) once drained."""

    adapter: str
    replicas: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Route:
    """Store ``table`` as the line's routing table; ``action`` names it in the history."""

    table: RoutingTable
    action: str


@dataclass(frozen=True, slots=True)
class Promote:
    """Registry: ``version`` becomes champion, the old champion ``previous``."""

    version: int


@dataclass(frozen=True, slots=True)
class Reject:
    """Registry: tag ``version`` rolled back with the reason; drop its canary/candidate aliases."""

    version: int


@dataclass(frozen=True, slots=True)
class Revert:
    """Registry: ``restored`` back as champion; ``version`` (the champion) tagged rolled back."""

    version: int
    restored: int


@dataclass(frozen=True, slots=True)
class SetAlias:
    """Registry: point ``alias`` at ``version``, or remove it (None)."""

    alias: str
    version: int | None


Effect = Load | Unload | Route | Promote | Reject | Revert | SetAlias


@dataclass(frozen=True, slots=True)
class Transition:
    """What an event leads to: an action name, why, the table after, and the effects."""

    action: str
    reasons: tuple[str, ...]
    table: RoutingTable
    effects: tuple[Effect, ...] = ()

    @property
    def reason(self) -> str:
        """The reasons as one line (routing history, MLflow tags, reports)."""
        return "; ".join(self.reasons)


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class CandidateReady:
    """A registered version passed the gate and may go on a canary."""

    adapter: str


@dataclass(frozen=True, slots=True)
class CanaryStartedByHand:
    """Someone sent ``fraction`` of the line's users (sticky) to ``adapter``."""

    adapter: str
    fraction: float
    reason: str


@dataclass(frozen=True, slots=True)
class ShadowStartedByHand:
    """Someone had ``adapter`` answer ``fraction`` of the champion's requests in shadow."""

    adapter: str
    fraction: float
    reason: str


@dataclass(frozen=True, slots=True)
class ProbesDone:
    """The candidate was loaded and probed: ``passed`` replicas, ``failed`` ones with why.
    ``by_hand``: the operator's start it was probed for (None: the recipe places it)."""

    adapter: str
    passed: tuple[str, ...]
    failed: Mapping[str, str] = field(default_factory=dict)
    by_hand: CanaryStartedByHand | ShadowStartedByHand | None = None


@dataclass(frozen=True, slots=True)
class CanaryLooked:
    """The canary flow's statistical decision on the canary's current share."""

    action: CanaryAction
    reasons: tuple[str, ...]
    now: datetime


@dataclass(frozen=True, slots=True)
class ShadowLooked:
    """The canary flow's comparison of the shadow's answers with the champion's."""

    action: ShadowAction
    reasons: tuple[str, ...]
    now: datetime


@dataclass(frozen=True, slots=True)
class ChampionJudged:
    """The watched champion against ``previous``: ``regressed`` when shown worse."""

    regressed: bool
    reasons: tuple[str, ...]
    now: datetime


@dataclass(frozen=True, slots=True)
class ChampionSetByHand:
    """Someone made ``adapter`` (None: the base model) the champion."""

    adapter: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class CanaryStoppedByHand:
    """Someone took the canary out of traffic."""

    reason: str


@dataclass(frozen=True, slots=True)
class ShadowStoppedByHand:
    """Someone stopped mirroring the line's requests to its shadow."""

    reason: str


@dataclass(frozen=True, slots=True)
class ReplicaAppeared:
    """A vLLM replica came (back): it must serve every adapter the table names."""

    replica: str


Event = (
    CandidateReady
    | ProbesDone
    | CanaryLooked
    | ShadowLooked
    | ChampionJudged
    | ChampionSetByHand
    | CanaryStartedByHand
    | CanaryStoppedByHand
    | ShadowStartedByHand
    | ShadowStoppedByHand
    | ReplicaAppeared
)
# What an operator does to a line's rollout (``flywheel canary``, ``flywheel routes``).
ByHand = (
    ChampionSetByHand
    | CanaryStartedByHand
    | CanaryStoppedByHand
    | ShadowStartedByHand
    | ShadowStoppedByHand
)


# --------------------------------------------------------------------------- the machine


def advance(
    state: LineState,
    event: Event,
    *,
    policy: RolloutPolicy,
    steps: Sequence[float],
    budget: LoraBudget | None = None,
) -> Transition:
    """The transition ``event`` causes from ``state`` under the line's policy and canary
    ``steps`` (shares, rising, the last 1.0 or below); ``budget`` checks new adapters fit."""
    match event:
        case CandidateReady(adapter):
            transition = _candidate(state, adapter, policy, budget)
        case ProbesDone():
            transition = _probed(state, event, steps, policy)
        case CanaryLooked():
            transition = _canary_looked(state, event, steps, policy)
        case ShadowLooked():
            transition = _shadow_looked(state.table, event, steps)
        case ChampionJudged():
            transition = _champion_judged(state, event, policy)
        case ChampionSetByHand(adapter, reason):
            transition = _champion_by_hand(state.table, adapter, reason)
        case CanaryStartedByHand() | ShadowStartedByHand():
            transition = _started_by_hand(state.table, event, budget)
        case CanaryStoppedByHand(reason):
            transition = _stopped_by_hand(state.table, reason)
        case ShadowStoppedByHand(reason):
            transition = _shadow_stopped_by_hand(state.table, reason)
        case ReplicaAppeared(replica):
            transition = _replica_appeared(state.table, replica)
        case _:  # pragma: no cover
            raise TypeError(f"not a rollout event: {event!r}")
    return transition


def _stopped_by_hand(table: RoutingTable, reason: str) -> Transition:
    if table.canary is None:
        return Transition("none", ("no canary on this line",), table)
    return _rollback(table, (reason,))


def _shadow_stopped_by_hand(table: RoutingTable, reason: str) -> Transition:
    shadow = table.shadow
    if shadow is None:
        return Transition("none", ("no shadow on this line",), table)
    after = table.without_shadow()
    effects = (Route(after, "shadow_clear"), Reject(version_of(shadow)), Unload(shadow))
    return Transition("shadow_reject", (reason,), after, effects)


def _by_hand_table(
    table: RoutingTable, event: CanaryStartedByHand | ShadowStartedByHand
) -> RoutingTable | str:
    """The table the operator asks for, or why it cannot be (another line's adapter, the
    champion as canary, a live experiment)."""
    try:
        if isinstance(event, CanaryStartedByHand):
            return table.with_canary(event.adapter, event.fraction)
        return table.with_shadow(event.adapter, event.fraction)
    except ValidationError as exc:
        return str(exc.errors()[0]["msg"]).removeprefix("Value error, ")


def _started_by_hand(
    table: RoutingTable,
    event: CanaryStartedByHand | ShadowStartedByHand,
    budget: LoraBudget | None,
) -> Transition:
    """A canary or a shadow by hand: refused when the table cannot hold it or the LoRA budget
    cannot serve it; else probed first, like a candidate (``ProbesDone.by_hand``)."""
    adapter, line = event.adapter, table.business_line
    role = "canary" if isinstance(event, CanaryStartedByHand) else "shadow"
    planned = _by_hand_table(table, event)
    if isinstance(planned, str):
        refusal = f"{adapter} cannot be the {role} of {line}: {planned}"
        return Transition("refused", (refusal,), table)
    if budget is not None and adapter not in table.adapters:
        needed = budget.needed_with(line, adapter, replacing=getattr(table, role))
        if needed > budget.max_loras:
            return Transition(
                "refused",
                (
                    f"{adapter} would make {needed} adapters served at once, over the "
                    f"server's {budget.limit()}: {budget.describe()}",
                ),
                table,
            )
    probing = f"loading {adapter} where {line} is placed to probe it"
    return Transition("load", (event.reason, probing), table, (Load(adapter),))


def _placed_by_hand(
    table: RoutingTable, event: ProbesDone, hand: CanaryStartedByHand | ShadowStartedByHand
) -> Transition:
    """The probed adapter in the role the operator asked for; the one it replaces there is
    rolled back (rejected, unloaded)."""
    adapter = event.adapter
    planned = _by_hand_table(table, hand)
    if isinstance(planned, str):
        return Transition("refused", (planned,), table)
    role = "canary" if isinstance(hand, CanaryStartedByHand) else "shadow"
    replaced = table.canary if role == "canary" else table.shadow
    reasons = [hand.reason]
    if event.passed:
        reasons.append(f"{adapter} probed on {len(event.passed)} replica(s)")
    effects: list[Effect] = [Route(planned, f"{role}_set")]
    if replaced is not None and replaced not in planned.adapters:
        reasons.append(f"replaces {role} {replaced} (rolled back by hand)")
        effects += [Reject(version_of(replaced)), Unload(replaced)]
    if role == "canary":
        effects.append(SetAlias("canary", version_of(adapter)))
    return Transition(role, tuple(reasons), planned, tuple(effects))


def _replica_appeared(table: RoutingTable, replica: str) -> Transition:
    loads = tuple(Load(a, (replica,)) for a in sorted(table.adapters))
    why = f"{replica} must serve {', '.join(sorted(table.adapters)) or 'no adapter'}"
    return Transition("reload", (why,), table, loads)


def _not_now(table: RoutingTable, adapter: str, policy: RolloutPolicy) -> Transition | None:
    """Why a candidate does not start its rollout now: it already serves, or a canary or a
    shadow is live and the recipe keeps it."""
    if adapter == table.champion:
        return Transition("none", (f"{adapter} is already the champion",), table)
    if adapter == table.canary:
        return Transition(
            "none", (f"{adapter} is already the canary at {table.canary_fraction:.0%}",), table
        )
    if table.canary is not None and policy.on_live_canary == "keep":
        return Transition(
            "kept_canary",
            (
                f"canary {table.canary} is still live at {table.canary_fraction:.0%}: "
                f"{adapter} waits (rollout.on_live_canary: keep)",
            ),
            table,
        )
    if adapter == table.shadow:
        return Transition("none", (f"{adapter} is already the shadow",), table)
    if table.shadow is not None and policy.on_live_canary == "keep":
        return Transition(
            "kept_shadow",
            (
                f"shadow {table.shadow} is still being judged: {adapter} waits "
                "(rollout.on_live_canary: keep)",
            ),
            table,
        )
    return None


def _experiment_live(table: RoutingTable, adapter: str) -> Transition | None:
    """A candidate refused while an A/B experiment runs on the line (one rollout at a time)."""
    if table.experiment is None:
        return None
    return Transition(
        "refused",
        (
            f"experiment {table.experiment.id} is live on {table.business_line}: {adapter} "
            "waits until it is stopped or promoted (one rollout at a time)",
        ),
        table,
    )


def _candidate(
    state: LineState, adapter: str, policy: RolloutPolicy, budget: LoraBudget | None
) -> Transition:
    table = state.table
    waits = _not_now(table, adapter, policy) or _experiment_live(table, adapter)
    if waits is not None:
        return waits
    if budget is not None:
        # A replaced canary goes, so it does not count against the new one.
        needed = budget.needed_with(table.business_line, adapter, replacing=table.canary)
        if needed > budget.max_loras:
            return Transition(
                "refused",
                (
                    f"{adapter} would make {needed} adapters served at once, over the "
                    f"server's {budget.limit()}: {budget.describe()}",
                ),
                table,
            )
    why = (f"loading {adapter} on every replica to probe it",)
    return Transition("load", why, table, (Load(adapter),))


def _probed(
    state: LineState, event: ProbesDone, steps: Sequence[float], policy: RolloutPolicy
) -> Transition:
    table, adapter = state.table, event.adapter
    if event.failed:
        reached = tuple(sorted({*event.passed, *event.failed}))
        why = tuple(f"probe failed on {replica}: {why}" for replica, why in event.failed.items())
        if adapter in table.adapters:
            # Serving already (a share changed by hand): its route stays, so does it.
            return Transition("probe_failed", why, table)
        return Transition(
            "probe_failed",
            why,
            table,
            (Reject(version_of(adapter)), Unload(adapter, reached)),
        )
    if event.by_hand is not None:
        return _placed_by_hand(table, event, event.by_hand)
    if policy.shadow.fraction > 0:
        return _shadowed(table, event, policy.shadow.fraction)
    fraction = steps[0]
    effects: list[Effect] = []
    reasons = [f"{adapter} probed on {len(event.passed)} replica(s); {fraction:.0%} of users"]
    replaced = table.canary
    if replaced is not None and replaced != adapter:
        # Only reachable with on_live_canary: replace (keep stops at CandidateReady).
        reasons.append(f"replaces canary {replaced} (rolled back: a newer candidate)")
    after = table.with_canary(adapter, fraction)
    effects.append(Route(after, "canary_set"))
    if replaced is not None and replaced != adapter:
        effects.append(Reject(version_of(replaced)))
        effects.append(Unload(replaced))
    effects.append(SetAlias("canary", version_of(adapter)))
    return Transition("canary", tuple(reasons), after, tuple(effects))


def _shadowed(table: RoutingTable, event: ProbesDone, fraction: float) -> Transition:
    """The probed candidate as the line's shadow (the recipe's shadow stage); a canary or
    shadow it replaces (only with on_live_canary: replace) is rolled back."""
    adapter = event.adapter
    reasons = [
        f"{adapter} probed on {len(event.passed)} replica(s); answers {fraction:.0%} of the "
        "champion's requests in shadow before any user sees it"
    ]
    replaced = [a for a in (table.canary, table.shadow) if a is not None and a != adapter]
    reasons += [f"replaces {a} (rolled back: a newer candidate)" for a in replaced]
    after = table.without_canary().with_shadow(adapter, fraction)
    effects: list[Effect] = [Route(after, "shadow_set")]
    for gone in replaced:
        effects += [Reject(version_of(gone)), Unload(gone)]
    if table.canary is not None:
        effects.append(SetAlias("canary", None))
    return Transition("shadow", tuple(reasons), after, tuple(effects))


def _shadow_looked(table: RoutingTable, event: ShadowLooked, steps: Sequence[float]) -> Transition:
    """The shadow judged: on the first canary share, rolled back, or left to answer more."""
    shadow = table.shadow
    if shadow is None:
        return Transition("none", ("no shadow on this line",), table)
    if event.action is ShadowAction.REJECT:
        after = table.without_shadow()
        clear = (Route(after, "shadow_clear"), Reject(version_of(shadow)), Unload(shadow))
        return Transition("shadow_reject", event.reasons, after, clear)
    if event.action is ShadowAction.ADVANCE and table.canary is not None:
        why = f"canary {table.canary} is live: {shadow} stays in shadow until it is decided"
        return Transition("shadow_wait", (*event.reasons, why), table)
    if event.action is ShadowAction.WAIT:
        return Transition("shadow_wait", event.reasons, table)
    after = table.with_canary(shadow, steps[0])
    reasons = (*event.reasons, f"{shadow} on {steps[0]:.0%} of users")
    effects = (Route(after, "canary_set"), SetAlias("canary", version_of(shadow)))
    return Transition("shadow_advance", reasons, after, effects)


def _soaked(state: LineState, now: datetime, policy: RolloutPolicy) -> float | None:
    """Seconds still to soak at this share, or None when soaked."""
    if policy.soak_s <= 0 or state.step_started is None:
        return None
    left = policy.soak_s - (now - state.step_started).total_seconds()
    return left if left > 0 else None


def _canary_looked(
    state: LineState, event: CanaryLooked, steps: Sequence[float], policy: RolloutPolicy
) -> Transition:
    table = state.table
    if table.canary is None:
        return Transition("none", ("no canary on this line",), table)
    if event.action is CanaryAction.ROLLBACK:
        return _rollback(table, event.reasons)
    if event.action is CanaryAction.WAIT:
        return Transition("wait", event.reasons, table)
    left = _soaked(state, event.now, policy)
    if left is not None:
        return Transition(
            "wait",
            (
                *event.reasons,
                f"soaking: {table.canary_fraction:.0%} for {policy.soak_s:g} s, {left:.0f} s to go",
            ),
            table,
        )
    higher = [step for step in steps if step > table.canary_fraction + 1e-9]
    if higher and higher[0] < 1.0:
        after = table.with_canary(table.canary, higher[0])
        return Transition("step_up", event.reasons, after, (Route(after, "canary_set"),))
    return _promote(table, event.reasons)


def _promote(table: RoutingTable, reasons: tuple[str, ...]) -> Transition:
    assert table.canary is not None
    adapter = table.canary
    after = table.with_champion(adapter).without_canary()
    effects: list[Effect] = [
        Route(after, "champion_set"),
        Promote(version_of(adapter)),
        SetAlias("canary", None),
    ]
    dropped = table.previous
    if dropped is not None and dropped not in after.adapters:
        effects.append(Unload(dropped))
    return Transition("promote", reasons, after, tuple(effects))


def _rollback(table: RoutingTable, reasons: tuple[str, ...]) -> Transition:
    assert table.canary is not None
    adapter = table.canary
    after = table.without_canary()
    return Transition(
        "rollback",
        reasons,
        after,
        (Route(after, "canary_clear"), Reject(version_of(adapter)), Unload(adapter)),
    )


def watching(state: LineState, now: datetime, policy: RolloutPolicy) -> bool:
    """Whether the champion is still under watch against ``previous``."""
    table = state.table
    if policy.watch_s <= 0 or table.champion is None or table.previous is None:
        return False
    if state.champion_since is None:
        return False
    return now - state.champion_since < timedelta(seconds=policy.watch_s)


def _champion_judged(state: LineState, event: ChampionJudged, policy: RolloutPolicy) -> Transition:
    table = state.table
    if not watching(state, event.now, policy):
        return Transition("none", ("the champion is not under watch",), table)
    if not event.regressed:
        return Transition("watch", event.reasons, table)
    assert table.champion is not None
    assert table.previous is not None
    regressed, restored = table.champion, table.previous
    canary = table.canary if table.canary != restored else None
    shadow = table.shadow if table.shadow != restored else None
    after = RoutingTable(
        business_line=table.business_line,
        champion=restored,
        canary=canary,
        canary_fraction=table.canary_fraction,
        previous=None,
        shadow=shadow,
        shadow_fraction=table.shadow_fraction if shadow else 0.0,
        replicas=table.replicas,
    )
    reasons = (f"champion {regressed} regressed against {restored}", *event.reasons)
    return Transition(
        "revert",
        reasons,
        after,
        (
            Load(restored),
            Route(after, "champion_revert"),
            Revert(version_of(regressed), version_of(restored)),
            Unload(regressed),
        ),
    )


def _champion_by_hand(table: RoutingTable, adapter: str | None, reason: str) -> Transition:
    if adapter == table.champion:
        return Transition("none", (f"{adapter or 'the base model'} is already champion",), table)
    after = table.with_champion(adapter)
    effects: list[Effect] = []
    if adapter is not None:
        effects.append(Load(adapter))
    effects.append(Route(after, "champion_set"))
    if adapter is not None:
        effects.append(Promote(version_of(adapter)))
        if table.canary == adapter:
            effects.append(SetAlias("canary", None))
    else:
        effects.append(SetAlias("champion", None))
        effects.append(SetAlias("previous", version_of(table.champion) if table.champion else None))
    dropped = table.previous
    if dropped is not None and dropped not in after.adapters:
        effects.append(Unload(dropped))
    return Transition("champion_set", (reason,), after, tuple(effects))


# --------------------------------------------------------------------------- budget and drift


@dataclass(frozen=True, slots=True)
class LoraBudget:
    """The adapters every line's table names, against the server's ``--max-loras``: over
    all lines, or per replica when ``replicas`` are given (a placed line counts only on the
    replicas it is placed on). ``source`` says where ``max_loras`` was read (a replica's
    record, what vLLM reports, a setting)."""

    max_loras: int
    tables: Mapping[str, RoutingTable]
    replicas: Sequence[str] = ()
    source: str = ""

    def limit(self) -> str:
        """``--max-loras 4``, with where it was read when known."""
        return f"--max-loras {self.max_loras}" + (f" ({self.source})" if self.source else "")

    def served(self) -> set[str]:
        """Every adapter some table names (each may be requested at any time)."""
        return {a for table in self.tables.values() for a in table.adapters}

    def most_on_one_replica(self) -> int:
        """The adapters served at once by the fullest replica (all of them without replicas)."""
        if not self.replicas:
            return len(self.served())
        held = adapters_by_replica(self.tables.values(), self.replicas)
        return max(len(adapters) for adapters in held.values())

    def needed_with(self, line: str, adapter: str, *, replacing: str | None = None) -> int:
        """Adapters served at once (by the fullest replica the line is on, when ``replicas``
        are given) once ``adapter`` joins ``line`` (``replacing`` leaves)."""
        if not self.replicas:
            held = {"": self.served()}
        else:
            table = self.tables.get(line) or RoutingTable(business_line=line)
            home = placed(table, self.replicas)
            held = {
                url: adapters
                for url, adapters in adapters_by_replica(
                    self.tables.values(), self.replicas
                ).items()
                if url in home
            }
        counts = [len((adapters | {adapter}) - {replacing}) for adapters in held.values()]
        return max(counts)

    def describe(self) -> str:
        """Per line, what it serves."""
        return ", ".join(
            f"{line}: {len(table.adapters)}" for line, table in sorted(self.tables.items())
        )


def alias_repairs(table: RoutingTable, aliases: Mapping[str, int]) -> tuple[SetAlias, ...]:
    """The moves that make MLflow's ``champion`` and ``canary`` aliases follow the routing
    table, the one source of truth (the gateway serves what it says)."""
    moves = []
    for alias, role in (("champion", table.champion), ("canary", table.canary)):
        want = version_of(role) if role is not None else None
        if aliases.get(alias) != want:
            moves.append(SetAlias(alias, want))
    return tuple(moves)


def drift(
    table: RoutingTable,
    aliases: Mapping[str, int],
    loaded: Mapping[str, Iterable[str] | None],
) -> list[str]:
    """What differs for one line between its routing table, its MLflow aliases and the
    adapters each replica serves (``loaded[replica]`` None: the replica did not answer); a
    placed line's adapters are expected on its replicas only."""
    line = table.business_line
    problems = []
    for alias, role in (("champion", table.champion), ("canary", table.canary)):
        want = version_of(role) if role is not None else None
        have = aliases.get(alias)
        if want != have:
            problems.append(
                f"{line}: routing {alias} is {role or 'none'} but MLflow @{alias} is "
                f"{f'v{have}' if have is not None else 'unset'}"
            )
    own = f"{line}-v"
    # A gated candidate is loaded for its probe before any route names it.
    probing = {adapter_name(line, aliases["candidate"])} if "candidate" in aliases else set()
    home = placed(table, list(loaded))
    for replica, names in sorted(loaded.items()):
        if names is None:
            problems.append(f"{line}: replica {replica} did not answer")
            continue
        served = {n for n in names if n.startswith(own)}
        if replica.rstrip("/") not in home:
            for stray in sorted(served & table.adapters):
                problems.append(
                    f"{line}: {stray} is loaded on {replica}, where {line} is not placed"
                )
            served -= table.adapters
        else:
            for missing in sorted(table.adapters - served):
                problems.append(f"{line}: {missing} is routed but not loaded on {replica}")
        for leaked in sorted(served - table.adapters - probing):
            problems.append(f"{line}: {leaked} is loaded on {replica} but no route names it")
    return problems
