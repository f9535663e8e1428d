"""Confidence intervals of a proportion, for every layer that counts successes.

Pure standard library: the gate, the ``flywheel eval`` command, the datasets' label
precision and the benches use it, none of them with a statistics package.
"""

from __future__ import annotations

import math
from statistics import NormalDist

DEFAULT_CONFIDENCE = 0.95


def z_of(confidence: float) -> float:
    """The two-sided normal quantile of ``confidence`` (1.96 for 0.95)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(
    successes: int, n: int, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``successes / n`` (two-sided)."""
    if n <= 0:
        raise ValueError("a proportion needs at least one trial")
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes out of {n} trials")
    z = z_of(confidence)
    p = successes / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    denominator = 1 + z * z / n
    # At 0 and n the formula meets its bound exactly; float error must not move it past.
    low = 0.0 if successes == 0 else (centre - spread) / denominator
    high = 1.0 if successes == n else (centre + spread) / denominator
    return low, high
