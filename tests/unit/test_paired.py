"""The paired comparison of two models on the same pairs, checked against statsmodels and scipy."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eval.paired import (
    binomial_upper_tail,
    compare_counts,
    compare_paired,
    newcombe_interval,
    wilson_interval,
)

statsmodels = pytest.importorskip("statsmodels")
scipy_stats = pytest.importorskip("scipy.stats")

from statsmodels.stats.contingency_tables import mcnemar  # noqa: E402
from statsmodels.stats.proportion import (  # noqa: E402
    confint_proportions_2indep,
    proportion_confint,
)

cell = st.integers(min_value=0, max_value=300)
tables = st.tuples(cell, cell, cell, cell).filter(lambda t: sum(t) > 0)
confidences = st.sampled_from([0.8, 0.9, 0.95, 0.99])


def test_counts_rates_and_the_difference_come_from_the_per_pair_results() -> None:
    candidate = [True, True, True, False, False, True]
    baseline = [True, False, False, True, False, False]

    result = compare_paired(candidate, baseline)

    assert (result.both_right, result.b, result.c, result.both_wrong) == (1, 3, 1, 1)
    assert result.n == 6
    assert result.candidate_accuracy == pytest.approx(4 / 6)
    assert result.baseline_accuracy == pytest.approx(2 / 6)
    assert result.difference == pytest.approx(2 / 6)
    assert result.p_value == pytest.approx(5 / 16)  # P(X >= 3), X ~ Binomial(4, 1/2)


def test_the_description_quotes_every_number() -> None:
    result = compare_counts(30, 15, 3, 12)

    assert str(result) == (
        "on 60 pairs: candidate right on 0.750 vs baseline 0.550 (15 only the candidate, "
        "3 only the baseline); difference +0.200 (95% interval +0.064 to +0.325); "
        "99.6% sure the candidate is better"
    )
    assert "champion 0.550" in result.describe("adapter", "champion")
    assert result.as_dict()["difference_low"] == pytest.approx(result.low)


def test_results_of_different_pairs_are_refused() -> None:
    with pytest.raises(ValueError, match="same pairs"):
        compare_paired([True, False], [True])
    with pytest.raises(ValueError, match="no pairs"):
        compare_paired([], [])


def test_newcombe_matches_the_published_example() -> None:
    # Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables" (2017), ch. 8:
    # complete response before and after consolidation therapy (Cavo et al., 2012).
    low, high = newcombe_interval(59, 6, 16, 80)

    assert (round(low, 4), round(high, 4)) == (-0.1186, -0.0046)


@given(
    factors=st.tuples(
        st.integers(1, 12), st.integers(1, 12), st.integers(1, 12), st.integers(1, 12)
    ),
    confidence=confidences,
)
def test_newcombe_without_correlation_is_the_independent_square_and_add(
    factors: tuple[int, int, int, int], confidence: float
) -> None:
    # With a*d == b*c the two accuracies are uncorrelated: the paired interval is then
    # Newcombe's interval for independent proportions, which statsmodels implements.
    x, y, u, v = factors
    a, b, c, d = x * u, x * v, y * u, y * v
    n = a + b + c + d
    expected = confint_proportions_2indep(
        a + b, n, a + c, n, method="newcomb", compare="diff", alpha=1 - confidence
    )

    low, high = newcombe_interval(a, b, c, d, confidence=confidence)

    assert low == pytest.approx(float(expected[0]), abs=1e-9)
    assert high == pytest.approx(float(expected[1]), abs=1e-9)


@given(successes=st.integers(0, 500), extra=st.integers(0, 500), confidence=confidences)
def test_wilson_matches_statsmodels(successes: int, extra: int, confidence: float) -> None:
    n = successes + extra
    if n == 0:
        return
    expected = proportion_confint(successes, n, alpha=1 - confidence, method="wilson")

    low, high = wilson_interval(successes, n, confidence)

    assert low == pytest.approx(float(expected[0]), abs=1e-9)
    assert high == pytest.approx(float(expected[1]), abs=1e-9)


@given(table=tables)
def test_the_two_sided_p_value_is_statsmodels_exact_mcnemar(
    table: tuple[int, int, int, int],
) -> None:
    a, b, c, d = table
    expected = mcnemar([[a, b], [c, d]], exact=True).pvalue

    result = compare_counts(a, b, c, d)

    assert result.p_value_two_sided == pytest.approx(float(expected), rel=1e-9, abs=1e-300)
    if b >= c:
        assert min(1.0, 2 * result.p_value) == pytest.approx(float(expected), rel=1e-9)


@settings(max_examples=200)
@given(k=st.integers(0, 2_100), n=st.integers(0, 2_000))
def test_the_one_sided_p_value_is_scipy_binomial_test(k: int, n: int) -> None:
    if k > n:
        assert binomial_upper_tail(k, n) == 0.0
        return
    expected = scipy_stats.binomtest(k, n, 0.5, alternative="greater").pvalue if n else 1.0

    assert binomial_upper_tail(k, n) == pytest.approx(float(expected), rel=1e-9, abs=1e-300)


def test_the_tail_of_a_big_sample_is_finite_and_right() -> None:
    expected = scipy_stats.binom.sf(50_999, 100_000, 0.5)

    assert binomial_upper_tail(51_000, 100_000) == pytest.approx(float(expected), rel=1e-7)


@given(table=tables, confidence=confidences)
def test_swapping_the_models_mirrors_everything(
    table: tuple[int, int, int, int], confidence: float
) -> None:
    a, b, c, d = table
    forward = compare_counts(a, b, c, d, confidence=confidence)
    backward = compare_counts(a, c, b, d, confidence=confidence)

    assert backward.difference == pytest.approx(-forward.difference)
    assert (backward.low, backward.high) == pytest.approx((-forward.high, -forward.low))
    # P(X >= b) + P(X >= c) = 1 + P(X = b) when b + c = m.
    m = b + c
    pmf = math.comb(m, b) / 2**m
    assert forward.p_value + backward.p_value == pytest.approx(1 + pmf, rel=1e-9)
    assert forward.p_value_two_sided == pytest.approx(backward.p_value_two_sided)


@given(table=tables, confidence=confidences)
def test_the_interval_holds_the_estimate_and_stays_in_bounds(
    table: tuple[int, int, int, int], confidence: float
) -> None:
    result = compare_counts(*table, confidence=confidence)

    assert -1 <= result.low <= result.difference + 1e-12
    assert result.difference - 1e-12 <= result.high <= 1
    assert 0 <= result.p_value <= 1


def test_a_wider_confidence_gives_a_wider_interval() -> None:
    narrow = compare_counts(40, 12, 5, 43, confidence=0.8)
    wide = compare_counts(40, 12, 5, 43, confidence=0.99)

    assert wide.low < narrow.low
    assert wide.high > narrow.high
    with pytest.raises(ValueError, match="confidence"):
        compare_counts(40, 12, 5, 43, confidence=1.0)
