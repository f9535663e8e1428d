"""The observed quantile shown beside the canary's speed decisions and in the arm stats."""

from flywheel.quantiles import observed_quantile


def test_observed_quantile_is_the_order_statistic_at_floor_q_n() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert observed_quantile(values, 0.5) == 3.0
    assert observed_quantile(values, 0.0) == 1.0
    assert observed_quantile(values, 0.99) == 5.0
    assert observed_quantile(values, 1.0) == 5.0


def test_observed_quantile_of_nothing_is_none() -> None:
    assert observed_quantile([], 0.99) is None
