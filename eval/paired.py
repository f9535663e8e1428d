"""Two models judged on the same held-out pairs: the difference in accuracy with its uncertainty.

Both models answer the same pairs, so their results are paired: what matters
is the pairs where they disagree. Of ``n`` pairs, ``b`` only the candidate got
right and ``c`` only the baseline; the accuracy difference is ``(b - c) / n``.

- The interval of the difference is Newcombe's hybrid score interval for
  paired proportions (method 10 of Newcombe 1998, *Statistics in Medicine*
  17:2635): Wilson intervals of the two accuracies combined with the
  correlation between them. Unlike the Wald interval it stays inside
  [-1, 1] and keeps its coverage when accuracies are near 0 or 1 or when
  few pairs are discordant.
- The test of "the candidate is better" is the exact McNemar test: under no
  difference each discordant pair is a fair coin, so the one-sided p-value is
  ``P(X >= b)`` for ``X ~ Binomial(b + c, 1/2)``.

Pure standard library: the gate, the ``flywheel eval`` command and the
training bench all use it, none of them with a statistics package.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from flywheel.intervals import DEFAULT_CONFIDENCE, wilson_interval
from flywheel.wording import sure


def binomial_upper_tail(k: int, n: int) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, 1/2)``: the exact McNemar one-sided p-value."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    # Log-space terms: exact up to float rounding, O(n - k), and no overflow for any n.
    logs = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2)
        for i in range(k, n + 1)
    ]
    top = max(logs)
    return min(1.0, math.exp(top) * math.fsum(math.exp(x - top) for x in logs))


@dataclass(frozen=True, slots=True)
class PairedComparison:
    """A candidate and a baseline scored on the same ``n`` pairs, and what that shows.

    The four cells of the paired table: ``both_right``, ``candidate_only``
    (McNemar's ``b``: the candidate right, the baseline wrong),
    ``baseline_only`` (``c``) and ``both_wrong``. ``low``/``high`` bound the
    accuracy difference (candidate minus baseline) at ``confidence``;
    ``p_value`` is the exact one-sided McNemar p-value for "the candidate is
    better".
    """

    both_right: int
    candidate_only: int
    baseline_only: int
    both_wrong: int
    confidence: float
    low: float
    high: float
    p_value: float

    @property
    def n(self) -> int:
        """Pairs compared."""
        return self.both_right + self.candidate_only + self.baseline_only + self.both_wrong

    @property
    def b(self) -> int:
        """Pairs only the candidate got right."""
        return self.candidate_only

    @property
    def c(self) -> int:
        """Pairs only the baseline got right."""
        return self.baseline_only

    @property
    def candidate_accuracy(self) -> float:
        """Share of pairs the candidate got right."""
        return (self.both_right + self.candidate_only) / self.n

    @property
    def baseline_accuracy(self) -> float:
        """Share of pairs the baseline got right."""
        return (self.both_right + self.baseline_only) / self.n

    @property
    def difference(self) -> float:
        """Candidate accuracy minus baseline accuracy, ``(b - c) / n``."""
        return (self.candidate_only - self.baseline_only) / self.n

    @property
    def p_value_two_sided(self) -> float:
        """The exact two-sided McNemar p-value (as ``statsmodels`` ``mcnemar(exact=True)``)."""
        m = self.candidate_only + self.baseline_only
        smaller = min(self.candidate_only, self.baseline_only)
        return min(1.0, 2 * binomial_upper_tail(m - smaller, m))

    def describe(self, candidate: str = "candidate", baseline: str = "baseline") -> str:
        """One line a gate reason or a report can quote, in words: n, both accuracies, the
        pairs only one got right, the difference with its interval, and how sure the exact
        one-sided McNemar test is that the candidate is better (1 - its p-value)."""
        return (
            f"on {self.n} pairs: {candidate} right on {self.candidate_accuracy:.3f} vs "
            f"{baseline} {self.baseline_accuracy:.3f} ({self.b} only the {candidate}, "
            f"{self.c} only the {baseline}); difference {self.difference:+.3f} "
            f"({self.confidence:.0%} interval {self.low:+.3f} to {self.high:+.3f}); "
            f"{sure(self.p_value)} sure the {candidate} is better"
        )

    def as_dict(self) -> dict[str, float | int]:
        """JSON-ready: the table, the derived rates, the interval and both p-values."""
        return {
            "n": self.n,
            "both_right": self.both_right,
            "candidate_only": self.candidate_only,
            "baseline_only": self.baseline_only,
            "both_wrong": self.both_wrong,
            "candidate_accuracy": self.candidate_accuracy,
            "baseline_accuracy": self.baseline_accuracy,
            "difference": self.difference,
            "confidence": self.confidence,
            "difference_low": self.low,
            "difference_high": self.high,
            "p_value": self.p_value,
            "p_value_two_sided": self.p_value_two_sided,
        }

    def __str__(self) -> str:
        return self.describe()


def compare_counts(
    both_right: int,
    candidate_only: int,
    baseline_only: int,
    both_wrong: int,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
) -> PairedComparison:
    """The paired comparison from the four cells of the paired table."""
    cells = (both_right, candidate_only, baseline_only, both_wrong)
    if min(cells) < 0:
        raise ValueError(f"counts must be >= 0, not {cells}")
    n = sum(cells)
    if n == 0:
        raise ValueError("no pairs to compare")
    low, high = newcombe_interval(*cells, confidence=confidence)
    return PairedComparison(
        both_right=both_right,
        candidate_only=candidate_only,
        baseline_only=baseline_only,
        both_wrong=both_wrong,
        confidence=confidence,
        low=low,
        high=high,
        p_value=binomial_upper_tail(candidate_only, candidate_only + baseline_only),
    )


def compare_paired(
    candidate: Sequence[bool],
    baseline: Sequence[bool],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
) -> PairedComparison:
    """Compare two models' per-pair correctness (same pairs, same order)."""
    if len(candidate) != len(baseline):
        raise ValueError(
            f"{len(candidate)} candidate results but {len(baseline)} baseline results: "
            "a paired comparison needs both models on the same pairs"
        )
    pairs = zip(candidate, baseline, strict=True)
    table = Counter((bool(ours), bool(theirs)) for ours, theirs in pairs)
    return compare_counts(
        table[True, True],
        table[True, False],
        table[False, True],
        table[False, False],
        confidence=confidence,
    )


def newcombe_interval(
    both_right: int,
    candidate_only: int,
    baseline_only: int,
    both_wrong: int,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[float, float]:
    """Newcombe's hybrid score interval (method 10) of the paired difference in accuracy."""
    a, b, c, d = both_right, candidate_only, baseline_only, both_wrong
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson_interval(a + b, n, confidence)
    l2, u2 = wilson_interval(a + c, n, confidence)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    # The correlation of the two accuracies, with Newcombe's continuity adjustment: a
    # positive cross-product is reduced by n/2 (and none left counts as no correlation).
    cross = a * d - b * c
    if margins == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    elif cross > n / 2:
        phi = (cross - n / 2) / math.sqrt(margins)
    else:
        phi = cross / math.sqrt(margins)
    difference = p1 - p2
    below = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    above = (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2
    low = difference - math.sqrt(max(below, 0.0))
    high = difference + math.sqrt(max(above, 0.0))
    return max(-1.0, low), min(1.0, high)
