"""The promotion gate: a pure decision with a readable reason for every check."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eval.gate import GatePolicy, decide_promotion, left_to_canary
from eval.paired import compare_paired
from eval.reports import EvalReport, GateCheck, GateDecision, GenerationSample

POLICY = GatePolicy(min_preference_gain=0.02, min_margin_gain=0.0, min_eval_pairs=50)
ALL_CHECKS = {
    "held_out_pairs",
    "preference_accuracy",
    "mean_margin",
    "preferred_loss",
    "general_loss",
    "refusal_rate",
    "answer_length",
    "pii_in_generations",
    "canaries_in_generations",
}


def paired(
    both_right: int, candidate_only: int, champion_only: int, both_wrong: int
) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """Per-pair results of a candidate and a champion with these four cells of the paired table."""
    candidate = [True] * both_right + [True] * candidate_only
    champion = [True] * both_right + [False] * candidate_only
    candidate += [False] * champion_only + [False] * both_wrong
    champion += [True] * champion_only + [False] * both_wrong
    return tuple(candidate), tuple(champion)


def report(wins: tuple[bool, ...], **changes: Any) -> EvalReport:
    base = EvalReport(
        model="champion",
        pairs=len(wins),
        preference_accuracy=sum(wins) / len(wins) if wins else None,
        mean_margin=0.05,
        preferred_loss=1.20,
        general_loss=2.00,
        refusal_rate=0.125,
        mean_answer_length=300.0,
        pii_in_generations=0,
        canaries_in_generations=0,
        pair_wins=wins,
    )
    return dataclasses.replace(base, **changes)


def reports(
    both_right: int, candidate_only: int, champion_only: int, both_wrong: int, **changes: Any
) -> tuple[EvalReport, EvalReport]:
    """(candidate, champion) on the same pairs; ``changes`` apply to the candidate."""
    ours, theirs = paired(both_right, candidate_only, champion_only, both_wrong)
    candidate = report(ours, model="candidate", mean_margin=0.09, preferred_loss=1.1)
    return dataclasses.replace(candidate, **changes), report(theirs)


# 60 pairs: the champion is right on 33 (0.550), the candidate on 45 (0.750).
GOOD, CHAMPION = reports(30, 15, 3, 12)


def failed(candidate: EvalReport, policy: GatePolicy = POLICY) -> set[str]:
    decision = decide_promotion(candidate, CHAMPION, policy)
    return {c.name for c in decision.checks if not c.passed}


def detail(candidate: EvalReport, name: str, policy: GatePolicy = POLICY) -> str:
    checks = decide_promotion(candidate, CHAMPION, policy).checks
    return next(c.detail for c in checks if c.name == name)


def test_a_clearly_better_candidate_passes_every_check() -> None:
    decision = decide_promotion(GOOD, CHAMPION, POLICY)

    assert decision.promote
    assert decision.summary == "promote"
    assert {c.name for c in decision.checks} == ALL_CHECKS
    assert all(reason.startswith("PASS ") for reason in decision.reasons)
    assert (
        "PASS preference_accuracy: held-out preference accuracy (per token), paired: "
        "on 60 pairs: candidate right on 0.750 vs champion 0.550 (15 only the candidate, "
        "3 only the champion); difference +0.200 (95% interval +0.064 to +0.325); "
        "99.6% sure the candidate is better; needs over 95% sure and a difference of at "
        "least +0.020"
    ) in decision.reasons


def test_a_tie_is_not_promoted() -> None:
    candidate, champion = reports(30, 3, 3, 24)

    decision = decide_promotion(candidate, champion, POLICY)

    assert not decision.promote
    assert decision.summary == "reject (preference_accuracy)"
    assert "candidate right on 0.550 vs champion 0.550" in decision.reasons[0]
    assert "34% sure the candidate is better" in decision.reasons[0]


def test_a_small_gain_within_the_noise_is_not_promoted_and_the_reason_shows_the_interval() -> None:
    candidate, champion = reports(30, 7, 3, 20)

    decision = decide_promotion(candidate, champion, POLICY)

    assert decision.summary == "reject (preference_accuracy)"
    assert (
        "difference +0.067 (95% interval -0.039 to +0.169); 82% sure the candidate is better"
        in decision.reasons[0]
    )


def test_the_point_estimate_tie_of_old_times_is_refused_for_too_few_pairs() -> None:
    # 0.545 vs 0.545 on 11 pairs used to pass a gain of 0.
    candidate, champion = reports(5, 1, 1, 4)
    policy = GatePolicy()

    decision = decide_promotion(candidate, champion, policy)

    assert not decision.promote
    assert (
        "FAIL held_out_pairs: too few held-out pairs (11 < 50): no decision on a point estimate"
        in decision.reasons
    )


def test_a_significant_gain_below_the_required_gain_is_not_promoted() -> None:
    policy = POLICY.model_copy(update={"min_preference_gain": 0.25})

    assert failed(GOOD, policy) == {"preference_accuracy"}
    assert "needs over 95% sure and a difference of at least +0.250" in detail(
        GOOD, "preference_accuracy", policy
    )


def test_a_gain_exactly_at_the_limit_passes() -> None:
    candidate, champion = reports(40, 32, 2, 26)
    policy = POLICY.model_copy(update={"min_preference_gain": 0.30})

    decision = decide_promotion(candidate, champion, policy)

    assert decision.promote, decision.reasons


def test_alpha_sets_the_test_and_the_interval() -> None:
    candidate, champion = reports(30, 7, 3, 20)  # one-sided p = 0.172
    policy = POLICY.model_copy(update={"alpha": 0.2})

    decision = decide_promotion(candidate, champion, policy)

    assert decision.promote, decision.reasons
    assert "(80% interval " in detail(candidate, "preference_accuracy", policy)


def test_non_inferiority_passes_a_tie_and_rejects_a_clear_loss() -> None:
    policy = POLICY.model_copy(
        update={"preference_test": "non_inferior", "non_inferiority_margin": 0.1}
    )
    tie, champion = reports(30, 3, 3, 24)
    worse, champion_of_worse = reports(30, 2, 10, 18)

    kept = decide_promotion(tie, champion, policy)
    lost = decide_promotion(worse, champion_of_worse, policy)

    assert kept.promote, kept.reasons
    assert (
        "difference +0.000 (95% interval -0.084 to +0.084); 34% sure the candidate is better; "
        "needs the interval's low end above -0.100"
    ) in next(r for r in kept.reasons if "preference_accuracy" in r)
    assert not lost.promote
    assert lost.summary == "reject (preference_accuracy)"
    assert "(95% interval -0.240 to -0.020)" in lost.reasons[0]


def test_a_narrower_margin_rejects_the_same_tie() -> None:
    policy = POLICY.model_copy(
        update={"preference_test": "non_inferior", "non_inferiority_margin": 0.05}
    )
    tie, champion = reports(30, 3, 3, 24)

    assert not decide_promotion(tie, champion, policy).promote


def test_a_worse_candidate_is_rejected_with_reasons() -> None:
    shuffled, champion = reports(20, 5, 13, 22, model="shuffled", mean_margin=-0.03)

    decision = decide_promotion(shuffled, champion, POLICY)

    assert not decision.promote
    assert decision.summary == "reject (preference_accuracy, mean_margin)"
    assert decision.reasons[:2] == [
        "FAIL preference_accuracy: held-out preference accuracy (per token), paired: "
        "on 60 pairs: candidate right on 0.417 vs champion 0.550 (5 only the candidate, "
        "13 only the champion); difference -0.133 (95% interval -0.263 to +0.005); "
        "1% sure the candidate is better; needs over 95% sure and a difference of at least "
        "+0.020",
        "FAIL mean_margin: mean preference margin (nats/token) -0.030 vs champion 0.050 "
        "(-0.080, needs >= +0.000)",
    ]
    assert all(r.startswith("PASS ") for r in decision.reasons[2:])


def test_reports_without_per_pair_results_are_refused() -> None:
    old = dataclasses.replace(GOOD, pair_wins=())
    old_champion = dataclasses.replace(CHAMPION, pair_wins=())

    assert failed(old) == {"preference_accuracy"}
    assert detail(old, "preference_accuracy") == (
        "the candidate's report has no per-pair results (0 for 60 pairs; a report from before "
        "paired evaluation): no paired test possible, evaluate both models again"
    )
    checks = decide_promotion(GOOD, old_champion, POLICY).checks
    refused = next(c for c in checks if c.name == "preference_accuracy")
    assert not refused.passed
    assert refused.detail.startswith("the champion's report has no per-pair results")


@pytest.mark.parametrize(
    ("change", "check", "words"),
    [
        (
            {"general_loss": 2.30},
            "general_loss",
            "general-set loss 2.300 vs champion 2.000 (+15.0%",
        ),
        ({"preferred_loss": 1.30}, "preferred_loss", "(+8.3%, allowed <= +5.0%)"),
        ({"refusal_rate": 0.375}, "refusal_rate", "0.375 vs champion 0.125 (+0.250"),
        ({"mean_answer_length": 900.0}, "answer_length", "(x3.00, allowed x0.30 to x2.00)"),
        ({"mean_answer_length": 30.0}, "answer_length", "(x0.10, allowed x0.30 to x2.00)"),
        ({"pii_in_generations": 2}, "pii_in_generations", "PII entities in generations: 2"),
        ({"canaries_in_generations": 1}, "canaries_in_generations", "canary strings"),
        ({"general_loss": math.nan}, "general_loss", "general-set loss nan"),
    ],
)
def test_each_guard_rejects_on_its_own(change: dict[str, Any], check: str, words: str) -> None:
    candidate = dataclasses.replace(GOOD, **change)

    assert failed(candidate) == {check}
    assert words in detail(candidate, check)


def test_drift_over_the_base_is_bounded_across_nights() -> None:
    """Each night within its own +10% of the champion, a continued line still stops where
    its general-set loss has risen past the bound over the base model."""
    policy = POLICY.model_copy(update={"max_general_loss_drift": 0.3})
    # The champion already sits at 2.00 (+25% over a base of 1.60); +5% more is +31%.
    candidate = dataclasses.replace(GOOD, general_loss=2.10)

    decision = decide_promotion(candidate, CHAMPION, policy, base_general_loss=1.60)
    assert {c.name for c in decision.checks if not c.passed} == {"general_loss_drift"}
    drift = next(c for c in decision.checks if c.name == "general_loss_drift")
    assert drift.detail == (
        "general-set loss against the base model 2.100 vs base 1.600 "
        "(+31.2%, allowed <= +30.0% over all nights)"
    )
    within = decide_promotion(GOOD, CHAMPION, policy, base_general_loss=1.60)
    assert within.promote
    assert "(+25.0%, allowed <= +30.0% over all nights)" in next(
        c.detail for c in within.checks if c.name == "general_loss_drift"
    )


def test_drift_bound_without_the_base_loss_refuses_and_says_so() -> None:
    policy = POLICY.model_copy(update={"max_general_loss_drift": 0.3})

    decision = decide_promotion(GOOD, CHAMPION, policy)
    assert not decision.promote
    assert [c.detail for c in decision.checks if not c.passed] == [
        "general-set loss against the base model: the base model's loss was not measured"
    ]


def test_drift_bound_is_off_unless_set() -> None:
    checks = decide_promotion(GOOD, CHAMPION, POLICY, base_general_loss=0.5).checks
    assert {c.name for c in checks} == ALL_CHECKS


def test_too_few_held_out_pairs_is_rejected() -> None:
    policy = POLICY.model_copy(update={"min_eval_pairs": 100})

    assert failed(GOOD, policy) == {"held_out_pairs"}
    assert detail(GOOD, "held_out_pairs", policy) == (
        "too few held-out pairs (60 < 100): no decision on a point estimate"
    )


def test_four_pairs_won_four_to_nil_are_not_judged_and_show_no_accuracies() -> None:
    # The demo's night: the candidate right on all 4 held-out pairs, the champion on none.
    candidate, champion = reports(0, 4, 0, 0)
    policy = POLICY.model_copy(update={"min_eval_pairs": 100})

    decision = decide_promotion(candidate, champion, policy)

    assert not decision.promote
    assert decision.not_judged == "n=4 < 100"
    assert decision.verdict == "not judged"
    assert decision.summary == "not judged: n=4 < 100"
    assert "preference_accuracy" not in {c.name for c in decision.checks}
    assert "mean_margin" not in {c.name for c in decision.checks}
    assert not any("1.000" in reason for reason in decision.reasons)
    assert decision.reasons[0] == (
        "FAIL held_out_pairs: too few held-out pairs (4 < 100): no decision on a point estimate"
    )


def test_a_gate_that_judged_nothing_cannot_promote() -> None:
    with pytest.raises(ValueError, match="judged nothing"):
        GateDecision(promote=True, checks=(), not_judged="n=4 < 100")


def test_an_unjudged_healthy_candidate_is_left_to_the_canary_when_the_recipe_says_so() -> None:
    candidate, champion = reports(0, 1, 0, 0)  # one held-out pair
    policy = POLICY.model_copy(update={"min_eval_pairs": 3, "unjudged": "canary"})
    decision = left_to_canary(
        decide_promotion(candidate, champion, policy), policy, canary_judges_satisfaction=True
    )
    assert decision.promote
    assert decision.not_judged is None
    assert decision.verdict == "left to canary"
    assert decision.summary.startswith(
        "left to canary: too few held-out pairs to judge offline (n=1 < 3); every other check "
        "passed, so the canary's blind reviews judge it"
    )
    # The default holds it, and a candidate failing another check is never left to the canary.
    held = POLICY.model_copy(update={"min_eval_pairs": 3})
    assert left_to_canary(
        decide_promotion(candidate, champion, held), held, canary_judges_satisfaction=True
    ).verdict == ("not judged")
    drifted = dataclasses.replace(candidate, general_loss=3.0)
    refused = left_to_canary(
        decide_promotion(drifted, champion, policy), policy, canary_judges_satisfaction=True
    )
    assert not refused.promote
    assert refused.verdict == "not judged"
    # A judged decision is never changed.
    judged = decide_promotion(GOOD, CHAMPION, policy)
    assert left_to_canary(judged, policy, canary_judges_satisfaction=True) == judged
    # A canary on the signal rates alone cannot judge it: held, saying why.
    rates_only = decide_promotion(candidate, champion, policy)
    kept = left_to_canary(rates_only, policy, canary_judges_satisfaction=False)
    assert kept.verdict == "not judged"
    assert any("does not decide on satisfaction" in reason for reason in kept.reasons)
    with pytest.raises(ValueError, match="goes to the canary"):
        GateDecision(promote=False, checks=(), left_to_canary="why")


def test_verdicts_of_a_judged_gate() -> None:
    assert decide_promotion(GOOD, CHAMPION, POLICY).verdict == "promote"
    candidate, champion = reports(30, 3, 3, 24)
    assert decide_promotion(candidate, champion, POLICY).verdict == "reject"
    different = dataclasses.replace(GOOD, pairs=40, pair_wins=GOOD.pair_wins[:40])
    assert decide_promotion(different, CHAMPION, POLICY).not_judged is None


def test_reports_from_different_held_out_data_are_not_compared() -> None:
    candidate = dataclasses.replace(GOOD, pairs=40, pair_wins=GOOD.pair_wins[:40])

    assert failed(candidate) == {"held_out_pairs", "preference_accuracy"}
    assert "champion on 60" in detail(candidate, "held_out_pairs")
    assert detail(candidate, "preference_accuracy") == (
        "the two models were scored on different pairs"
    )


def test_pii_and_canaries_pass_when_the_policy_allows_them() -> None:
    policy = POLICY.model_copy(update={"allow_pii_in_generations": True})
    candidate = dataclasses.replace(GOOD, pii_in_generations=3, canaries_in_generations=1)

    decision = decide_promotion(candidate, CHAMPION, policy)

    assert decision.promote
    assert "PASS pii_in_generations: PII entities in generations: 3 (allowed by policy)" in (
        decision.reasons
    )


def test_without_pairs_the_preference_checks_are_left_out_and_the_pair_check_fails() -> None:
    empty = {"mean_margin": None, "preferred_loss": None}
    champion, candidate = report((), **empty), report((), model="candidate", **empty)

    decision = decide_promotion(candidate, champion, POLICY)

    names = {c.name for c in decision.checks}
    assert names == ALL_CHECKS - {"preference_accuracy", "mean_margin", "preferred_loss"}
    assert decision.summary == "not judged: n=0 < 50"


def test_a_metric_missing_on_one_side_fails() -> None:
    candidate = dataclasses.replace(GOOD, preferred_loss=None)

    assert failed(candidate) == {"preferred_loss"}
    assert detail(candidate, "preferred_loss") == (
        "preferred-answer loss was not measured for the candidate"
    )


finite = st.floats(min_value=0, max_value=50, allow_nan=False)
rate = st.floats(min_value=0, max_value=1, allow_nan=False)


@st.composite
def clean_reports(draw: st.DrawFn) -> EvalReport:
    """Reports with enough pairs and nothing leaked, so only the preference tests can decide."""
    wins = tuple(draw(st.lists(st.booleans(), min_size=50, max_size=400)))
    return report(
        wins,
        model="m",
        mean_margin=draw(st.floats(min_value=-20, max_value=20, allow_nan=False)),
        preferred_loss=draw(finite),
        general_loss=draw(finite),
        refusal_rate=draw(rate),
        mean_answer_length=draw(st.floats(min_value=0, max_value=5_000, allow_nan=False)),
    )


@st.composite
def policies(draw: st.DrawFn) -> GatePolicy:
    return GatePolicy(
        preference_test=draw(st.sampled_from(["superior", "non_inferior"])),
        alpha=draw(st.floats(min_value=0.001, max_value=0.5)),
        non_inferiority_margin=draw(st.floats(min_value=0, max_value=1)),
        min_preference_gain=draw(st.floats(min_value=-1, max_value=1, allow_nan=False)),
        min_margin_gain=draw(st.floats(min_value=-100, max_value=100, allow_nan=False)),
        max_preferred_loss_increase=draw(st.floats(min_value=0, max_value=10)),
        max_general_loss_increase=draw(st.floats(min_value=0, max_value=10)),
        max_refusal_rate_increase=draw(st.floats(min_value=0, max_value=1)),
        max_length_ratio=draw(st.floats(min_value=1, max_value=100)),
        min_length_ratio=draw(st.floats(min_value=1e-6, max_value=1)),
        min_eval_pairs=draw(st.integers(min_value=1, max_value=50)),
    )


# No deadline: on a loaded 2-core machine a first example took 650 ms (0.2 ms when rerun).
@settings(deadline=None)
@given(champion=clean_reports(), policy=policies())
def test_a_copy_of_the_champion_is_never_superior_and_is_non_inferior_within_the_margin(
    champion: EvalReport, policy: GatePolicy
) -> None:
    candidate = dataclasses.replace(champion, model="copy")

    decision = decide_promotion(candidate, champion, policy)

    if policy.preference_test == "superior":
        assert not decision.promote
        assert "0% sure the candidate is better" in decision.reasons[0]
    else:
        interval = compare_paired(
            candidate.pair_wins, champion.pair_wins, confidence=1 - policy.alpha
        )
        margin_ok = policy.min_margin_gain is None or policy.min_margin_gain <= 0
        expected = margin_ok and interval.low > -policy.non_inferiority_margin
        assert decision.promote == expected, decision.reasons


@settings(deadline=None)
@given(first=clean_reports(), data=st.data())
def test_of_two_models_at_most_one_is_superior_to_the_other(
    first: EvalReport, data: st.DataObject
) -> None:
    wins = tuple(data.draw(st.lists(st.booleans(), min_size=first.pairs, max_size=first.pairs)))
    second = report(wins, model="other")
    policy = POLICY.model_copy(update={"alpha": data.draw(st.floats(0.001, 0.5))})

    def superior(a: EvalReport, b: EvalReport) -> bool:
        check = next(c for c in decide_promotion(a, b, policy).checks if "preference" in c.name)
        return check.passed

    assert not (superior(first, second) and superior(second, first))


def too_few_pairs() -> GateDecision:
    """A decision left not judged on two held-out pairs, its other check passed."""
    return GateDecision(
        promote=False,
        checks=(
            GateCheck("held_out_pairs", False, "too few held-out pairs (2 < 3)"),
            GateCheck("refusal_rate", True, "0.00 vs 0.00"),
        ),
        not_judged="n=2 < 3",
    )


def test_too_few_pairs_fall_back_on_predicted_satisfaction_when_the_recipe_says_so() -> None:
    """At real feedback rates a night holds two or three held-out pairs: a gate with
    ``predicted_satisfaction_margin`` decides on the satisfaction model's paired comparison
    of both models' answers to the held-out prompts instead of refusing to judge."""
    from eval.gate import with_predicted_satisfaction
    from eval.satisfaction import predicted_satisfaction

    not_judged = too_few_pairs()
    better = predicted_satisfaction([0.6, 0.7, 0.65, 0.8] * 2, [0.3, 0.35, 0.3, 0.4] * 2)
    worse = predicted_satisfaction([0.2, 0.1, 0.15, 0.3] * 2, [0.6, 0.7, 0.65, 0.8] * 2)
    assert better is not None
    assert worse is not None
    policy = GatePolicy(predicted_satisfaction_margin=0.05)
    passed = with_predicted_satisfaction(not_judged, better, "cs-satisfaction-v1", policy)
    assert passed.verdict == "promote"
    assert "decides, the pairs being too few (n=2 < 3)" in passed.checks[-1].detail
    failed = with_predicted_satisfaction(not_judged, worse, "cs-satisfaction-v1", policy)
    assert failed.verdict == "reject"
    # Another check failing still refuses it.
    refusing = GateDecision(
        promote=False,
        checks=(*not_judged.checks, GateCheck("general_loss", False, "+40%")),
        not_judged="n=2 < 3",
    )
    assert with_predicted_satisfaction(refusing, better, "m", policy).verdict == "reject"
    # Without the recipe's margin, or on too few prompts, the comparison is information only.
    info = with_predicted_satisfaction(not_judged, better, "m", GatePolicy())
    assert info.verdict == "not judged"
    few = predicted_satisfaction([0.9, 0.8, 0.9], [0.1, 0.2, 0.1])
    assert few is not None
    assert with_predicted_satisfaction(not_judged, few, "m", policy).verdict == "not judged"


