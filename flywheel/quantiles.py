"""Observed quantiles, as the gateway's arm statistics and the canary's reasons show them."""

from __future__ import annotations

from collections.abc import Sequence


def observed_quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` as observed: the order statistic at ``floor(q * n)``
    (the largest value for ``q`` near 1), or None without values. A point to show beside a
    decision, never the decision itself (the canary decides on confidence bounds)."""
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])
