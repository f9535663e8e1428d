"""The rollout state machine (pure): every case a review found wedging or leaking on main."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from registry.canary import CanaryAction
from registry.lifecycle import (
    CanaryLooked,
    CanaryStoppedByHand,
    CandidateReady,
    ChampionJudged,
    ChampionSetByHand,
    LineState,
    Load,
    LoraBudget,
    ProbesDone,
    Promote,
    Reject,
    ReplicaAppeared,
    Revert,
    RolloutPolicy,
    Route,
    SetAlias,
    Unload,
    advance,
    champion_since,
    drift,
    step_started,
)
from registry.routes import RouteChangeRecord
from registry.routing import RoutingTable

LINE = "legal"
STEPS = (0.05, 0.3, 1.0)
T0 = datetime(2026, 12, 1, tzinfo=UTC)
KEEP = RolloutPolicy(soak_s=600, watch_s=3600, on_live_canary="keep")
REPLACE = KEEP.model_copy(update={"on_live_canary": "replace"})


def table(**roles: object) -> RoutingTable:
    return RoutingTable(business_line=LINE, **roles)  # type: ignore[arg-type]


def step(state: LineState, event: object, policy: RolloutPolicy = KEEP, **kw: object):  # type: ignore[no-untyped-def]
    return advance(state, event, policy=policy, steps=STEPS, **kw)  # type: ignore[arg-type]


def test_a_candidate_that_already_serves_changes_nothing() -> None:
    # On main a rerun put the canary back to 5%, or raised "canary must differ from champion"
    # and left the window pending for ever.
    live = LineState(table(champion="legal-v1", canary="legal-v2", canary_fraction=0.3))
    for adapter in ("legal-v1", "legal-v2"):
        transition = step(live, CandidateReady(adapter))
        assert transition.action == "none"
        assert transition.effects == ()
        assert transition.table == live.table


def test_a_live_canary_is_kept_or_replaced_with_a_recorded_rollback() -> None:
    live = LineState(table(champion="legal-v1", canary="legal-v2", canary_fraction=0.3))
    kept = step(live, CandidateReady("legal-v3"))
    assert kept.action == "kept_canary"
    assert kept.effects == ()
    assert "still live" in kept.reason
    load = step(live, CandidateReady("legal-v3"), REPLACE)
    assert load.effects == (Load("legal-v3"),)
    done = step(live, ProbesDone("legal-v3", ("a", "b")), REPLACE)
    assert done.table.canary == "legal-v3"
    assert done.table.canary_fraction == 0.05
    assert Reject(2) in done.effects
    assert Unload("legal-v2") in done.effects
    assert "replaces canary legal-v2" in done.reason
    # The new route comes before the old canary's unload, so no request meets a gap.
    kinds = [type(e) for e in done.effects]
    assert kinds.index(Route) < kinds.index(Unload)


def test_a_probe_failing_on_one_replica_unloads_from_every_replica_it_reached() -> None:
    state = LineState(table(champion="legal-v1"))
    done = step(state, ProbesDone("legal-v2", ("a",), {"b": "answers like the base"}))
    assert done.action == "probe_failed"
    assert done.table == state.table
    assert Reject(2) in done.effects
    assert Unload("legal-v2", ("a", "b")) in done.effects
    assert not any(isinstance(e, Route) for e in done.effects)


def test_steps_wait_for_the_soak_time_and_a_rollback_never_waits() -> None:
    state = LineState(
        table(champion="legal-v1", canary="legal-v2", canary_fraction=0.05), step_started=T0
    )
    early = step(
        state, CanaryLooked(CanaryAction.PROMOTE, ("non-inferior",), T0 + timedelta(seconds=60))
    )
    assert early.action == "wait"
    assert "soaking" in early.reason
    assert early.effects == ()
    later = step(state, CanaryLooked(CanaryAction.PROMOTE, ("ok",), T0 + timedelta(seconds=601)))
    assert later.action == "step_up"
    assert later.table.canary_fraction == 0.3
    bad = step(state, CanaryLooked(CanaryAction.ROLLBACK, ("worse",), T0 + timedelta(seconds=1)))
    assert bad.action == "rollback"
    assert bad.table.canary is None
    assert bad.effects == (Route(bad.table, "canary_clear"), Reject(2), Unload("legal-v2"))


def test_a_promotion_unloads_what_drops_out_of_previous() -> None:
    state = LineState(
        table(champion="legal-v2", previous="legal-v1", canary="legal-v3", canary_fraction=0.3),
        step_started=T0,
    )
    done = step(state, CanaryLooked(CanaryAction.PROMOTE, ("ok",), T0 + timedelta(hours=1)))
    assert done.action == "promote"
    assert (done.table.champion, done.table.previous, done.table.canary) == (
        "legal-v3",
        "legal-v2",
        None,
    )
    assert Promote(3) in done.effects
    assert SetAlias("canary", None) in done.effects
    assert Unload("legal-v1") in done.effects


def test_a_watched_champion_that_regresses_is_reverted_in_routing_and_registry() -> None:
    state = LineState(table(champion="legal-v3", previous="legal-v2"), champion_since=T0)
    fine = step(state, ChampionJudged(False, ("no rate worse",), T0 + timedelta(minutes=5)))
    assert fine.action == "watch"
    assert fine.effects == ()
    worse = step(state, ChampionJudged(True, ("worse dissatisfied",), T0 + timedelta(minutes=5)))
    assert worse.action == "revert"
    assert (worse.table.champion, worse.table.previous) == ("legal-v2", None)
    assert worse.effects[0] == Load("legal-v2")
    assert Revert(3, 2) in worse.effects
    assert Unload("legal-v3") in worse.effects
    over = step(state, ChampionJudged(True, ("worse",), T0 + timedelta(hours=2)))
    assert over.action == "none"


def test_a_champion_by_hand_moves_the_alias_too() -> None:
    # On main `routes champion` moved routing only: two champions, the gate used the old one.
    state = LineState(table(champion="legal-v2", previous="legal-v1"))
    done = step(state, ChampionSetByHand("legal-v4", "hotfix"))
    assert done.effects[0] == Load("legal-v4")
    assert Promote(4) in done.effects
    assert Unload("legal-v1") in done.effects
    assert (done.table.champion, done.table.previous) == ("legal-v4", "legal-v2")
    base = step(state, ChampionSetByHand(None, "back to base"))
    assert SetAlias("champion", None) in base.effects
    assert SetAlias("previous", 2) in base.effects


def test_a_canary_stopped_by_hand_is_rejected_and_unloaded() -> None:
    state = LineState(table(champion="legal-v1", canary="legal-v2"))
    done = step(state, CanaryStoppedByHand("bad answers"))
    assert done.table.canary is None
    assert Unload("legal-v2") in done.effects


def test_a_replica_that_reappears_gets_every_routed_adapter() -> None:
    state = LineState(table(champion="legal-v2", previous="legal-v1", canary="legal-v3"))
    done = step(state, ReplicaAppeared("http://b"))
    assert set(done.effects) == {
        Load(a, ("http://b",)) for a in ("legal-v1", "legal-v2", "legal-v3")
    }


def test_a_canary_that_would_not_fit_the_lora_budget_is_refused() -> None:
    tables = {
        "legal": table(champion="legal-v2", previous="legal-v1"),
        "medical": RoutingTable(
            business_line="medical", champion="medical-v1", previous="medical-v0"
        ),
    }
    budget = LoraBudget(4, tables)
    state = LineState(tables["legal"])
    refused = step(state, CandidateReady("legal-v3"), budget=budget)
    assert refused.action == "refused"
    assert "--max-loras 4" in refused.reason
    roomy = step(state, CandidateReady("legal-v3"), budget=LoraBudget(5, tables))
    assert roomy.action == "load"


@pytest.mark.parametrize(
    ("canary", "fraction", "expected"),
    [("legal-v2", 0.3, T0 + timedelta(hours=2)), ("legal-v2", 0.05, None), (None, 0.05, None)],
)
def test_one_definition_of_when_the_step_started(
    canary: str | None, fraction: float, expected: datetime | None
) -> None:
    def change(hours: int, action: str, routed: RoutingTable) -> RouteChangeRecord:
        return RouteChangeRecord(
            LINE, hours, action, routed, "t", None, T0 + timedelta(hours=hours)
        )

    history = [  # newest first
        change(3, "canary_set", table(champion="legal-v1", canary="legal-v2", canary_fraction=0.3)),
        change(2, "canary_set", table(champion="legal-v1", canary="legal-v2", canary_fraction=0.3)),
        change(1, "canary_set", table(champion="legal-v1", canary="legal-v2")),
        change(0, "champion_set", table(champion="legal-v1")),
    ]
    now = table(champion="legal-v1", canary=canary, canary_fraction=fraction)
    assert step_started(history, now) == expected
    assert champion_since(history, now) == T0


def test_drift_names_what_differs() -> None:
    routed = table(champion="legal-v2", previous="legal-v1", canary="legal-v3")
    aliases = {"champion": 1, "canary": 3, "candidate": 4}
    loaded = {
        "http://a": ["legal-v1", "legal-v2", "legal-v3", "legal-v4", "medical-v9"],
        "http://b": ["legal-v2", "legal-v5"],
        "http://c": None,
    }
    problems = drift(routed, aliases, loaded)
    assert "legal: routing champion is legal-v2 but MLflow @champion is v1" in problems
    assert "legal: legal-v1 is routed but not loaded on http://b" in problems
    assert "legal: legal-v5 is loaded on http://b but no route names it" in problems
    assert "legal: replica http://c did not answer" in problems
    # The candidate loaded for its probe and another line's adapter are not this line's drift.
    assert not [p for p in problems if "legal-v4" in p or "medical" in p]
    assert drift(routed, {"champion": 2, "canary": 3}, {"http://a": sorted(routed.adapters)}) == []


def test_placed_lines_count_against_the_budget_of_their_replicas_only() -> None:
    tables = {
        "legal": table(champion="legal-v2", previous="legal-v1", replicas=("http://a",)),
        "medical": RoutingTable(
            business_line="medical",
            champion="medical-v1",
            previous="medical-v0",
            replicas=("http://b",),
        ),
    }
    state = LineState(tables["legal"])
    # Over all lines 5 adapters; on http://a only legal's 3.
    assert step(state, CandidateReady("legal-v3"), budget=LoraBudget(4, tables)).action == (
        "refused"
    )
    per_replica = LoraBudget(3, tables, ("http://a", "http://b"))
    assert per_replica.most_on_one_replica() == 2
    assert step(state, CandidateReady("legal-v3"), budget=per_replica).action == "load"
    spread = {**tables, "medical": tables["medical"].placed_on(None)}
    crowded = LoraBudget(3, spread, ("http://a", "http://b"))
    assert crowded.most_on_one_replica() == 4
    assert step(state, CandidateReady("legal-v3"), budget=crowded).action == "refused"


def test_a_placed_lines_adapters_are_expected_on_its_replicas_only() -> None:
    routed = table(champion="legal-v2", replicas=("http://a",))
    aliases = {"champion": 2}
    assert drift(routed, aliases, {"http://a": ["legal-v2"], "http://b": []}) == []
    problems = drift(routed, aliases, {"http://a": [], "http://b": ["legal-v2"]})
    assert problems == [
        "legal: legal-v2 is routed but not loaded on http://a",
        "legal: legal-v2 is loaded on http://b, where legal is not placed",
    ]
    # A placement naming no replica there is treated as none: every replica holds the line.
    stale = routed.placed_on(("http://gone",))
    assert drift(stale, aliases, {"http://a": ["legal-v2"], "http://b": ["legal-v2"]}) == []


def test_a_revert_keeps_the_lines_placement() -> None:
    placed = table(champion="legal-v2", previous="legal-v1", replicas=("http://a",))
    state = LineState(placed, None, T0)
    judged = step(state, ChampionJudged(True, ("worse",), T0 + timedelta(minutes=5)))
    assert judged.action == "revert"
    assert judged.table.replicas == ("http://a",)


def test_a_canary_or_shadow_by_hand_is_probed_first_then_replaces_the_live_one() -> None:
    from registry.lifecycle import CanaryStartedByHand, ShadowStartedByHand, alias_repairs

    live = LineState(table(champion="legal-v1", canary="legal-v2", canary_fraction=0.3))
    started = CanaryStartedByHand("legal-v3", 0.1, "try v3")
    assert step(live, started).effects == (Load("legal-v3"),)
    done = step(live, ProbesDone("legal-v3", ("a",), by_hand=started))
    assert (done.action, done.table.canary, done.table.canary_fraction) == (
        "canary",
        "legal-v3",
        0.1,
    )
    assert done.effects == (
        Route(done.table, "canary_set"),
        Reject(2),
        Unload("legal-v2"),
        SetAlias("canary", 3),
    )
    assert done.reason.startswith("try v3; legal-v3 probed on 1 replica(s)")
    # Another share for the live canary: routed again, nothing rolled back.
    again = CanaryStartedByHand("legal-v2", 0.5, "more")
    moved = step(live, ProbesDone("legal-v2", ("a",), by_hand=again))
    assert moved.effects == (Route(moved.table, "canary_set"), SetAlias("canary", 2))
    # ... and a probe failing for it leaves it routed and loaded.
    failed = step(live, ProbesDone("legal-v2", (), {"a": "no"}, by_hand=again))
    assert (failed.action, failed.effects) == ("probe_failed", ())
    shadow = ShadowStartedByHand("legal-v3", 0.2, "mirror v3")
    mirrored = step(live, ProbesDone("legal-v3", ("a",), by_hand=shadow))
    assert (mirrored.table.shadow, mirrored.table.canary) == ("legal-v3", "legal-v2")
    assert mirrored.effects == (Route(mirrored.table, "shadow_set"),)
    # What the table cannot hold is refused before anything is loaded.
    for refused in (
        CanaryStartedByHand("legal-v1", 0.1, "x"),
        CanaryStartedByHand("medical-v4", 0.1, "x"),
    ):
        assert (step(live, refused).action, step(live, refused).effects) == ("refused", ())
    assert (
        "not an adapter of legal" in step(live, CanaryStartedByHand("medical-v4", 0.1, "x")).reason
    )
    assert alias_repairs(live.table, {"champion": 1, "canary": 2}) == ()
    assert alias_repairs(live.table, {"champion": 4, "previous": 1}) == (
        SetAlias("champion", 1),
        SetAlias("canary", 2),
    )


def test_a_shadow_stopped_by_hand_is_rolled_back() -> None:
    from registry.lifecycle import ShadowStoppedByHand

    live = LineState(table(champion="legal-v1", shadow="legal-v2", shadow_fraction=0.1))
    stopped = step(live, ShadowStoppedByHand("too slow"))
    assert (stopped.action, stopped.reason, stopped.table.shadow) == (
        "shadow_reject",
        "too slow",
        None,
    )
    assert stopped.effects == (Route(stopped.table, "shadow_clear"), Reject(2), Unload("legal-v2"))
    assert step(LineState(table()), ShadowStoppedByHand("x")).action == "none"