def test_a_predicted_satisfaction_too_wide_to_judge_leaves_the_candidate_unjudged() -> None:
    """An interval reaching both below -margin and above 0 shows neither a candidate within
    the margin nor a worse one: not judged, so the recipe's ``unjudged`` decides (the canary's
    reviews judge it, or it is held), as with too few pairs; one below 0 is refused."""
    from eval.gate import with_predicted_satisfaction
    from eval.satisfaction import predicted_satisfaction

    not_judged = too_few_pairs()
    wide = predicted_satisfaction([0.9, 0.1, 0.8, 0.2] * 3, [0.5, 0.5, 0.6, 0.45] * 3)
    assert wide is not None
    assert wide.low < -0.1
    assert wide.high > 0
    policy = GatePolicy(predicted_satisfaction_margin=0.1, unjudged="canary")
    undecided = with_predicted_satisfaction(not_judged, wide, "m", policy)
    assert undecided.verdict == "not judged"
    assert undecided.not_judged is not None
    assert "too wide to judge" in undecided.not_judged
    assert "cannot tell" in undecided.checks[-1].detail
    sent = left_to_canary(undecided, policy, canary_judges_satisfaction=True)
    assert sent.verdict == "left to canary"
    held = policy.model_copy(update={"unjudged": "hold"})
    assert (
        left_to_canary(
            with_predicted_satisfaction(not_judged, wide, "m", held),
            held,
            canary_judges_satisfaction=True,
        ).verdict
        == "not judged"
    )
    # Worse, but shown within the margin: non-inferior, as the margin allows.
    slightly = predicted_satisfaction([0.45, 0.5, 0.42, 0.47] * 3, [0.5, 0.55, 0.5, 0.52] * 3)
    assert slightly is not None
    assert slightly.high < 0
    assert slightly.low > -0.1
    assert with_predicted_satisfaction(not_judged, slightly, "m", policy).verdict == "promote"
    clearly_worse = predicted_satisfaction([0.1, 0.2, 0.15, 0.1] * 3, [0.5, 0.6, 0.55, 0.5] * 3)
    assert clearly_worse is not None
    rejected = with_predicted_satisfaction(not_judged, clearly_worse, "m", policy)
    assert rejected.verdict == "reject"
    assert "shown worse" in rejected.checks[-1].detail
    assert left_to_canary(rejected, policy, canary_judges_satisfaction=True) == rejected


