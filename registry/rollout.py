"""The one door to a line's rollout: every change of a line's routing goes through here.

The nightly's deploy, the canary flow's three judges, the operator's commands
(``flywheel canary set/clear/promote/rollback``, ``canary shadow set/clear``,
``routes champion``) and the loop all do the same four things, here and only
here: read the line's state (its routing table and history), ask
:func:`registry.lifecycle.advance` what the event leads to, apply the effects
in their order (loads on the replicas the line is placed on, the routing table,
checked unchanged since it was read, MLflow's aliases and tags, then drained
unloads) and record the decision (a judge's look in the decision log; every
routing change in the routing history with its actor and reason; a rejection on
the MLflow version). :class:`~registry.routes.RouteStore` only stores a table.

The champion has one source of truth, the routing table: the gateway serves what
it says. MLflow's ``champion`` and ``canary`` aliases follow it (every transition
moves both); :meth:`LineRollout.repair_aliases` puts back an alias that drifted.

A version the registry does not hold (an adapter an operator loaded on vLLM by
hand and routed with ``--no-check``) has no alias or tag to move: those effects
are skipped, with a warning, and ``flywheel lifecycle check`` shows the drift.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flywheel.errors import FlywheelError, UsageError
from registry.decisions import record_decision
from registry.lifecycle import (
    ByHand,
    CanaryStartedByHand,
    CandidateReady,
    Event,
    LineState,
    Load,
    LoraBudget,
    ProbesDone,
    Promote,
    Reject,
    Revert,
    RolloutPolicy,
    Route,
    SetAlias,
    ShadowStartedByHand,
    Transition,
    Unload,
    advance,
    alias_repairs,
)
from registry.names import adapter_name, version_of
from registry.placement import placed
from registry.replicas import ReplicaStore, load_checked
from registry.routes import RouteStore
from registry.routing import RoutingTable

if TYPE_CHECKING:
    from feedback.store import FeedbackStore
    from registry.tracking import Registry
    from registry.vllm_admin import VllmAdminClient

ACTOR = "flywheel:canary"
DRAIN_TIMEOUT_S = 120.0
logger = logging.getLogger(__name__)


class RoutesChangedError(FlywheelError):
    """The line's routing changed between reading its state and applying a transition."""


class RolloutServices(Protocol):
    """What the door reaches besides the routing tables: the MLflow registry (opened on
    first use) and an admin client per vLLM replica (the caller's clients)."""

    @property
    def registry(self) -> Registry:
        """The MLflow registry."""
        ...

    def vllm_admin(self, url: str) -> VllmAdminClient:
        """A new admin client to the replica at ``url``; the caller closes it."""
        ...

    @property
    def replicas(self) -> ReplicaStore:
        """The replicas' records (the base each serves: an adapter of another is refused)."""
        ...


class LineClients(RolloutServices, Protocol):
    """The door's services with the feedback store and the routing tables: what a use case
    over the lines reads (the composition root's clients are one)."""

    @property
    def store(self) -> FeedbackStore:
        """The feedback store."""
        ...

    @property
    def routes(self) -> RouteStore:
        """The routing tables."""
        ...


@dataclass(frozen=True, slots=True)
class Look:
    """A judge's look, for the decision log: the adapter judged at its share, the look's
    number at that share, when, and the numbers the decision rests on."""

    adapter: str
    fraction: float
    number: int
    when: datetime
    numbers: Mapping[str, Any] = field(default_factory=dict)


