"""Satisfaction on every answer by prediction-powered inference, and the canary that uses it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from registry.canary import (
    SATISFACTION,
    ArmStats,
    CanaryAction,
    CanaryPolicy,
    SatisfactionTest,
    decide_canary,
    normal_sf,
    rollback_evidence,
    satisfaction_evidence,
)
from registry.ppi import SatisfactionSample, estimate, estimate_arrays

Z_95 = 1.959964


def _arm(
    rng: np.random.Generator,
    answers: int,
    satisfaction: float,
    review_share: float,
    *,
    shift: float = 2.0,
    bias: float = 0.0,
) -> tuple[SatisfactionSample, np.ndarray]:
    """An arm's answers: satisfied or not, a model score that tells them apart (log-odds
    ``shift`` apart, plus ``bias``), a random review sample with its verdicts."""
    satisfied = rng.random(answers) < satisfaction
    score = 1 / (1 + np.exp(-(shift * (rng.standard_normal(answers) + shift * satisfied) + bias)))
    reviewed = rng.random(answers) < review_share
    verdict = satisfied.astype(float)
    sample = SatisfactionSample.of(score[~reviewed], score[reviewed], verdict[reviewed])
    return sample, satisfied


@pytest.mark.parametrize("bias", [0.0, 1.5, -2.0])
def test_the_interval_covers_the_truth_whatever_the_models_bias(bias: float) -> None:
    """2,000 simulated arms: the 95% interval covers the true satisfaction at least 94% of the
    time (1 - alpha less simulation error), even when the model is biased throughout."""
    rng = np.random.default_rng(7)
    covered = 0
    runs = 2000
    for _ in range(runs):
        sample, _ = _arm(rng, 600, 0.4, 0.1, bias=bias)
        arm = estimate(sample)
        covered += abs(arm.mean - 0.4) <= Z_95 * arm.standard_error
    assert covered / runs >= 0.94


def test_a_good_model_narrows_the_interval_and_a_useless_one_costs_nothing() -> None:
    rng = np.random.default_rng(3)
    sample, _ = _arm(rng, 4000, 0.5, 0.1, shift=2.5)
    reviews_only = estimate(
        SatisfactionSample(
            unlabelled=sample.unlabelled,
            labelled=sample.labelled,
            label_sum=sample.label_sum,
        )
    )
    with_model = estimate(sample)
    assert with_model.weight > 0.5
    assert with_model.variance < 0.7 * reviews_only.variance
    # Scores that are noise: PPI++ gives them (nearly) no weight, no wider than reviews alone.
    noise = SatisfactionSample.of(
        rng.random(sample.unlabelled),
        rng.random(sample.labelled),
        rng.random(sample.labelled) < 0.5,
    )
    assert estimate(noise).weight < 0.2
    assert estimate(noise).variance <= 1.05 * estimate(
        SatisfactionSample(unlabelled=noise.unlabelled, labelled=noise.labelled,
                           label_sum=noise.label_sum)
    ).variance  # fmt: skip


def test_the_arrays_agree_with_the_single_estimate() -> None:
    rng = np.random.default_rng(11)
    samples = [_arm(rng, 500, p, 0.2)[0] for p in (0.2, 0.5, 0.8)]
    sums = np.array([[getattr(s, name) for name in SatisfactionSample.__slots__] for s in samples])
    means, variances = estimate_arrays(*sums.T)
    for index, sample in enumerate(samples):
        single = estimate(sample)
        assert means[index] == pytest.approx(single.mean)
        assert variances[index] == pytest.approx(single.variance)
    _, few = estimate_arrays(*np.array([[10, 5, 3, 1, 1, 0.5, 0.25, 0.5]]).T)
    assert math.isinf(few[0])


def test_bad_samples_are_refused() -> None:
    with pytest.raises(ValueError, match=r"0 \(failed\) or 1"):
        SatisfactionSample.of([0.5], [0.5], [0.7])
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        SatisfactionSample.of([1.5], [0.5], [1])
    with pytest.raises(ValueError, match="reviewed scores"):
        SatisfactionSample.of([0.5], [0.5, 0.2], [1])
    with pytest.raises(ValueError, match="at least 2"):
        estimate(SatisfactionSample.of([0.5], [0.5], [1]))


def test_the_confidence_sequence_holds_over_every_look() -> None:
    """Equal arms looked at 50 times: the "worse" test at alpha calls the canary worse in at
    most alpha of 400 runs (plus simulation error), where a fixed-sample test at every look
    does far more often."""
    rng = np.random.default_rng(5)
    alpha, margin = 0.05, 0.05
    runs, looks, per_look = 400, 50, 40
    ever_worse = ever_fixed = 0
    for _ in range(runs):
        champion = canary = SatisfactionSample()
        worse = fixed = False
        for _ in range(looks):
            champion = champion + _arm(rng, per_look * 4, 0.5, 0.05)[0]
            canary = canary + _arm(rng, per_look, 0.5, 0.2)[0]
            if min(champion.labelled, canary.labelled) < 10:
                continue
            arms = [estimate(champion), estimate(canary)]
            difference = arms[1].mean - arms[0].mean
            variance = arms[0].variance + arms[1].variance
            evidence, _ = satisfaction_evidence(
                difference, variance, margin, worse_alpha=alpha, non_inferior_alpha=alpha
            )
            worse |= float(evidence) >= 1 / alpha
            fixed |= float(normal_sf(-difference / math.sqrt(variance))) <= alpha
        ever_worse += worse
        ever_fixed += fixed
    assert ever_worse / runs <= alpha + 0.02
    assert ever_fixed / runs > 2 * alpha


def test_a_canary_worse_by_the_margin_is_rarely_shown_non_inferior_over_every_look() -> None:
    """Non-inferiority's two mixtures (an equal canary's spread and a clearly better one's)
    averaged: a canary worse by exactly the margin, looked at 50 times, is shown within the
    margin in at most alpha of 400 runs (plus simulation error)."""
    rng = np.random.default_rng(7)
    alpha, margin = 0.05, 0.05
    runs, looks, per_look = 400, 50, 40
    ever_within = 0
    for _ in range(runs):
        champion = canary = SatisfactionSample()
        within = False
        for _ in range(looks):
            champion = champion + _arm(rng, per_look * 4, 0.5, 0.05)[0]
            canary = canary + _arm(rng, per_look, 0.5 - margin, 0.2)[0]
            if min(champion.labelled, canary.labelled) < 10:
                continue
            arms = [estimate(champion), estimate(canary)]
            _, evidence = satisfaction_evidence(
                arms[1].mean - arms[0].mean,
                arms[0].variance + arms[1].variance,
                margin,
                worse_alpha=alpha,
                non_inferior_alpha=alpha,
            )
            within |= float(evidence) >= 1 / alpha
        ever_within += within
    assert ever_within / runs <= alpha + 0.02


def _stats(sample: SatisfactionSample, requests: int, **rates: int) -> ArmStats:
    return ArmStats("a", requests, answered=requests, satisfaction=sample, **rates)


POLICY = CanaryPolicy(min_requests=100, satisfaction=SatisfactionTest(margin=0.05))


def test_satisfaction_decides_and_the_quiet_rates_do_not_hold_a_promotion() -> None:
    rng = np.random.default_rng(1)
    champion, _ = _arm(rng, 20_000, 0.5, 0.02)
    canary, _ = _arm(rng, 1_000, 0.55, 0.3)
    # A handful of thumbs-down each: no rate can be shown within its margin at this size,
    # which alone would hold today's rule; satisfaction is shown non-inferior.
    decision = decide_canary(
        _stats(champion, 20_000, thumbs_down=60, dissatisfied=300),
        _stats(canary, 1_000, thumbs_down=3, dissatisfied=15),
        POLICY,
        look=3,
    )
    assert decision.action is CanaryAction.PROMOTE, decision.reasons
    reason = decision.reasons[0]
    assert reason.startswith(
        "canary satisfies 0.56 of 1000 answers vs the champion's 0.52 of 20000"
    )
    assert "difference +0.04, this look's 95% interval" in reason
    assert "within 0.05 of the champion, 97% sure (95% needed)" in reason
    check = next(c for c in decision.checks if c.metric == SATISFACTION)
    assert check.counts is not None
    assert check.counts[1] == canary.labelled


def test_a_less_satisfying_canary_goes_back_even_if_the_model_likes_it() -> None:
    rng = np.random.default_rng(2)
    champion, _ = _arm(rng, 20_000, 0.5, 0.02)
    fooled, _ = _arm(rng, 1_500, 0.3, 0.3, bias=2.0)  # the model scores its style higher
    decision = decide_canary(_stats(champion, 20_000), _stats(fooled, 1_500), POLICY, look=2)
    assert decision.action is CanaryAction.ROLLBACK, decision.reasons
    assert "shown less satisfying, 99.999% sure (97.5% needed)" in decision.reasons[0]


def test_too_few_reviews_waits_and_a_worse_rate_still_rolls_back() -> None:
    rng = np.random.default_rng(4)
    champion, _ = _arm(rng, 5_000, 0.5, 0.002)  # about 10 reviews
    canary, _ = _arm(rng, 300, 0.5, 0.3)
    decision = decide_canary(_stats(champion, 5_000), _stats(canary, 300), POLICY, look=1)
    assert decision.action is CanaryAction.WAIT
    assert any("fewer than 30 reviews" in reason for reason in decision.reasons)
    # The signal rates stay guardrails: errors shown worse roll the canary back.
    decision = decide_canary(
        _stats(champion, 5_000, error=5), _stats(canary, 300, error=40), POLICY, look=1
    )
    assert decision.action is CanaryAction.ROLLBACK
    assert any(reason.startswith("error rate higher") for reason in decision.reasons)


def test_a_waiting_canary_says_how_sure_it_is_worse_as_well() -> None:
    # A canary 0.10 less satisfying on 100 reviewed answers: this look's interval may sit
    # below zero while the test over every look has not decided; the reason says both.
    rng = np.random.default_rng(5)
    champion, _ = _arm(rng, 2_400, 0.3, 0.03)
    canary, _ = _arm(rng, 100, 0.2, 1.0)
    decision = decide_canary(_stats(champion, 2_400), _stats(canary, 100), POLICY, look=2)
    assert decision.action is CanaryAction.WAIT, decision.reasons
    reason = decision.reasons[0]
    assert "this look's 95% interval" in reason
    assert "not yet shown within 0.05 of the champion (" in reason
    assert "nor less satisfying (" in reason
    assert "needed over every look)" in reason


def _reviewed(reviews: int, passed: int) -> SatisfactionSample:
    """An arm judged by its reviews alone (no model: every score 0)."""
    verdicts = np.array([1.0] * passed + [0.0] * (reviews - passed))
    return SatisfactionSample.of(np.zeros(0), np.zeros(reviews), verdicts)


def test_satisfaction_holds_half_the_rollback_budget_and_the_guardrails_split_the_rest() -> None:
    policy = CanaryPolicy(satisfaction=SatisfactionTest())
    others = policy.worse_tests - 1
    assert policy.satisfaction_share == 0.5
    assert policy.satisfaction_share + others * policy.guardrail_share == pytest.approx(1.0)
    assert policy.satisfaction_worse_alpha == pytest.approx(policy.alpha / 2)
    assert policy.worse_alpha == pytest.approx(policy.alpha / 2 / others)
    # Without satisfaction every rollback test holds an equal share, as before.
    plain = CanaryPolicy()
    assert plain.satisfaction_share == plain.guardrail_share == 1 / plain.worse_tests


def test_a_canary_reviewed_worse_goes_back_on_satisfactions_share_not_a_tenth() -> None:
    """0.26 against 0.50 on 100 reviews per arm: enough for half the budget (a likelihood
    ratio of about 84 against 40 needed), not for an equal tenth (200 needed)."""
    champion = ArmStats("a", 400, answered=400, satisfaction=_reviewed(100, 50))
    canary = ArmStats("b", 400, answered=400, satisfaction=_reviewed(100, 26))
    half = decide_canary(champion, canary, POLICY, look=3)
    assert half.action is CanaryAction.ROLLBACK, half.reasons
    assert "shown less satisfying" in half.reasons[0]
    assert "(97.5% needed)" in half.reasons[0]
    tenth = CanaryPolicy(
        min_requests=100, satisfaction=SatisfactionTest(margin=0.05, rollback_share=0.1)
    )
    waited = decide_canary(champion, canary, tenth, look=3)
    assert waited.action is CanaryAction.WAIT, waited.reasons
    check = next(c for c in waited.checks if c.metric == SATISFACTION)
    assert 1 / POLICY.satisfaction_worse_alpha < (check.worse_evidence or 0)
    assert (check.worse_evidence or 0) < 1 / tenth.satisfaction_worse_alpha


def test_the_combined_rollback_is_the_weighted_mean_of_the_e_values() -> None:
    champion = ArmStats("a", 400, answered=400, satisfaction=_reviewed(100, 50))
    canary = ArmStats("b", 400, answered=400, thumbs_down=3, satisfaction=_reviewed(100, 40))
    decision = decide_canary(champion, canary, POLICY, look=3)
    judged = [c for c in decision.checks if c.worse_evidence is not None]
    weights = [
        POLICY.satisfaction_share if c.metric == SATISFACTION else POLICY.guardrail_share
        for c in judged
    ]
    mean = sum(w * (c.worse_evidence or 0) for w, c in zip(weights, judged, strict=True))
    mean += 1 - sum(weights)  # the tests without data count 1
    assert decision.combined_worse_p == pytest.approx(min(1.0, 1 / mean))


def test_the_rollback_evidence_weighs_satisfaction_by_its_share_and_counts_the_missing_as_one() -> (
    None
):
    # Two of the nine guardrails judged, satisfaction at 30: 0.5 * 30 + (0.5 / 9) * (4 + 2 + 7).
    assert float(rollback_evidence(POLICY, [4.0, 2.0], 30.0)) == pytest.approx(15 + 13 / 18)
    assert float(rollback_evidence(POLICY, [])) == pytest.approx(1.0)  # nothing judged yet
    plain = CanaryPolicy()  # without satisfaction: the plain mean of its tests
    assert float(rollback_evidence(plain, [plain.worse_tests * 1.0] * 1)) == pytest.approx(
        (plain.worse_tests + plain.worse_tests - 1) / plain.worse_tests
    )
    with pytest.raises(ValueError, match="guardrail e-values"):
        rollback_evidence(POLICY, [1.0] * 10)


def test_a_users_signal_moves_the_score_by_its_strength_and_a_review_is_no_signal() -> None:
    from feedback.events import Signal
    from registry.ppi import informed_scores, strongest_signal, user_signal_pull

    assert user_signal_pull(Signal.THUMBS_UP) == (1.0, 1.0)
    assert user_signal_pull(Signal.EDIT) == (1.0, 0.0)
    assert user_signal_pull(Signal.REGENERATE) == (0.5, 0.0)
    assert user_signal_pull(Signal.ABANDON) == (0.25, 0.0)
    # A labeller's rank is not the answer's user speaking, nor is silence.
    for nothing in (Signal.RANK, Signal.NONE, None):
        assert user_signal_pull(nothing) == (0.0, 0.0)
    # The strongest signal wins (a thumbs-down over the regenerate that came with it).
    assert strongest_signal([Signal.REGENERATE, Signal.THUMBS_DOWN]) is Signal.THUMBS_DOWN
    assert strongest_signal([Signal.RANK]) is None
    scores = informed_scores([0.6, 0.6, 0.6, 0.6], [0.0, 1.0, 0.5, 0.25], [0.0, 1.0, 0.0, 0.0])
    assert scores.tolist() == pytest.approx([0.6, 1.0, 0.3, 0.45])


def _quiet_arm(
    rng: np.random.Generator, answers: int, satisfaction: float, *, informed: bool
) -> SatisfactionSample:
    """An arm of quiet users (realistic rates: unhappy users speak six times as often), a
    model of AUC ~0.76 and 5% of answers reviewed with 10% of verdicts wrong."""
    from registry.ppi import informed_scores

    satisfied = rng.random(answers) < satisfaction
    score = 1 / (1 + np.exp(-(rng.standard_normal(answers) + 1.0 * satisfied - 0.5)))
    speaks = rng.random(answers) < np.where(satisfied, 0.04, 0.25)
    pull = np.where(speaks, 1.0, 0.0)
    towards = np.where(rng.random(answers) < 0.9, satisfied, ~satisfied).astype(float)
    if informed:
        score = informed_scores(score, pull, towards)
    reviewed = rng.random(answers) < 0.05
    verdict = np.where(rng.random(answers) < 0.1, ~satisfied, satisfied).astype(float)
    return SatisfactionSample.of(score[~reviewed], score[reviewed], verdict[reviewed])


def test_scores_with_the_users_signals_stay_unbiased_though_signals_are_not_random() -> None:
    """The users' signals are far from missing at random (the unhappy speak more), yet PPI on
    scores that fold them in still covers the reviewers' pass rate at least 94% of the time
    (1,500 arms), and its interval is narrower than the model's alone on the same answers."""
    truth = 0.1 + 0.8 * 0.3  # what reviewers with 10% wrong verdicts pass
    covered, runs = 0, 1500
    narrower = []
    for seed in range(runs):
        arms = [
            estimate(_quiet_arm(np.random.default_rng(seed), 3000, 0.3, informed=informed))
            for informed in (False, True)
        ]
        covered += abs(arms[1].mean - truth) <= Z_95 * arms[1].standard_error
        narrower.append(arms[1].variance / arms[0].variance)
    assert covered / runs >= 0.94
    # About 3% narrower here (a fifth of the answers draw a signal): small, never wider.
    assert float(np.median(narrower)) < 0.99
