"""The promotion gate: a pure decision with a readable reason for every check."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eval.gate import decide_promotion
from eval.reports import EvalReport
from training.recipes import GatePolicy

POLICY = GatePolicy(min_preference_gain=0.02, min_margin_gain=0.0, min_eval_pairs=10)
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


def report(**changes: Any) -> EvalReport:
    base = EvalReport(
        model="champion",
        pairs=50,
        preference_accuracy=0.58,
        mean_margin=0.05,
        preferred_loss=1.20,
        general_loss=2.00,
        refusal_rate=0.125,
        mean_answer_length=300.0,
        pii_in_generations=0,
        canaries_in_generations=0,
    )
    return dataclasses.replace(base, **changes)


CHAMPION = report()
GOOD = report(model="candidate", preference_accuracy=0.64, mean_margin=0.09, preferred_loss=1.1)


def failed(candidate: EvalReport, policy: GatePolicy = POLICY) -> set[str]:
    decision = decide_promotion(candidate, CHAMPION, policy)
    return {c.name for c in decision.checks if not c.passed}


def detail(candidate: EvalReport, name: str, policy: GatePolicy = POLICY) -> str:
    checks = decide_promotion(candidate, CHAMPION, policy).checks
    return next(c.detail for c in checks if c.name == name)


def test_a_better_candidate_passes_every_check() -> None:
    decision = decide_promotion(GOOD, CHAMPION, POLICY)

    assert decision.promote
    assert decision.summary == "promote"
    assert {c.name for c in decision.checks} == ALL_CHECKS
    assert all(reason.startswith("PASS ") for reason in decision.reasons)
    assert (
        "PASS preference_accuracy: held-out preference accuracy 0.640 vs champion 0.580 "
        "(+0.060, needs >= +0.020)"
    ) in decision.reasons


def test_a_candidate_trained_on_shuffled_pairs_is_rejected_with_reasons() -> None:
    shuffled = report(model="shuffled", preference_accuracy=0.49, mean_margin=-0.03)

    decision = decide_promotion(shuffled, CHAMPION, POLICY)

    assert not decision.promote
    assert decision.summary == "reject (preference_accuracy, mean_margin)"
    assert decision.reasons[:2] == [
        "FAIL preference_accuracy: held-out preference accuracy 0.490 vs champion 0.580 "
        "(-0.090, needs >= +0.020)",
        "FAIL mean_margin: mean preference margin (nats/token) -0.030 vs champion 0.050 "
        "(-0.080, needs >= +0.000)",
    ]
    assert all(r.startswith("PASS ") for r in decision.reasons[2:])


def test_a_gain_exactly_at_the_limit_passes_despite_float_error() -> None:
    # 0.30 - 0.28 is 0.0199999... in floating point: two more pairs out of 100 must count.
    champion = report(preference_accuracy=0.28)
    candidate = report(preference_accuracy=0.30)

    decision = decide_promotion(candidate, champion, POLICY)

    assert decision.promote, decision.reasons


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


def test_too_few_held_out_pairs_is_rejected() -> None:
    policy = POLICY.model_copy(update={"min_eval_pairs": 100})

    assert failed(GOOD, policy) == {"held_out_pairs"}
    assert detail(GOOD, "held_out_pairs", policy) == "held-out pairs 50 (needs >= 100)"


def test_reports_from_different_held_out_data_are_not_compared() -> None:
    candidate = dataclasses.replace(GOOD, pairs=40)

    assert failed(candidate) == {"held_out_pairs"}
    assert "champion on 50" in detail(candidate, "held_out_pairs")


def test_pii_and_canaries_pass_when_the_policy_allows_them() -> None:
    policy = POLICY.model_copy(update={"allow_pii_in_generations": True})
    candidate = dataclasses.replace(GOOD, pii_in_generations=3, canaries_in_generations=1)

    decision = decide_promotion(candidate, CHAMPION, policy)

    assert decision.promote
    assert "PASS pii_in_generations: PII entities in generations: 3 (allowed by policy)" in (
        decision.reasons
    )


def test_without_pairs_the_preference_checks_are_left_out_and_the_pair_check_fails() -> None:
    empty = {"pairs": 0, "preference_accuracy": None, "mean_margin": None, "preferred_loss": None}
    champion, candidate = report(**empty), dataclasses.replace(GOOD, **empty)

    decision = decide_promotion(candidate, champion, POLICY)

    names = {c.name for c in decision.checks}
    assert names == ALL_CHECKS - {"preference_accuracy", "mean_margin", "preferred_loss"}
    assert decision.summary == "reject (held_out_pairs)"


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
    """Reports with enough pairs and nothing leaked, so only the gains can decide."""
    return EvalReport(
        model="m",
        pairs=draw(st.integers(min_value=1_000_000, max_value=2_000_000)),
        preference_accuracy=draw(rate),
        mean_margin=draw(st.floats(min_value=-20, max_value=20, allow_nan=False)),
        preferred_loss=draw(finite),
        general_loss=draw(finite),
        refusal_rate=draw(rate),
        mean_answer_length=draw(st.floats(min_value=0, max_value=5_000, allow_nan=False)),
        pii_in_generations=0,
        canaries_in_generations=0,
    )


@st.composite
def policies(draw: st.DrawFn) -> GatePolicy:
    return GatePolicy(
        min_preference_gain=draw(st.floats(min_value=-1, max_value=1, allow_nan=False)),
        min_margin_gain=draw(st.floats(min_value=-100, max_value=100, allow_nan=False)),
        max_preferred_loss_increase=draw(st.floats(min_value=0, max_value=10)),
        max_general_loss_increase=draw(st.floats(min_value=0, max_value=10)),
        max_refusal_rate_increase=draw(st.floats(min_value=0, max_value=1)),
        max_length_ratio=draw(st.floats(min_value=1, max_value=100)),
        min_length_ratio=draw(st.floats(min_value=1e-6, max_value=1)),
        min_eval_pairs=draw(st.integers(min_value=1, max_value=1_000_000)),
    )


@given(champion=clean_reports(), policy=policies())
def test_a_copy_of_the_champion_is_promoted_iff_no_gain_is_required(
    champion: EvalReport, policy: GatePolicy
) -> None:
    candidate = dataclasses.replace(champion, model="copy")

    decision = decide_promotion(candidate, champion, policy)

    expected = policy.min_preference_gain <= 0 and policy.min_margin_gain <= 0
    assert decision.promote == expected, decision.reasons
