"""The online canary decision: waits for data, catches a worse canary, promotes a fine one,
and keeps its error rates under alpha over repeated looks."""

from __future__ import annotations

import random

from registry.canary import (
    ArmStats,
    CanaryAction,
    CanaryPolicy,
    decide_canary,
    non_inferior_p_value,
    worse_p_value,
)

POLICY = CanaryPolicy(min_requests=200, alpha=0.05, max_looks=10)


def _arm(n: int, thumbs_down: float, regenerate: float = 0.05, p99: float = 800.0) -> ArmStats:
    return ArmStats(
        adapter="x",
        requests=n,
        thumbs_down=round(n * thumbs_down),
        regenerate=round(n * regenerate),
        edit=round(n * 0.02),
        error=0,
        p99_latency_ms=p99,
    )


def test_too_few_requests_waits_then_gives_up_at_the_last_look() -> None:
    decision = decide_canary(_arm(5000, 0.1), _arm(150, 0.1), POLICY, look=1)
    assert decision.action is CanaryAction.WAIT
    assert "150 canary" in decision.reasons[0]
    assert decide_canary(_arm(5000, 0.1), _arm(150, 0.1), POLICY, look=10).action == "rollback"


def test_a_clearly_worse_canary_is_rolled_back_with_its_numbers() -> None:
    decision = decide_canary(_arm(4000, 0.10), _arm(400, 0.25), POLICY, look=1)
    assert decision.action is CanaryAction.ROLLBACK
    assert any("thumbs_down_rate" in reason for reason in decision.reasons)
    check = next(c for c in decision.checks if c.metric == "thumbs_down_rate")
    assert check.verdict == "WORSE"
    assert check.worse_p is not None
    assert check.worse_p < decision.per_look_alpha


def test_a_slow_canary_is_rolled_back() -> None:
    decision = decide_canary(_arm(4000, 0.1), _arm(4000, 0.1, p99=3000), POLICY, look=2)
    assert decision.action is CanaryAction.ROLLBACK
    assert any("p99_latency_ms" in reason for reason in decision.reasons)


def test_an_equal_canary_with_enough_data_is_promoted() -> None:
    decision = decide_canary(_arm(20_000, 0.10), _arm(4_000, 0.09), POLICY, look=3)
    assert decision.action is CanaryAction.PROMOTE, decision.reasons


def test_an_equal_canary_with_modest_data_keeps_waiting() -> None:
    decision = decide_canary(_arm(2_000, 0.10), _arm(250, 0.10), POLICY, look=1)
    assert decision.action is CanaryAction.WAIT
    assert any("UNPROVEN" in reason for reason in decision.reasons)


def test_p_values_move_the_right_way() -> None:
    assert worse_p_value(100, 1000, 200, 1000) < 1e-6
    assert worse_p_value(200, 1000, 100, 1000) > 0.99
    assert non_inferior_p_value(100, 10_000, 100, 10_000, 0.03) < 1e-6
    assert non_inferior_p_value(100, 1000, 200, 1000, 0.03) > 0.99


def test_repeated_looks_at_equal_arms_rarely_roll_back() -> None:
    """Type I error over all looks: equal true rates, ten looks as traffic accrues."""
    rng = random.Random(7)
    rollbacks = 0
    trials = 300
    for _ in range(trials):
        champion = canary = ArmStats("x", 0)
        for look in range(1, POLICY.max_looks + 1):
            champion = _accrue(rng, champion, 2_000, 0.10)
            canary = _accrue(rng, canary, 200, 0.10)
            decision = decide_canary(champion, canary, POLICY, look=look)
            if decision.action is not CanaryAction.WAIT:
                rollbacks += decision.action is CanaryAction.ROLLBACK and not any(
                    "out of looks" in r for r in decision.reasons
                )
                break
    assert rollbacks / trials <= POLICY.alpha


def test_repeated_looks_catch_a_worse_canary() -> None:
    """Power: a canary 2x as disliked is caught well before the last look."""
    rng = random.Random(11)
    caught = 0
    for _ in range(100):
        champion = canary = ArmStats("x", 0)
        for look in range(1, POLICY.max_looks + 1):
            champion = _accrue(rng, champion, 2_000, 0.10)
            canary = _accrue(rng, canary, 200, 0.20)
            decision = decide_canary(champion, canary, POLICY, look=look)
            if decision.action is CanaryAction.ROLLBACK:
                caught += look <= 5
                break
            assert decision.action is not CanaryAction.PROMOTE
    assert caught >= 90


def _accrue(rng: random.Random, arm: ArmStats, n: int, thumbs_down: float) -> ArmStats:
    def hits(rate: float) -> int:
        return sum(rng.random() < rate for _ in range(n))

    return ArmStats(
        adapter=arm.adapter,
        requests=arm.requests + n,
        thumbs_down=arm.thumbs_down + hits(thumbs_down),
        regenerate=arm.regenerate + hits(0.05),
        edit=arm.edit + hits(0.02),
        error=arm.error,
        p99_latency_ms=800.0,
    )
