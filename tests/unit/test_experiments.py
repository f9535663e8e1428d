"""A/B experiments, pure parts: the two-sided sequential decision (statsmodels as the
oracle of its fixed-sample pieces), the minimum sample size, the confidence sequence,
the experiment split of the routing table, and the arm arguments."""

from __future__ import annotations

import random

import numpy as np
import pytest
from pydantic import ValidationError
from statsmodels.stats import proportion

from registry.canary import normal_sf, score_test
from registry.experiments import (
    FLAGS,
    METRICS,
    ArmCount,
    ExperimentPolicy,
    Verdict,
    arm_reference,
    confidence_sequence,
    judge_experiment,
    judge_satisfaction,
    start_refusal,
)
from registry.ppi import SatisfactionSample
from registry.routing import ExperimentSplit, RoutingTable, arm_of, choose_arm, split_point

LINE = "customer_service"
A, B = f"{LINE}-v1", f"{LINE}-v2"
POLICY = ExperimentPolicy(alpha=0.05, min_samples=100)
USERS = [f"user-{i}" for i in range(20_000)]


def test_the_better_arm_wins_on_a_clear_difference() -> None:
    look = judge_experiment(
        METRICS["task_success"], ArmCount(1000, 300), ArmCount(1000, 400), POLICY
    )
    assert look.verdict is Verdict.B_BETTER
    assert look.winner == "b"
    assert look.effect == pytest.approx(0.1)
    assert 0 < look.lower < 0.1 < look.upper
    assert look.p_value <= POLICY.alpha
    # Lower is better for abandons: the arm that abandons more loses.
    worse = judge_experiment(METRICS["abandon"], ArmCount(1000, 300), ArmCount(1000, 400), POLICY)
    assert worse.verdict is Verdict.A_BETTER


def test_equal_arms_are_undecided() -> None:
    look = judge_experiment(METRICS["thumbs_up"], ArmCount(800, 200), ArmCount(800, 201), POLICY)
    assert look.verdict is Verdict.UNDECIDED
    assert look.winner is None
    assert look.lower < 0 < look.upper


def test_too_few_samples_never_decide() -> None:
    # All of B's and none of A's succeeded: overwhelming, but 30 per arm is under the minimum.
    look = judge_experiment(
        METRICS["task_success"], ArmCount(30, 0), ArmCount(30, 30), ExperimentPolicy(min_samples=50)
    )
    assert look.p_value <= 0.05
    assert look.verdict is Verdict.WAITING
    assert look.winner is None
    assert "50 needed per arm" in look.reasons[0]
    empty = judge_experiment(METRICS["task_success"], ArmCount(0, 0), ArmCount(5, 2), POLICY)
    assert (empty.verdict, empty.effect, empty.p_value) == (Verdict.WAITING, None, 1.0)
    assert (empty.lower, empty.upper) == (-1.0, 1.0)


def test_impossible_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="hits of"):
        judge_experiment(METRICS["thumbs_up"], ArmCount(10, 11), ArmCount(10, 1), POLICY)


def _tables(seed: int, count: int) -> list[tuple[int, int, int, int]]:
    rng = random.Random(seed)
    tables = []
    for _ in range(count):
        n_a, n_b = rng.randint(20, 800), rng.randint(20, 800)
        p_a, p_b = rng.uniform(0.02, 0.98), rng.uniform(0.02, 0.98)
        tables.append((n_a, sum(rng.random() < p_a for _ in range(n_a)), n_b,
                       sum(rng.random() < p_b for _ in range(n_b))))  # fmt: skip
    return tables


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_always_valid_test_is_never_bolder_than_statsmodels_fixed_sample_one() -> None:
    compared = 0
    for n_a, hits_a, n_b, hits_b in _tables(1, 150):
        a, b = ArmCount(n_a, hits_a), ArmCount(n_b, hits_b)
        look = judge_experiment(METRICS["thumbs_up"], a, b, ExperimentPolicy(min_samples=1))
        oracle = proportion.test_proportions_2indep(
            hits_b, n_b, hits_a, n_a, method="score", compare="diff", alternative="two-sided"
        )
        # The statistic it stands on is statsmodels' score statistic.
        z, _ = score_test(hits_a, n_a, hits_b, n_b, 0.0)
        assert float(z) == pytest.approx(oracle.statistic, rel=1e-9, abs=1e-9)
        assert 2 * float(normal_sf(abs(z))) == pytest.approx(oracle.pvalue, rel=1e-7, abs=1e-12)
        assert look.p_value >= oracle.pvalue - 1e-12
        if look.winner is not None:
            assert oracle.pvalue <= 0.05
            assert (look.winner == "b") == (hits_b / n_b > hits_a / n_a)
        assert look.effect is not None
        assert look.lower <= look.effect <= look.upper
        # The confidence sequence holds statsmodels' fixed-sample score interval (whose root
        # finder gives up on a few tables).
        try:
            low, high = proportion.confint_proportions_2indep(
                hits_b, n_b, hits_a, n_a, method="score", compare="diff", alpha=0.05
            )
        except ValueError:
            continue
        compared += 1
        assert look.lower <= low + 1e-9
        assert look.upper >= high - 1e-9
    assert compared >= 100


