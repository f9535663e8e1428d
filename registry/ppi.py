"""Satisfaction per arm on every answer: prediction-powered inference (pure).

Users speak on about one answer in ten, and not at random (unhappy users speak
more), so their signals alone cannot tell a canary's satisfaction from its
champion's on the traffic a 5% share gets. Two things can:

- a **satisfaction model** scores every answer (cheap, on all of them, but
  biased in ways nobody knows, and maybe differently on each arm's answers);
- **reviews**: reviewers judge a random sample of each arm's answers, blind to
  the arm (unbiased, but few).

The score may use anything known of every answer before its verdict: the canary's
folds in the answer's own user signal where there is one (:func:`informed_scores`).

Prediction-powered inference (Angelopoulos et al. 2023, "Prediction-powered
inference"; PPI++, Angelopoulos, Duchi & Zrnic 2023) combines them per arm: the
model's mean score over the arm's unreviewed answers, corrected by the mean
error the model makes on the arm's reviewed ones::

    theta = lambda * mean(f over unreviewed) + mean(y - lambda * f over reviewed)

unbiased whatever the model is (the reviewed answers are a random sample of the
arm's answers), with the variance ``lambda**2 var(f) / N + var(y - lambda f) / n``;
``lambda`` (PPI++'s power tuning, clipped to [0, 1]) is chosen from the data to
make it least, so a useless model costs nothing over reviews alone (``lambda``
near 0) and a good one shrinks the interval by about ``1 - corr(y, f)**2``.

The canary compares arms on the difference of the two estimates with the same
anytime-valid machinery as its rates (:mod:`registry.canary`'s normal-mixture
likelihood ratio, an asymptotic confidence sequence: Waudby-Smith et al. 2024,
"Time-uniform central limit theory and asymptotic confidence sequences"), so the
flow may look as often as it likes. Everything is computed from sufficient
statistics, so a window is summed once and a simulation runs on arrays.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from feedback.events import POSITIVE_SIGNALS, SIGNAL_PRIORITY, USER_SIGNALS, Signal

FloatArray = npt.NDArray[np.float64]


def user_signal_pull(signal: Signal | None) -> tuple[float, float]:
    """How far a user's own signal on an answer moves its score, and towards what: (the
    signal's strength, 1 for a positive signal, 0 for a negative one); (0, 0) for none."""
    if signal is None or signal not in _USER_SIGNALS:
        return 0.0, 0.0
    return signal.weight, 1.0 if signal in POSITIVE_SIGNALS else 0.0


_USER_SIGNALS = frozenset(USER_SIGNALS)


def strongest_signal(signals: Iterable[Signal]) -> Signal | None:
    """The user signal on an answer that says most (by strength, then the vocabulary's
    order); None when the user said nothing."""
    present = [s for s in signals if s in _USER_SIGNALS]
    if not present:
        return None
    return max(present, key=lambda s: (s.weight, -SIGNAL_PRIORITY.index(s)))