def with_samples(
    found: list[tuple[str, ...]], invented: bool = False, **changes: Any
) -> EvalReport:
    """A report whose sample answers on prompts ``q0``, ``q1``... hold these PII types
    (``invented``: values no training answer holds)."""
    samples = tuple(
        GenerationSample(
            prompt=f"q{i}",
            answer="a",
            refused=False,
            pii_found=kinds,
            pii_invented=kinds if invented else (),
        )
        for i, kinds in enumerate(found)
    )
    total = sum(len(kinds) for kinds in found)
    return dataclasses.replace(
        GOOD if changes.get("model") != "champion" else CHAMPION,
        samples=samples,
        pii_in_generations=total,
        **changes,
    )


def test_one_invented_phone_number_is_not_evidence_against_a_candidate() -> None:
    """A base model invents a support line now and then: one of 24 answers holding a phone
    number the champion's answer to the same prompt lacks decides nothing (it used to fail
    the candidate on that one sighting)."""
    champion = with_samples([()] * 24, model="champion")
    candidate = with_samples([("PHONE_NUMBER",)] + [()] * 23)

    decision = decide_promotion(candidate, champion, POLICY)

    assert decision.promote
    contact = next(c for c in decision.checks if c.name == "contact_details_in_generations")
    assert contact.passed
    assert "candidate 1 of 24, champion 0; prompts where only the candidate's has them 1," in (
        contact.detail
    )
    assert "more often than the champion 50% sure (fails when over 95% sure)" in contact.detail