def test_the_interval_excludes_zero_exactly_when_the_test_decides() -> None:
    for n_a, hits_a, n_b, hits_b in _tables(2, 150):
        a, b = ArmCount(n_a, hits_a), ArmCount(n_b, hits_b)
        look = judge_experiment(METRICS["thumbs_up"], a, b, ExperimentPolicy(min_samples=1))
        decided = look.winner is not None
        # The grid's one-step widening can only keep zero in; never drop it wrongly.
        if not decided:
            assert look.lower <= 0 <= look.upper
        elif look.lower > 0 or look.upper < 0:
            assert decided


def test_looking_often_keeps_wrong_decisions_under_alpha() -> None:
    """Equal arms looked at after every 40 samples per arm, 15 looks: the share of
    experiments that ever decide stays under alpha (an always-valid test); arms 10 points
    apart are told apart, the right way round, in most experiments."""
    rng = np.random.default_rng(7)
    policy = ExperimentPolicy(alpha=0.1, min_samples=40)
    for rates, check in (((0.3, 0.3), "null"), ((0.3, 0.45), "power")):
        wrong = right = 0
        runs = 200
        for _ in range(runs):
            draws_a = rng.random(600) < rates[0]
            draws_b = rng.random(600) < rates[1]
            for n in range(40, 601, 40):
                look = judge_experiment(
                    METRICS["task_success"],
                    ArmCount(n, int(draws_a[:n].sum())),
                    ArmCount(n, int(draws_b[:n].sum())),
                    policy,
                )
                if look.winner is not None:
                    right += look.winner == "b" and check == "power"
                    wrong += look.winner == "a" or check == "null"
                    break
        if check == "null":
            assert wrong / runs <= policy.alpha, wrong
        else:
            assert wrong == 0
            assert right / runs >= 0.7, right