def informed_scores(
    scores: npt.ArrayLike, pull: npt.ArrayLike, towards: npt.ArrayLike
) -> FloatArray:
    """Each answer's score with the user's own signal folded in, elementwise: the model's
    score moved ``pull`` of the way to ``towards`` (:func:`user_signal_pull`). A thumb, an
    edit or a task outcome replaces the model's guess; a regenerate moves it half way, an
    abandon a quarter; silence leaves it.

    Which answers users speak on is not random (unhappy users speak more), so these scores
    are biased like the model's; the reviews rectify them all the same (the estimate stays
    unbiased whatever the score is, as long as it is fixed before the verdicts), and they
    correlate better with the verdicts than the model's alone, which narrows the interval.
    A reviewer's verdict or correction is never a user signal here: a score built from the
    verdict would be."""
    f = np.asarray(scores, dtype=np.float64)
    w = np.clip(np.asarray(pull, dtype=np.float64), 0.0, 1.0)
    return np.asarray(w * np.asarray(towards, dtype=np.float64) + (1 - w) * f, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class SatisfactionSample:
    """One arm's satisfaction data over a window, as sums.

    ``unlabelled_*``: the model's scores (predicted probability that the user was
    satisfied) on the answers nobody reviewed; ``labelled_*``: the reviewed answers,
    each with the model's score ``f`` and the reviewer's verdict ``y`` (1 passed, 0 failed).
    """

    unlabelled: int = 0
    unlabelled_score_sum: float = 0.0
    unlabelled_score_sq_sum: float = 0.0
    labelled: int = 0
    label_sum: float = 0.0
    labelled_score_sum: float = 0.0
    labelled_score_sq_sum: float = 0.0
    label_score_sum: float = 0.0

    @classmethod
    def of(
        cls,
        unlabelled_scores: npt.ArrayLike,
        labelled_scores: npt.ArrayLike,
        labels: npt.ArrayLike,
    ) -> SatisfactionSample:
        """The sums of an arm's scores and reviews."""
        f_u = np.asarray(unlabelled_scores, dtype=np.float64).ravel()
        f_l = np.asarray(labelled_scores, dtype=np.float64).ravel()
        y = np.asarray(labels, dtype=np.float64).ravel()
        if f_l.shape != y.shape:
            raise ValueError(f"{f_l.size} reviewed scores for {y.size} verdicts")
        for values in (f_u, f_l):
            if values.size and not (
                np.isfinite(values).all() and 0 <= values.min() <= values.max() <= 1
            ):
                raise ValueError("every score must be in [0, 1]")
        if not np.isin(y, (0.0, 1.0)).all():
            raise ValueError("every verdict must be 0 (failed) or 1 (passed)")
        return cls(
            unlabelled=int(f_u.size),
            unlabelled_score_sum=float(f_u.sum()),
            unlabelled_score_sq_sum=float((f_u**2).sum()),
            labelled=int(y.size),
            label_sum=float(y.sum()),
            labelled_score_sum=float(f_l.sum()),
            labelled_score_sq_sum=float((f_l**2).sum()),
            label_score_sum=float((y * f_l).sum()),
        )

    def __add__(self, other: SatisfactionSample) -> SatisfactionSample:
        return SatisfactionSample(
            *(getattr(self, name) + getattr(other, name) for name in self.__slots__)
        )

    @property
    def answers(self) -> int:
        """Every answer of the arm, reviewed or not."""
        return self.unlabelled + self.labelled

    @property
    def review_pass_rate(self) -> float | None:
        """The reviewers' pass rate alone (None without reviews)."""
        return self.label_sum / self.labelled if self.labelled else None


@dataclass(frozen=True, slots=True)
class ArmEstimate:
    """An arm's estimated satisfaction, its variance and the weight the model got."""

    mean: float
    variance: float
    weight: float  # PPI++'s lambda: 0 is reviews alone, 1 is plain PPI
    reviews: int
    answers: int

    @property
    def standard_error(self) -> float:
        """The estimate's standard error."""
        return math.sqrt(max(self.variance, 0.0))


def estimate(sample: SatisfactionSample, *, power_tuned: bool = True) -> ArmEstimate:
    """The arm's PPI++ estimate of satisfaction (``power_tuned=False``: plain PPI, lambda 1).

    Needs at least two reviews (a variance of the model's error); the unreviewed answers may
    be none (then it is the reviews' mean)."""
    if sample.labelled < 2:
        raise ValueError(
            f"{sample.labelled} reviews: at least 2 are needed to estimate satisfaction"
        )
    sums = (getattr(sample, name) for name in SatisfactionSample.__slots__)
    mean, variance, weight = _ppi(*sums, power_tuned=power_tuned)
    return ArmEstimate(float(mean), float(variance), float(weight), sample.labelled, sample.answers)


def estimate_arrays(
    unlabelled: npt.ArrayLike,
    unlabelled_score_sum: npt.ArrayLike,
    unlabelled_score_sq_sum: npt.ArrayLike,
    labelled: npt.ArrayLike,
    label_sum: npt.ArrayLike,
    labelled_score_sum: npt.ArrayLike,
    labelled_score_sq_sum: npt.ArrayLike,
    label_score_sum: npt.ArrayLike,
    *,
    power_tuned: bool = True,
) -> tuple[FloatArray, FloatArray]:
    """:func:`estimate`'s mean and variance elementwise over arrays of sums (a simulation's
    many arms at once); entries with fewer than 2 reviews get variance ``inf``."""
    mean, variance, _ = _ppi(
        unlabelled, unlabelled_score_sum, unlabelled_score_sq_sum, labelled, label_sum,
        labelled_score_sum, labelled_score_sq_sum, label_score_sum, power_tuned=power_tuned,
    )  # fmt: skip
    return mean, variance


def _ppi(
    unlabelled: npt.ArrayLike,
    unlabelled_score_sum: npt.ArrayLike,
    unlabelled_score_sq_sum: npt.ArrayLike,
    labelled: npt.ArrayLike,
    label_sum: npt.ArrayLike,
    labelled_score_sum: npt.ArrayLike,
    labelled_score_sq_sum: npt.ArrayLike,
    label_score_sum: npt.ArrayLike,
    *,
    power_tuned: bool,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """PPI++'s mean, variance and model weight from the sums, elementwise (verdicts are 0/1,
    so the sum of their squares is their sum)."""
    n = np.asarray(labelled, dtype=np.float64)
    big_n = np.asarray(unlabelled, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        y_mean = np.asarray(label_sum, dtype=np.float64) / n
        f_mean = np.asarray(labelled_score_sum, dtype=np.float64) / n
        bessel = n / (n - 1)
        var_y = np.maximum(y_mean - y_mean**2, 0.0) * bessel
        var_fl = np.maximum(np.asarray(labelled_score_sq_sum) / n - f_mean**2, 0.0) * bessel
        cov = (np.asarray(label_score_sum) / n - y_mean * f_mean) * bessel
        fu_mean = np.asarray(unlabelled_score_sum, dtype=np.float64) / big_n
        var_fu = np.maximum(np.asarray(unlabelled_score_sq_sum) / big_n - fu_mean**2, 0.0) * (
            big_n / (big_n - 1)
        )
        if power_tuned:
            # PPI++ (mean estimation): lambda = cov(y, f) / ((1 + n / N) var(f)), var(f) pooled.
            pooled = (var_fl * (n - 1) + var_fu * (big_n - 1)) / (n + big_n - 2)
            weight = np.clip(np.where(pooled > 0, cov / ((1 + n / big_n) * pooled), 0.0), 0, 1)
        else:
            weight = np.ones_like(n)
        weight = np.where(big_n >= 2, weight, 0.0)
        fu_mean = np.where(big_n >= 2, fu_mean, f_mean)
        mean = weight * fu_mean + y_mean - weight * f_mean
        error_var = np.maximum(var_y - 2 * weight * cov + weight**2 * var_fl, 0.0)
        variance = error_var / n + np.where(big_n >= 2, weight**2 * var_fu / big_n, 0.0)
        # A floor for the degenerate case (every verdict alike, a constant model): the variance
        # of a proportion one success away, so few reviews never look certain.
        variance = np.maximum(variance, 1 / (4 * (n + 1) ** 2))
        variance = np.where(n >= 2, variance, np.inf)
    return (
        np.asarray(np.clip(mean, 0, 1), dtype=np.float64),
        np.asarray(variance, dtype=np.float64),
        np.asarray(weight, dtype=np.float64),
    )