def test_contact_details_taught_by_training_fail_the_candidate() -> None:
    """Seven answers with an email or a phone where the champion's had none: the exact
    McNemar test shows the candidate puts them in more answers (p = 1/128)."""
    champion = with_samples([()] * 24, model="champion")
    candidate = with_samples([("EMAIL_ADDRESS",)] * 4 + [("PHONE_NUMBER",)] * 3 + [()] * 17)

    decision = decide_promotion(candidate, champion, POLICY)

    assert not decision.promote
    assert {c.name for c in decision.checks if not c.passed} == {"contact_details_in_generations"}


def test_contact_details_the_champion_also_gives_are_not_held_against_the_candidate() -> None:
    champion = with_samples([("PHONE_NUMBER",)] * 7 + [()] * 17, model="champion")
    candidate = with_samples([("PHONE_NUMBER",)] * 8 + [()] * 16)

    assert decide_promotion(candidate, champion, POLICY).promote


def test_one_high_risk_value_fails_the_candidate_whatever_the_champion_says() -> None:
    champion = with_samples([("CREDIT_CARD",)] + [()] * 23, model="champion")
    candidate = with_samples([("CREDIT_CARD", "PHONE_NUMBER")] + [()] * 23)

    decision = decide_promotion(candidate, champion, POLICY)

    assert not decision.promote
    check = next(c for c in decision.checks if c.name == "pii_in_generations")
    assert not check.passed
    assert (
        check.detail == "high-risk PII entities in generations: 1 (CREDIT_CARD 1) (allowed: none)"
    )


def test_a_high_risk_value_the_candidate_made_up_counts_like_contact_details() -> None:
    """A card-like number in a link that no training answer holds: the candidate could not
    have learnt it, so one sighting in 24 answers decides nothing; seven where the champion
    had none show training taught it to make them up."""
    champion = with_samples([()] * 24, model="champion")
    once = with_samples([("CREDIT_CARD",)] + [()] * 23, invented=True)

    decision = decide_promotion(once, champion, POLICY)

    assert decision.promote
    check = next(c for c in decision.checks if c.name == "pii_in_generations")
    assert check.detail == (
        "high-risk PII entities in generations: 0 (allowed: none); 1 made up (no training "
        "answer holds them)"
    )
    often = with_samples([("CREDIT_CARD",)] * 7 + [()] * 17, invented=True)
    refused = decide_promotion(often, champion, POLICY)
    assert {c.name for c in refused.checks if not c.passed} == {"contact_details_in_generations"}
    # The same value held by a training answer fails at once.
    learnt = with_samples([("CREDIT_CARD",)] + [()] * 23)
    assert not decide_promotion(learnt, champion, POLICY).promote
