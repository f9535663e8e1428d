"""Is a line's satisfaction model worth using? Held-out AUC, calibration, and the verdict (pure).

The satisfaction model predicts, from an answer alone, whether its user was
satisfied. It is judged on the line's held-out labelled answers (the dataset's
``eval`` split: later than anything it trained on):

- **AUC** with a 95% interval (Hanley & McNeil 1982; their variance of the
  Mann-Whitney statistic), on the examples' weights;
- **calibration**: the Brier score and the expected calibration error over ten
  bins, with the reliability table a plot is drawn from.

It is **refused**, with the reason, when its training set has a single class,
when the held-out set has too few of either class to judge it, or when the
interval's lower bound does not beat chance by the recipe's margin: a model no
better than a coin must not label silent answers nor steer a canary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

Z_95 = NormalDist().inv_cdf(0.975)
# Student's t at 0.975 for 1-30 degrees of freedom (beyond, the normal's within 4%): a
# paired interval on a handful of held-out prompts must be as wide as so few deserve.
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_975(degrees_of_freedom: int) -> float:
    """The two-sided 95% quantile of Student's t (the normal's past 30 degrees of freedom)."""
    if degrees_of_freedom < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {degrees_of_freedom}")
    if degrees_of_freedom <= len(T_975):
        return T_975[degrees_of_freedom - 1]
    return Z_95 + (T_975[-1] - Z_95) * len(T_975) / degrees_of_freedom


class SatisfactionModelPolicy(BaseModel):
    """When a line's satisfaction model is trained and trusted (a recipe block)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=True, description="Train the line's satisfaction model nightly.")
    auc_margin: float = Field(
        default=0.05,
        ge=0,
        lt=0.5,
        description="The held-out AUC's 95% lower bound must exceed 0.5 plus this.",
    )
    min_per_class: int = Field(
        default=5,
        ge=1,
        le=100_000,
        description="Held-out examples of each class (satisfied, not) needed to judge it.",
    )
    l2: float = Field(
        default=1.0, gt=0, le=1e6, description="Ridge penalty of the logistic head (per example)."
    )
    max_examples: int = Field(
        default=4000, ge=10, le=1_000_000, description="Most labelled answers it trains on."
    )
    pseudo_labels: bool = Field(
        default=False,
        description="Let the newest accepted model label the window's silent answers it is "
        "confident about (SFT targets and KTO labels, traced to the model by their rule).",
    )
    confidence: float = Field(
        default=0.85,
        gt=0.5,
        lt=1,
        description="A silent answer scored at least this is satisfied, at most 1 - this not.",
    )
    max_model_share: float = Field(
        default=0.5,
        ge=0,
        lt=1,
        description="Most model-labelled examples as a share of each kind's training set "
        "(SFT, DPO, KTO).",
    )
    label_positives: bool = Field(
        default=False,
        description="Let it mark silent answers satisfied too (SFT targets and positive "
        "labels), not only failed ones: off by default, since a model trained mostly on "
        "users' own edits judges them by their style (measured: on 1,082 silent answers of a "
        "base model that satisfied 1%, its 10 surest positives were all wrong).",
    )
    model_weight: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="A model label's weight against a user's signal (times its confidence).",
    )
    best_of_n: int = Field(
        default=0,
        ge=0,
        le=16,
        description="Best-of-n (with pseudo_labels): answers sampled offline from the served "
        "model for silent prompts; the model's best becomes an SFT target when it is sure, "
        "best against worst a DPO pair. 0: off.",
    )
    best_of_prompts: int = Field(
        default=100, ge=1, le=100_000, description="Silent prompts sampled for best-of-n a night."
    )
    best_of_min_gap: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="Least gap between the best and worst scores for a best-of-n DPO pair.",
    )
    best_of_max_tokens: int = Field(
        default=96, ge=1, le=4096, description="Longest sampled answer, in tokens."
    )
    best_of_temperature: float = Field(
        default=1.0, gt=0, le=2, description="Sampling temperature of best-of-n answers."
    )