class LineRollout:
    """One line's rollout through the caller's routing tables, registry and replicas."""

    def __init__(
        self,
        line: str,
        routes: RouteStore,
        services: RolloutServices,
        upstreams: Sequence[str],
        *,
        policy: RolloutPolicy,
        steps: Sequence[float],
        max_loras: int,
        actor: str = ACTOR,
        in_flight: Callable[[str], int] | None = None,
    ) -> None:
        self.line = line
        self.routes = routes
        self.services = services
        self.upstreams = tuple(upstreams)
        self.policy = policy
        self.steps = tuple(steps)
        self.max_loras = max_loras
        self.actor = actor
        self.in_flight = in_flight

    @property
    def registry(self) -> Registry:
        """The MLflow registry (opened when an effect or a path first needs it)."""
        return self.services.registry

    def state(self) -> LineState:
        """The line's table and its clocks, from the routing history."""
        return LineState.of(self.routes.table(self.line), self.routes.history(self.line, limit=500))

    def budget(self) -> LoraBudget:
        """Every line's routed adapters against the server's ``--max-loras``, per replica."""
        return LoraBudget(self.max_loras, self.routes.snapshot().tables, self.upstreams)

    def advance(self, state: LineState, event: Event) -> Transition:
        """What ``event`` leads to under the line's policy and canary steps."""
        return advance(state, event, policy=self.policy, steps=self.steps, budget=self.budget())

    # ----------------------------------------------------------------------- the door

    def decide(self, state: LineState, event: Event, look: Look | None = None) -> Transition:
        """Advance from ``state`` (read by the caller, who judged it), apply the transition,
        and record a judge's ``look`` with its outcome (unless nothing was to be judged)."""
        transition = self.advance(state, event)
        self.apply(state, transition)
        if look is not None and transition.action != "none":
            record_decision(
                self.routes.engine,
                business_line=self.line,
                adapter=look.adapter,
                fraction=look.fraction,
                look=look.number,
                action=transition.action,
                reasons=transition.reason,
                numbers=dict(look.numbers),
                actor=self.actor,
                when=look.when,
            )
        return transition

    def deploy(self, version: int) -> tuple[Transition, list[str]]:
        """A gated version towards its users: loaded and probed on every replica the line is
        placed on, then on the recipe's first stage (or waiting, refused, or rejected with
        the reason). Returns the transition and the replicas it passed on."""
        adapter = adapter_name(self.line, version)
        state = self.state()
        ready = self.advance(state, CandidateReady(adapter))
        if ready.action != "load":
            return ready, []
        passed, failed = self._probe(adapter, placed(state.table, self.upstreams))
        done = self.advance(state, ProbesDone(adapter, tuple(passed), failed))
        self.apply(state, done)
        return done, passed

    def by_hand(self, event: ByHand, *, check: bool = True) -> Transition:
        """An operator's change: a canary or shadow started (probed and loaded where the line
        is placed, then routed) or stopped (rolled back: out of the routes, its version
        rejected with the reason and actor, unloaded), or a champion set. ``check`` False
        changes the routing alone (no vLLM, no MLflow: an adapter served outside the
        registry). A refusal is a :class:`~flywheel.errors.UsageError` with its reason."""
        state = self.state()
        transition = self.advance(state, event)
        if transition.action == "load":
            assert isinstance(event, CanaryStartedByHand | ShadowStartedByHand)
            passed: list[str] = []
            failed: dict[str, str] = {}
            if check:
                passed, failed = self._probe(
                    event.adapter, placed(state.table, self.upstreams), served_outside=True
                )
            probed = ProbesDone(event.adapter, tuple(passed), failed, by_hand=event)
            transition = self.advance(state, probed)
        self.apply(state, transition, routing_only=not check)
        if transition.action in ("refused", "probe_failed"):
            raise UsageError(f"{self.line}: {transition.reason}")
        return transition

    # ----------------------------------------------------------------------- effects

    def apply(
        self, state: LineState, transition: Transition, *, routing_only: bool = False
    ) -> None:
        """Run the transition's effects in order (``routing_only``: its routing change alone)."""
        reason = transition.reason or transition.action
        for effect in transition.effects:
            if routing_only and not isinstance(effect, Route):
                continue
            match effect:
                case Load(adapter, replicas):
                    self._load(adapter, replicas or placed(state.table, self.upstreams))
                case Route(table, action):
                    self._route(state.table, table, action, reason)
                case Promote(version):
                    with outside_registry_skipped(self.line, version, "@champion"):
                        self.registry.promote(self.line, version, actor=self.actor, reason=reason)
                case Reject(version):
                    with outside_registry_skipped(self.line, version, "rejection"):
                        self.registry.reject(self.line, version, reason, actor=self.actor)
                case Revert(version, restored):
                    self.registry.reject(self.line, version, reason, actor=self.actor)
                    self.registry.set_alias(self.line, "champion", restored)
                    self.registry.remove_alias(self.line, "previous")
                case SetAlias():
                    move_alias(self.registry, self.line, effect)
                case Unload(adapter, replicas):
                    self.unload(adapter, replicas or self.upstreams)

    def adapter_path(self, adapter: str) -> Path:
        """The folder vLLM loads ``adapter`` from."""
        return self.registry.adapter_path(self.line, version_of(adapter))

    def _load(self, adapter: str, replicas: Sequence[str]) -> None:
        path = self.adapter_path(adapter)
        for url in replicas:
            with self.services.vllm_admin(url) as client:
                load_checked(client, adapter, path, self.services.replicas)

    def _probe(
        self, adapter: str, replicas: Sequence[str], *, served_outside: bool = False
    ) -> tuple[list[str], dict[str, str]]:
        """Load ``adapter`` on ``replicas`` and probe it there: the replicas it passed on,
        and those it failed on with why. ``served_outside``: a version the registry does
        not hold is probed where it is loaded already (refused where it is not)."""
        from registry.vllm_admin import VllmAdminError, VllmUnavailableError

        version = version_of(adapter)
        path = None
        if served_outside:
            with outside_registry_skipped(self.line, version, "files"):
                path = self.adapter_path(adapter)
        else:
            path = self.adapter_path(adapter)
        passed: list[str] = []
        failed: dict[str, str] = {}
        for url in replicas:
            try:
                with self.services.vllm_admin(url) as client:
                    if path is not None:
                        # A replica serving another base refuses it: a failed probe there.
                        load_checked(client, adapter, path, self.services.replicas)
                    elif client.served_adapter(adapter) is None:
                        raise UsageError(
                            f"{adapter} is not loaded on {url} and the registry has no version "
                            f"{version} to load it from (register it, or load it on vLLM first)"
                        )
                    probe = client.probe_adapter(adapter)
            except VllmUnavailableError:
                # Not the adapter's fault: leave nothing behind and let the caller retry.
                self.unload(adapter, passed)
                raise
            except VllmAdminError as exc:
                failed[url] = str(exc)
                continue
            if probe.passed:
                passed.append(url)
            else:
                failed[url] = "; ".join(probe.reasons)
        return passed, failed

    def _route(self, before: RoutingTable, after: RoutingTable, action: str, reason: str) -> None:
        def edit(current: RoutingTable) -> RoutingTable:
            if current != before:
                raise RoutesChangedError(
                    f"{self.line}'s routing changed meanwhile ({current.model_dump()}); "
                    "nothing was applied, look again"
                )
            return after

        self.routes.change(self.line, edit, action=action, actor=self.actor, reason=reason)

    def unload(self, adapter: str, replicas: Sequence[str]) -> None:
        """Drain, then unload; a replica that fails keeps it until the next reconcile."""
        from registry.vllm_admin import AdapterNotLoadedError, VllmAdminError, wait_drained

        for url in replicas:
            try:
                if self.in_flight is not None:
                    wait_drained(adapter, self.in_flight, timeout_s=DRAIN_TIMEOUT_S)
                with (
                    self.services.vllm_admin(url) as client,
                    contextlib.suppress(AdapterNotLoadedError),
                ):
                    client.unload_adapter(adapter)
            except VllmAdminError as exc:
                logger.warning(
                    "%s: could not unload %s from %s: %s (reconcile retries)",
                    self.line,
                    adapter,
                    url,
                    exc,
                )


@contextlib.contextmanager
def outside_registry_skipped(line: str, version: int, what: str) -> Iterator[None]:
    """Run the block; for a version the registry does not hold (an adapter served outside
    it) the ``what`` it would have given or moved is skipped, said in the log."""
    from registry.tracking import VersionNotFoundError

    try:
        yield
    except VersionNotFoundError:
        logger.warning(
            "%s is not in the registry (served outside it): MLflow's %s not used",
            adapter_name(line, version),
            what,
        )


def move_alias(registry: Registry, line: str, move: SetAlias) -> None:
    """Point ``move.alias`` at its version, or remove it (a version the registry does not
    hold gets no alias)."""
    if move.version is None:
        registry.remove_alias(line, move.alias)
        return
    with outside_registry_skipped(line, move.version, f"@{move.alias}"):
        registry.set_alias(line, move.alias, move.version)


def repair_aliases(routes: RouteStore, registry: Registry, line: str) -> tuple[SetAlias, ...]:
    """Move the line's MLflow ``champion`` and ``canary`` aliases to what its routing table
    serves (the source of truth); the moves made."""
    moves = alias_repairs(routes.table(line), registry.aliases(line))
    for move in moves:
        move_alias(registry, line, move)
    return moves