def test_the_confidence_sequence_narrows_with_data() -> None:
    widths = [
        np.subtract(
            *reversed(confidence_sequence(ArmCount(n, n // 3), ArmCount(n, n // 2), 0.05, 0.1))
        )
        for n in (50, 200, 800, 3200)
    ]
    assert widths == sorted(widths, reverse=True)
    assert widths[-1] < 0.1


def test_the_metric_table_uses_known_flags_only() -> None:
    assert set(METRICS) == {"task_success", "thumbs_up", "abandon", "satisfied", "pass_rate"}
    for metric in METRICS.values():
        assert set(metric.among) | set(metric.hit_any) | set(metric.hit_none) <= set(FLAGS)
        assert metric.hit_any
    assert not METRICS["abandon"].higher_is_better


def test_arm_arguments() -> None:
    assert arm_reference("base", LINE) == "base"
    assert arm_reference("champion", LINE) == "champion"
    assert arm_reference(f"{LINE}-v12", LINE) == 12
    assert arm_reference("v3", LINE) == 3
    assert arm_reference("3", LINE) == 3
    for bad in ("legal-v2", "v0", "latest", "", "-1"):
        with pytest.raises(ValueError, match=r"arm|adapter of"):
            arm_reference(bad, LINE)


# --------------------------------------------------------------------------- routing


def _split(share: float = 0.3, experiment_id: int = 7) -> RoutingTable:
    return RoutingTable(business_line=LINE, champion=A).with_experiment(
        ExperimentSplit(id=experiment_id, a=A, b=B, share=share)
    )


def test_the_split_is_sticky_and_sends_the_share_to_b() -> None:
    table = _split(0.3)
    first = {user: choose_arm(table, user) for user in USERS}
    assert all(choose_arm(table, user) == arm for user, arm in first.items())
    on_b = sum(arm == ("experiment_b", B) for arm in first.values())
    assert on_b / len(USERS) == pytest.approx(0.3, abs=0.015)
    assert set(first.values()) == {("experiment_a", A), ("experiment_b", B)}
    # A pinned conversation is labelled with the arm its adapter plays.
    assert arm_of(table, B) == "experiment_b"
    assert arm_of(table, A) == "experiment_a"


def test_each_experiment_samples_its_own_users() -> None:
    first = {u for u in USERS if choose_arm(_split(0.5, 1), u)[0] == "experiment_b"}
    second = {u for u in USERS if choose_arm(_split(0.5, 2), u)[0] == "experiment_b"}
    overlap = len(first & second) / len(first)
    assert overlap == pytest.approx(0.5, abs=0.03)
    assert split_point("user-1", "experiment\x1f1") != split_point("user-1", A)


def test_the_base_model_can_be_an_arm() -> None:
    table = RoutingTable(business_line=LINE).with_experiment(
        ExperimentSplit(id=3, a=None, b=B, share=0.5)
    )
    arms = {choose_arm(table, user) for user in USERS[:2000]}
    assert arms == {("experiment_a", None), ("experiment_b", B)}
    assert arm_of(table, None) == "experiment_a"
    assert table.adapters == {B}


def test_one_rollout_at_a_time() -> None:
    table = _split()
    with pytest.raises(ValidationError, match="one rollout at a time"):
        table.with_canary(f"{LINE}-v3", 0.05)
    with pytest.raises(ValidationError, match="one rollout at a time"):
        table.with_shadow(f"{LINE}-v3", 0.1)
    assert "already live" in (start_refusal(table) or "")
    canary = RoutingTable(business_line=LINE, champion=A, canary=B)
    assert "canary" in (start_refusal(canary) or "")
    assert start_refusal(table.without_experiment()) is None
    assert table.adapters == {A, B}
    with pytest.raises(ValidationError, match="two different arms"):
        ExperimentSplit(id=1, a=A, b=A)
    with pytest.raises(ValidationError, match="not an adapter of"):
        _split().model_copy(
            update={"experiment": ExperimentSplit(id=1, a=A, b="legal-v2")}
        ).checked()


def _satisfaction_runs(
    rate_a: float, rate_b: float, *, runs: int, looks: int, per_look: int, reviewed: float
) -> tuple[int, int, int]:
    """Simulated experiments on satisfaction: each look adds ``per_look`` answers per arm,
    each reviewed with probability ``reviewed`` (blind, at random), every answer scored by a
    noisy model (AUC about 0.8). Returns runs decided for A, for B, and never decided."""
    rng = np.random.default_rng(7)
    policy = ExperimentPolicy(alpha=0.05, min_reviews=10)
    decided = {"a": 0, "b": 0}
    for _ in range(runs):
        samples = [SatisfactionSample(), SatisfactionSample()]
        for _look in range(looks):
            for arm, rate in enumerate((rate_a, rate_b)):
                satisfied = rng.random(per_look) < rate
                scores = np.clip(0.25 + 0.35 * satisfied + rng.normal(0, 0.2, per_look), 0, 1)
                seen = rng.random(per_look) < reviewed
                samples[arm] = samples[arm] + SatisfactionSample.of(
                    scores[~seen], scores[seen], satisfied[seen].astype(float)
                )
            winner = judge_satisfaction(samples[0], samples[1], policy).winner
            if winner is not None:
                decided[winner] += 1
                break
    return decided["a"], decided["b"], runs - decided["a"] - decided["b"]


def test_a_satisfaction_experiment_between_equal_arms_is_rarely_decided_over_many_looks() -> None:
    """Type I over 20 looks stays at alpha (0.05), within sampling error of 300 runs."""
    for_a, for_b, _never = _satisfaction_runs(
        0.3, 0.3, runs=300, looks=20, per_look=40, reviewed=0.25
    )
    assert (for_a + for_b) / 300 <= 0.05 + 2 * (0.05 * 0.95 / 300) ** 0.5


def test_a_satisfaction_experiment_finds_the_arm_that_satisfies_more() -> None:
    for_a, for_b, _never = _satisfaction_runs(
        0.3, 0.5, runs=100, looks=20, per_look=40, reviewed=0.25
    )
    assert for_a == 0
    assert for_b >= 80


def test_a_satisfaction_look_waits_for_reviews_and_says_how_many() -> None:
    few = SatisfactionSample.of([0.5] * 50, [0.4, 0.6], [0.0, 1.0])
    look = judge_satisfaction(few, few, ExperimentPolicy(min_reviews=5))
    assert look.verdict is Verdict.WAITING
    assert "A 2, B 2 reviewed answers, 5 needed per arm" in look.reasons[0]
    assert look.a.samples == 52
    assert look.a.reviews == 2
    assert look.a.rate is None