@dataclass(frozen=True, slots=True)
class Calibration:
    """Brier score, expected calibration error, and the reliability table's bins."""

    brier: float
    ece: float
    bins: tuple[tuple[float, float, int], ...]  # (mean predicted, observed rate, count)


@dataclass(frozen=True, slots=True)
class SatisfactionModelReport:
    """How the model did on held-out labelled answers."""

    train_examples: int
    train_positive: int
    heldout_examples: int
    heldout_positive: int
    auc: float | None
    auc_low: float | None
    auc_high: float | None
    calibration: Calibration | None

    def metrics(self) -> dict[str, float]:
        """The numbers MLflow logs."""
        out = {
            "train_examples": float(self.train_examples),
            "train_positive_share": self.train_positive / self.train_examples
            if self.train_examples
            else 0.0,
            "heldout_examples": float(self.heldout_examples),
        }
        if self.auc is not None and self.auc_low is not None and self.auc_high is not None:
            out |= {"auc": self.auc, "auc_low": self.auc_low, "auc_high": self.auc_high}
        if self.calibration is not None:
            out |= {"brier": self.calibration.brier, "ece": self.calibration.ece}
        return out


@dataclass(frozen=True, slots=True)
class SatisfactionModelVerdict:
    """Accepted or refused, and why."""

    accepted: bool
    reason: str


def roc_auc(scores: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """The probability that a random positive scores above a random negative (ties half)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    positives, negatives = int(y.sum()), int((~y).sum())
    if not positives or not negatives:
        raise ValueError("AUC needs both classes")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_scores = s[order]
    # Average ranks over ties.
    start = 0
    while start < len(s):
        end = start
        while end + 1 < len(s) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return float((ranks[y].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def auc_interval(auc: float, positives: int, negatives: int) -> tuple[float, float]:
    """Hanley & McNeil's 95% interval of an AUC on ``positives`` and ``negatives``."""
    q1, q2 = auc / (2 - auc), 2 * auc**2 / (1 + auc)
    variance = (
        auc * (1 - auc) + (positives - 1) * (q1 - auc**2) + (negatives - 1) * (q2 - auc**2)
    ) / (positives * negatives)
    half = Z_95 * math.sqrt(max(variance, 0.0))
    return max(0.0, auc - half), min(1.0, auc + half)


def calibration(scores: npt.ArrayLike, labels: npt.ArrayLike, bins: int = 10) -> Calibration:
    """Brier score and expected calibration error over ``bins`` equal-width bins."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    edges = np.minimum((s * bins).astype(int), bins - 1)
    table = []
    ece = 0.0
    for index in range(bins):
        inside = edges == index
        count = int(inside.sum())
        if count:
            predicted, observed = float(s[inside].mean()), float(y[inside].mean())
            table.append((predicted, observed, count))
            ece += count / len(s) * abs(predicted - observed)
    return Calibration(float(np.mean((s - y) ** 2)), ece, tuple(table))


def evaluate_scores(
    train_labels: Sequence[int], heldout_scores: npt.ArrayLike, heldout_labels: Sequence[int]
) -> SatisfactionModelReport:
    """The report of a model that scored the held-out answers ``heldout_scores``."""
    y = np.asarray(heldout_labels, dtype=int)
    positives, negatives = int(y.sum()), int(len(y) - y.sum())
    auc = low = high = None
    if positives and negatives:
        auc = roc_auc(heldout_scores, y)
        low, high = auc_interval(auc, positives, negatives)
    return SatisfactionModelReport(
        train_examples=len(train_labels),
        train_positive=int(sum(train_labels)),
        heldout_examples=len(y),
        heldout_positive=positives,
        auc=auc,
        auc_low=low,
        auc_high=high,
        calibration=calibration(heldout_scores, y) if len(y) else None,
    )


def single_class_reason(labels: Sequence[int]) -> str | None:
    """Why a training set cannot train a classifier, or None."""
    if not labels:
        return "no labelled answers to train on"
    positives = sum(labels)
    if positives in (0, len(labels)):
        kind = "satisfied" if positives else "unsatisfied"
        return f"its {len(labels)} labelled answers are all {kind}: a single class"
    return None


def judge_satisfaction_model(
    report: SatisfactionModelReport, policy: SatisfactionModelPolicy
) -> SatisfactionModelVerdict:
    """Accept the model only when its held-out AUC beats chance by the policy's margin."""
    positives = report.heldout_positive
    negatives = report.heldout_examples - positives
    if min(positives, negatives) < policy.min_per_class:
        return SatisfactionModelVerdict(
            False,
            f"too few held-out answers to judge it: {positives} satisfied and {negatives} "
            f"unsatisfied, {policy.min_per_class} of each needed",
        )
    if report.auc is None or report.auc_low is None or report.auc_high is None:
        return SatisfactionModelVerdict(False, "no held-out AUC: a class is missing")
    needed = 0.5 + policy.auc_margin
    numbers = (
        f"held-out AUC {report.auc:.3f} (95% {report.auc_low:.3f}-{report.auc_high:.3f}) on "
        f"{report.heldout_examples} answers"
    )
    if report.auc_low <= needed:
        return SatisfactionModelVerdict(
            False,
            f"not shown better than chance: {numbers}; its lower bound must exceed {needed:.2f}",
        )
    return SatisfactionModelVerdict(True, f"{numbers}; lower bound above {needed:.2f}")


@dataclass(frozen=True, slots=True)
class PredictedSatisfaction:
    """The satisfaction model's mean score of the candidate's and the champion's answers to
    the same held-out prompts, and the paired difference's 95% interval."""

    prompts: int
    candidate: float
    champion: float
    low: float
    high: float

    @property
    def difference(self) -> float:
        """Candidate minus champion."""
        return self.candidate - self.champion

    def describe(self, model: str, role: str = "information, not a criterion") -> str:
        """One line for the gate's record."""
        return (
            f"candidate {self.candidate:.3f} vs champion {self.champion:.3f}, difference "
            f"{self.difference:+.3f} (95% {self.low:+.3f} to {self.high:+.3f}) on "
            f"{self.prompts} held-out prompts, scored by {model}; {role}"
        )


def predicted_satisfaction(
    candidate: Sequence[float], champion: Sequence[float]
) -> PredictedSatisfaction | None:
    """Paired comparison of two models' predicted satisfaction on the same prompts (None
    under two prompts): a Student-t interval on the mean of the per-prompt differences."""
    if len(candidate) != len(champion):
        raise ValueError(f"{len(candidate)} candidate scores for {len(champion)} champion scores")
    if len(candidate) < 2:
        return None
    differences = np.asarray(candidate, dtype=np.float64) - np.asarray(champion, dtype=np.float64)
    spread = float(differences.std(ddof=1)) / math.sqrt(len(differences))
    half = t_975(len(differences) - 1) * spread
    mean = float(differences.mean())
    return PredictedSatisfaction(
        len(differences),
        float(np.mean(candidate)),
        float(np.mean(champion)),
        mean - half,
        mean + half,
    )


def stratified_folds(
    labels: Sequence[int], folds: int, seed: int = 0
) -> list[npt.NDArray[np.int64]]:
    """Indices of ``folds`` folds, each class dealt round-robin after a seeded shuffle, so
    every fold holds a share of the rare class."""
    rng = np.random.default_rng(seed)
    y = np.asarray(labels, dtype=int)
    assigned = np.empty(len(y), dtype=int)
    for label in (0, 1):
        members = np.flatnonzero(y == label)
        rng.shuffle(members)
        assigned[members] = np.arange(len(members)) % folds
    return [np.flatnonzero(assigned == fold) for fold in range(folds)]
