"""The online canary decision (pure): promote, roll back, or keep waiting.

Canary and champion are compared on the same window of gateway traffic, arm
against arm, on rates where higher is worse (thumbs-down, regenerate, edit,
error, abandon and task-failure rates, the dissatisfied rate: the share of
requests that drew any of those user signals, and the refusal rate: answers
that decline to help), on the mean output length, and on speed (p99 latency,
p99 time to first token, median time per output token). Users rarely say why
they are unhappy, so a canary that is worse all round shows first in the
dissatisfied rate, which pools the signals and so has the most events.

- **Roll back** as soon as one rate is shown *worse* on the canary, its mean
  output length is shown outside ``1 ± max_length_change`` times the
  champion's, or a speed figure is shown over its allowed ratio: the canary's
  lower confidence bound on the quantile above the champion's upper bound times
  the ratio (order statistics, :func:`quantile_bounds`; a p99 on 30 answers is
  one sample, so with too few answers a lower quantile is tested, and said).
- **Promote** (or step up to the next canary share) once every rate is shown
  *non-inferior*: the canary's rate below the champion's plus the rate's margin.
- Otherwise **wait**; after ``max_looks`` looks without proof, roll back
  (an adapter that cannot show it is not worse does not get all the traffic).

Each question is a one-sided test of the difference of the two rates, made
anytime-valid: the fixed-sample building block is the Miettinen–Nurminen
score test (the statistic of ``statsmodels``' ``test_proportions_2indep``,
``method="score"``; against 0 for "worse", with Yates' continuity correction,
and against the margin for non-inferiority), and its z and null variance feed
a mixture sequential probability ratio test (mSPRT; Robbins' normal mixture,
as in Johari et al. 2017, "Always valid inference"; Howard et al. 2021). With
a half-normal mixture over the alternative the likelihood ratio is
(asymptotically) a nonnegative supermartingale under the null, an e-process,
so by Ville's inequality its reciprocal is a p-value that stays valid however
often and whenever the canary flow looks, and stopping at the first look that
crosses costs nothing. Hence ``max_looks`` is a patience limit, not a cost.
The normal approximation still needs some data: ``min_requests`` (hundreds per
arm in production) keeps rare rates honest (``bench/canary_sim_bench.py``
measures the error rates).

The mixture's spread is tuned to the recipe's margin (:func:`tuned_mixture_scale`):
for a true effect ``d`` the boundary is crossed soonest when the spread is ``d *
sqrt(r / (1 + r))``, ``r`` solving ``r = 2 log(1/(2 level)) + log(1 + r)``, whatever
the rate and the traffic (about 0.93 d at 0.05, 0.96 d at 0.05/9). Non-inferiority
is tuned to one margin (:data:`NON_INFERIOR_DESIGN_EFFECT`): the distance from its
null of a canary as good as its champion, the canary a promotion is for. "Worse"
is tuned to twice the margin (:data:`WORSE_DESIGN_EFFECT`): a canary worse by about
its margin is never promoted and goes back when its looks run out anyway, the
rollback test is there to send a clearly worse one back sooner, and a spread too
narrow costs far more than one too wide (the bound grows as ``1 + 1/r`` below the
best point, as ``log(1 + r)`` above it). The bound is flat near its best point:
``bench/canary_sim_bench.py`` measured 1, 1.5, 2 and 3 margins within a few
percent of each other, bar 1 margin on large or rare rises from a small floor.
Satisfaction, which decides when it is judged, averages two non-inferiority mixtures:
one tuned to one margin and one to two (:data:`BETTER_DESIGN_EFFECT`), so that a
canary clearly better than its champion, the usual night's adapter, is promoted in
the looks of its first day rather than its second.

The error budget is split over the tests only, never over the looks:

- wrongly rolling back (calling the canary worse when no rate is): any rate, the
  output length, or the pass rate when reviews are judged can trigger it. The
  rollback is one composite test of "no rate is worse": a weighted mean of the
  ``m`` rollback tests' likelihood ratios (each an e-process; the length's is the
  mean of its two sides'; fixed weights summing to 1) at ``alpha``, valid under
  any dependence between the rates (Vovk & Wang 2021, "E-values: calibration,
  combination and applications"). The weights are equal, except that
  satisfaction, when judged, holds ``rollback_share`` of them (half by default:
  it is the test that decides) and the guardrails split the rest. A metric is
  itself labelled worse when its own ratio reaches ``1 / (weight * alpha)``
  (``worse_alpha``, ``satisfaction_worse_alpha``: weighted Bonferroni); every
  such label implies the mean crosses, so the composite test rolls back whenever
  Bonferroni would, and sooner when several rates rise together (the usual bad
  canary). Holm's procedure would add nothing here: its first rejection is
  Bonferroni's;
- wrongly promoting (when some rate is worse by its margin or more): a
  promotion needs *every* rate shown non-inferior, so it needs the truly
  inferior rate to pass its own test, and each rate's test at ``alpha``
  already bounds it by ``alpha`` (an intersection-union test: no split).

The human pass rate (reviewers' spot checks on the feedback page, blind to the
arm) is judged when the recipe has a review block (``CanaryPolicy.reviews``): its
failure rate per review is one more rate, with its own "worse" test (one more
share of the rollback budget) and non-inferiority test against its margin, on the
same machinery, counted per review instead of per request. With ``min_reviews``
set, a promotion also needs that many reviews per arm and the pass rate shown
non-inferior (the canary waits, never promotes on too few); without it the pass
rate is a guardrail: it can roll a canary back, but its absence holds nothing.

The statistics are elementwise over numpy arrays, so a simulation runs the
same code on many canaries at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, field_validator

from feedback.contributions import DEFAULT_ANSWERS_PER_USER, DEFAULT_KEY_SHARE, LookBound
from feedback.events import ONLINE_SIGNALS
from flywheel.quantiles import observed_quantile
from flywheel.wording import sure
from registry.ppi import SatisfactionSample, estimate

# Per request on each arm: every user signal that says an answer fell short
# (feedback.events.ONLINE_SIGNALS), then errors, requests with any of those signals
# (feedback.online.DISSATISFIED) and answers that refused (feedback.answers.is_refusal).
RATES: tuple[str, ...] = (
    *(signal.value for signal in ONLINE_SIGNALS), "error", "dissatisfied", "refusal",
)  # fmt: skip
# Tests that can roll a canary back on their own: each rate's, and the output length's.
WORSE_TESTS = len(RATES) + 1
DEFAULT_MARGINS: Mapping[str, float] = {
    "thumbs_down": 0.03,
    "regenerate": 0.03,
    "edit": 0.03,
    "error": 0.01,
    "abandon": 0.03,
    "task_failure": 0.02,
    "dissatisfied": 0.05,
    "refusal": 0.02,
}
# The reviewers' rate: failed reviews per review (the pass rate's complement).
PASS_RATE = "pass_rate"  # noqa: S105 (a metric's name)
# Satisfaction on every answer: the model's scores rectified by the reviews (registry.ppi).
SATISFACTION = "satisfaction"
DEFAULT_ALPHA = 0.05
# With satisfaction judged it decides; the guardrails watch for what it cannot see (errors,
# speed, a rate that jumps). Half the rollback budget puts its threshold at a likelihood ratio
# of 40 instead of 200 (alpha 0.05) and each guardrail's at 360: a canary worse by 0.15 goes
# back in 90% of runs after 0.81x the canary users of an equal tenth, equal arms rolled back
# 0.013 vs 0.010 over 50 looks (lab/bench/canary_ppi_bench.py, 300 runs).
DEFAULT_SATISFACTION_SHARE = 0.5
# The spread of the 95% interval shown beside a satisfaction decision (a description of the
# estimate; the decision itself rests on the anytime-valid test).
SHOWN_INTERVAL_Z = 1.959963984540054
# The effects, in margins, each test's mixture is tuned to reach soonest (module docstring).
NON_INFERIOR_DESIGN_EFFECT = 1.0
WORSE_DESIGN_EFFECT = 2.0
# Satisfaction's non-inferiority also mixes in a spread tuned to two margins: a canary better
# than its champion by one, as a night's adapter that learnt its users' taste is. At the demo
# recipes' 75 answers a day it promotes a canary of 0.45 against 0.25 on its first day in 60%
# of 500 simulated runs instead of 34%, none worse by 0.15; spreads of three and four margins
# gained little more and promoted one (docs/results/2026-12-07-canary-better-mixture.md).
BETTER_DESIGN_EFFECT = 2.0

FloatArray = npt.NDArray[np.float64]


class ReviewTest(BaseModel):
    """How the human pass rate is judged (from the recipe's review block)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_reviews: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="Reviews per arm before a promotion (0: the pass rate is a guardrail "
        "that can roll back, never one that holds a promotion).",
    )
    margin: float = Field(
        default=0.05, gt=0, lt=1, description="Largest tolerated drop of the pass rate."
    )


class SatisfactionTest(BaseModel):
    """How satisfaction is judged on every answer (prediction-powered, :mod:`registry.ppi`).

    With it, satisfaction decides: a promotion needs the canary's satisfaction shown
    within ``margin`` of the champion's, a canary shown less satisfying goes back at once,
    and the users' signal rates become guardrails (they can roll a canary back, a rate
    that quiet users barely move cannot hold one up). The reviews are the random sample
    that keeps the estimate valid; they replace the pass rate's own test."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    margin: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="Largest tolerated drop of satisfaction (share of satisfied users).",
    )
    min_reviews: int = Field(
        default=30,
        ge=2,
        le=1_000_000,
        description="Reviews per arm before satisfaction decides anything: fewer and the "
        "canary waits.",
    )
    power_tuned: bool = Field(
        default=True,
        description="PPI++ (the model's weight chosen from the data, never worse than the "
        "reviews alone); False: plain PPI.",
    )
    rollback_share: float = Field(
        default=DEFAULT_SATISFACTION_SHARE,
        gt=0,
        lt=1,
        description="Share of the rollback error budget held by satisfaction, the test that "
        "decides; the guardrails split the rest.",
    )


class CanaryPolicy(BaseModel):
    """How a canary is judged online (a recipe setting)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_requests: int = Field(default=200, ge=1, description="Per arm, before any decision.")
    alpha: float = Field(
        default=DEFAULT_ALPHA,
        gt=0,
        lt=0.5,
        description="Bound on each error (wrongly rolling back, wrongly promoting), all looks.",
    )
    max_looks: int = Field(
        default=144,
        ge=1,
        le=10_000,
        description="Looks at one canary share before giving up (a day at the 10-minute "
        "cadence); looks cost no power, the test is anytime-valid.",
    )
    margins: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_MARGINS),
        description="Largest tolerated rise of each rate (absolute) to call it non-inferior; "
        "a rate left out gets its DEFAULT_MARGINS value.",
    )
    max_p99_ratio: float = Field(default=1.5, ge=1.0, description="Canary p99 over champion p99.")
    p99_slack_ms: float = Field(default=50.0, ge=0, description="Latency noise always allowed.")
    max_ttft_p99_ratio: float = Field(
        default=1.5, ge=1.0, description="Canary p99 time to first token over the champion's."
    )
    ttft_slack_ms: float = Field(default=50.0, ge=0, description="TTFT noise always allowed.")
    max_tpot_ratio: float = Field(
        default=1.3,
        ge=1.0,
        description="Canary median time per output token over the champion's (a LoRA of "
        "another rank, or a replica placement that crowds it, shows here).",
    )
    tpot_slack_ms: float = Field(default=5.0, ge=0, description="TPOT noise always allowed.")
    max_length_change: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="Largest relative change of the mean output length (tokens) tolerated: "
        "a canary shown to answer longer than (1 + c) or shorter than (1 - c) times the "
        "champion's mean is rolled back (rambling, or cut and vacuous answers).",
    )
    reviews: ReviewTest | None = Field(
        default=None,
        description="The human pass rate's test; set from the recipe's review block "
        "(composition.recipes.Recipe.canary_policy), None: reviews are not judged.",
    )
    satisfaction: SatisfactionTest | None = Field(
        default=None,
        description="Satisfaction on every answer, the satisfaction model's scores rectified "
        "by the reviews; None: the users' signal rates decide.",
    )
    max_answers_per_user: int = Field(
        default=DEFAULT_ANSWERS_PER_USER,
        ge=1,
        le=1_000_000,
        description="Answers of one user counted per arm in a look's window (the earliest; "
        "without a user id, of one session, else of one key's anonymous traffic): a few "
        "hyperactive users cannot swing a look.",
    )
    max_key_share: float = Field(
        default=DEFAULT_KEY_SHARE,
        gt=0,
        le=1,
        description="Most of an arm's counted answers one API key may hold when several keys "
        "sent them (at least 1/keys): one key's invented users cannot swing a look.",
    )

    @property
    def bound(self) -> LookBound:
        """What one user and one key may move in a look (``feedback.contributions``)."""
        return LookBound(self.max_answers_per_user, self.max_key_share)

    @field_validator("margins")
    @classmethod
    def _known_rates_within_zero_and_one(cls, margins: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(margins) - set(RATES))
        if unknown:
            raise ValueError(f"margins for unknown rates {unknown}; the rates are {list(RATES)}")
        for name, margin in margins.items():
            if not 0 < margin < 1:
                raise ValueError(f"margin of {name} must be in (0, 1), got {margin}")
        return margins

    def margin(self, rate: str) -> float:
        """The tolerated rise of ``rate``: the recipe's, else its default."""
        return self.margins.get(rate, DEFAULT_MARGINS[rate])

    @property
    def worse_tests(self) -> int:
        """How many tests can roll a canary back: the rates, the output length, and the
        satisfaction or, without it, the pass rate when reviews are judged."""
        return WORSE_TESTS + (self.reviews is not None or self.satisfaction is not None)

    @property
    def satisfaction_share(self) -> float:
        """Share of the rollback budget held by satisfaction when it decides; otherwise each
        rollback test holds an equal share."""
        if self.satisfaction is not None:
            return self.satisfaction.rollback_share
        return 1 / self.worse_tests

    @property
    def guardrail_share(self) -> float:
        """Share of the rollback budget held by each other rollback test (a rate, the output
        length, the pass rate)."""
        if self.satisfaction is not None:
            return (1 - self.satisfaction.rollback_share) / (self.worse_tests - 1)
        return 1 / self.worse_tests

    @property
    def worse_alpha(self) -> float:
        """Level at which one guardrail is itself labelled worse: its share of ``alpha``
        (weighted Bonferroni; the rollback is the tests' weighted mean at ``alpha``)."""
        return self.alpha * self.guardrail_share

    @property
    def satisfaction_worse_alpha(self) -> float:
        """Level at which satisfaction is itself labelled worse: its share of ``alpha``."""
        return self.alpha * self.satisfaction_share

    @property
    def non_inferior_alpha(self) -> float:
        """Level of each rate's non-inferiority test: ``alpha`` (intersection-union)."""
        return self.alpha


@dataclass(frozen=True, slots=True)
class ArmStats:
    """One arm's online numbers over a window."""

    adapter: str | None
    requests: int
    thumbs_down: int = 0
    regenerate: int = 0
    edit: int = 0
    error: int = 0
    abandon: int = 0
    task_failure: int = 0
    dissatisfied: int = 0
    refusal: int = 0
    p99_latency_ms: float | None = None
    p99_ttft_ms: float | None = None
    p50_tpot_ms: float | None = None
    # The timed answers themselves (ms): the speed guardrails bound quantiles from them.
    latency_samples_ms: tuple[float, ...] = ()
    ttft_samples_ms: tuple[float, ...] = ()
    tpot_samples_ms: tuple[float, ...] = ()
    # Output length over the answered requests: count, mean and standard deviation (tokens).
    answered: int = 0
    output_tokens_mean: float | None = None
    output_tokens_sd: float | None = None
    # Reviewers' spot checks of this arm's answers: how many, and how many failed.
    reviews: int = 0
    review_failures: int = 0
    # The satisfaction model's scores and the reviews' verdicts, as sums (registry.ppi).
    satisfaction: SatisfactionSample | None = None

    def rate(self, name: str) -> float:
        """Events of kind ``name`` per request."""
        return getattr(self, name) / self.requests if self.requests else 0.0

    @property
    def pass_rate(self) -> float | None:
        """Passed reviews per review (None without reviews)."""
        return 1 - self.review_failures / self.reviews if self.reviews else None


class CanaryAction(StrEnum):
    """What the canary flow does next."""

    PROMOTE = "promote"
    ROLLBACK = "rollback"
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class MetricCheck:
    """One metric's comparison, with its numbers (p-values are always-valid)."""

    metric: str
    champion: float
    canary: float
    worse_p: float | None
    non_inferior_p: float | None
    verdict: str
    margin: float | None = None
    # What the rate is counted over, (champion, canary), where it is not requests: reviews.
    counts: tuple[int, int] | None = None
    # The "worse" test's likelihood ratio (its e-value; worse_p is min(1, 1 / it)).
    worse_evidence: float | None = None
    # How a speed guardrail decided: the quantile it could bound and the bounds.
    detail: str | None = None

    def __str__(self) -> str:
        return (
            f"{self.verdict} {self.metric}: canary {self.canary:.4g} "
            f"vs champion {self.champion:.4g}"
        )


@dataclass(frozen=True, slots=True)
class CanaryDecision:
    """The action and why, with every metric's numbers (recorded with the decision)."""

    action: CanaryAction
    reasons: tuple[str, ...]
    checks: tuple[MetricCheck, ...]
    look: int
    worse_alpha: float
    non_inferior_alpha: float
    # Always-valid p of "no rate is worse": 1 / the mean of the rollback tests' e-values.
    combined_worse_p: float = 1.0


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def normal_sf(z: npt.ArrayLike) -> FloatArray:
    """P(Z > z) for a standard normal, elementwise."""
    return np.asarray(0.5 * _erfc(np.asarray(z, dtype=np.float64) / math.sqrt(2)))


def score_test(
    champion_hits: npt.ArrayLike,
    champion_n: npt.ArrayLike,
    canary_hits: npt.ArrayLike,
    canary_n: npt.ArrayLike,
    value: npt.ArrayLike = 0.0,
) -> tuple[FloatArray, FloatArray]:
    """The fixed-sample score test of "canary rate - champion rate = ``value``"
    (Miettinen–Nurminen, with their ``n / (n - 1)`` variance correction): the z statistic,
    positive when the canary's rate is above the champion's plus ``value``, and the variance
    of the difference under that null. Elementwise; z is 0 where that variance is 0 (both
    arms all hits or all misses: no evidence either way)."""
    hits1 = np.asarray(canary_hits, dtype=np.float64)
    n1 = np.asarray(canary_n, dtype=np.float64)
    hits0 = np.asarray(champion_hits, dtype=np.float64)
    n0 = np.asarray(champion_n, dtype=np.float64)
    diff = np.asarray(value, dtype=np.float64)
    total, hits = n0 + n1, hits0 + hits1
    with np.errstate(divide="ignore", invalid="ignore"):
        # The champion's rate under the null, by the closed-form root of the cubic likelihood
        # equation (Farrington & Manning 1990); equal rates under the null pool the arms.
        b = ((n1 + 2 * n0) * diff - total - hits) / (3 * total)
        c = ((hits0 * diff - total - 2 * hits0) * diff + hits) / (3 * total)
        d = hits0 * diff * (1 - diff) / (2 * total)
        q = b**3 - 1.5 * b * c + d
        p = np.where(q < 0, -1.0, 1.0) * np.sqrt(np.maximum(b**2 - c, 0.0))
        cosine = np.clip(np.where(p == 0, 0.0, q / p**3), -1.0, 1.0)
        angle = (math.pi + np.arccos(cosine)) / 3
        constrained = 2 * p * np.cos(angle) - b
        champion_null = np.clip(np.where(diff == 0, hits / total, constrained), 0.0, 1.0)
        canary_null = np.clip(champion_null + diff, 0.0, 1.0)
        variance = (
            canary_null * (1 - canary_null) / n1 + champion_null * (1 - champion_null) / n0
        ) * (total / (total - 1))
        difference = hits1 / n1 - hits0 / n0 - diff
        z = np.where(variance > 0, difference / np.sqrt(variance), 0.0)
    return np.asarray(z, dtype=np.float64), np.asarray(variance, dtype=np.float64)


def tuned_mixture_scale(effect: npt.ArrayLike, level: float) -> FloatArray:
    """The half-normal mixture's spread at which the mSPRT at ``level`` decides soonest for
    a true effect ``effect`` (its distance from the null, in the estimate's units).

    Ignoring the half-normal's tail factor (about 1 at the boundary), the ratio crosses
    ``1 / level`` when ``z**2 >= (1 + 1/r) (c + log(1 + r))``, ``c = 2 log(1/(2 level))``,
    ``r`` the mixture variance over the estimate's variance (the usual tuning of a normal
    mixture for a target sample size, as in Howard et al. 2021). The bound is least at
    ``r* = c + log(1 + r*)``, where ``z**2 = r* + 1``; with ``z**2 = n d**2 / s**2`` for an
    effect ``d`` there, the spread is ``d sqrt(r* / (1 + r*))``: tied to the effect,
    whatever the variance per request and the traffic."""
    c = 2 * math.log(1 / (2 * level))
    r = c
    for _ in range(60):  # a contraction: each step shrinks the error by 1 / (1 + r)
        r = c + math.log1p(r)
    return np.asarray(np.asarray(effect, dtype=np.float64) * math.sqrt(r / (1 + r)))


def mixture_likelihood_ratio(
    z: npt.ArrayLike, variance: npt.ArrayLike, mixture_scale: npt.ArrayLike
) -> FloatArray:
    """The half-normal mixture likelihood ratio (mSPRT) of a z statistic whose estimate has
    ``variance``, over effects in the direction of positive z with mixture spread
    ``mixture_scale`` (in the estimate's units): an e-value at every look (an e-process
    under the null, asymptotically). Elementwise; 1 (no evidence) where the variance is 0."""
    z_ = np.asarray(z, dtype=np.float64)
    variance_ = np.asarray(variance, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        spread = np.asarray(mixture_scale, dtype=np.float64) ** 2 / variance_
        shrink = spread / (1 + spread)
        tail = 1 - normal_sf(z_ * np.sqrt(shrink))
        log_ratio = math.log(2) - 0.5 * np.log1p(spread) + 0.5 * shrink * z_**2 + np.log(tail)
        ratio = np.exp(log_ratio)
    return np.asarray(np.where(variance_ > 0, ratio, 1.0), dtype=np.float64)


def always_valid_p_value(
    z: npt.ArrayLike, variance: npt.ArrayLike, mixture_scale: npt.ArrayLike
) -> FloatArray:
    """One-sided always-valid p-value of a z statistic whose estimate has ``variance``:
    the reciprocal of the half-normal mixture likelihood ratio (mSPRT) over effects in the
    direction of positive z, mixture spread ``mixture_scale`` (in the estimate's units).
    Never below the fixed-sample p-value ``normal_sf(z)``; 1 where the variance is 0."""
    return _p_of(mixture_likelihood_ratio(z, variance, mixture_scale))


def _p_of(evidence: npt.ArrayLike) -> FloatArray:
    """The always-valid p-value of an e-value: ``min(1, 1 / e)``."""
    with np.errstate(divide="ignore"):
        return np.asarray(np.minimum(1.0, 1 / np.asarray(evidence, dtype=np.float64)))


def sequential_evidence(
    champion_hits: npt.ArrayLike,
    champion_n: npt.ArrayLike,
    canary_hits: npt.ArrayLike,
    canary_n: npt.ArrayLike,
    margin: npt.ArrayLike,
    *,
    worse_alpha: float = DEFAULT_ALPHA / WORSE_TESTS,
    non_inferior_alpha: float = DEFAULT_ALPHA,
) -> tuple[FloatArray, FloatArray]:
    """The two mixture likelihood ratios (e-values), elementwise: that the canary's rate is
    higher than the champion's (score test with a continuity correction), and that it is
    below the champion's plus ``margin`` (non-inferior; score test against the margin).
    Each mixture is tuned at its test's level to its design effect, in margins
    (:func:`tuned_mixture_scale`, :data:`WORSE_DESIGN_EFFECT`,
    :data:`NON_INFERIOR_DESIGN_EFFECT`)."""
    args = (champion_hits, champion_n, canary_hits, canary_n)
    margin_ = np.asarray(margin, dtype=np.float64)
    worse_z, worse_variance = score_test(*args, 0.0)
    # Yates' half-event correction: a rare rate on a small canary share has right-skewed,
    # discrete counts, and without it "worse" is called too often at tens of events.
    correction = 0.5 * (1 / np.asarray(champion_n) + 1 / np.asarray(canary_n))
    with np.errstate(divide="ignore", invalid="ignore"):
        worse_z = np.where(worse_variance > 0, worse_z - correction / np.sqrt(worse_variance), 0.0)
    inferior_z, inferior_variance = score_test(*args, margin_)
    worse = mixture_likelihood_ratio(
        worse_z, worse_variance, tuned_mixture_scale(WORSE_DESIGN_EFFECT * margin_, worse_alpha)
    )
    non_inferior = mixture_likelihood_ratio(
        -inferior_z,
        inferior_variance,
        tuned_mixture_scale(NON_INFERIOR_DESIGN_EFFECT * margin_, non_inferior_alpha),
    )
    return worse, non_inferior


def sequential_p_values(
    champion_hits: npt.ArrayLike,
    champion_n: npt.ArrayLike,
    canary_hits: npt.ArrayLike,
    canary_n: npt.ArrayLike,
    margin: npt.ArrayLike,
    *,
    worse_alpha: float = DEFAULT_ALPHA / WORSE_TESTS,
    non_inferior_alpha: float = DEFAULT_ALPHA,
) -> tuple[FloatArray, FloatArray]:
    """Always-valid one-sided p-values, elementwise, of :func:`sequential_evidence`: that the
    canary's rate is higher than the champion's, and that it is below the champion's plus
    ``margin`` (non-inferior)."""
    worse, non_inferior = sequential_evidence(
        champion_hits, champion_n, canary_hits, canary_n, margin,
        worse_alpha=worse_alpha, non_inferior_alpha=non_inferior_alpha,
    )  # fmt: skip
    return _p_of(worse), _p_of(non_inferior)


@dataclass(frozen=True, slots=True)
class ArmNames:
    """What the reasons call the two arms: a canary against its champion, or, when the
    champion is watched after its promotion, the new champion against the previous one."""

    champion: str = "champion"
    canary: str = "canary"


_ARM_WORDS = re.compile(r"\b(canary|champion)\b")


def decide_canary(
    champion: ArmStats,
    canary: ArmStats,
    policy: CanaryPolicy,
    *,
    look: int,
    names: ArmNames | None = None,
) -> CanaryDecision:
    """The decision at the ``look``-th check (1-based) of this canary share; its reasons
    call the arms by ``names`` (default: champion and canary)."""
    decision = _decide(champion, canary, policy, look=look)
    if names is None or names == ArmNames():
        return decision
    chosen = {"champion": names.champion, "canary": names.canary}
    reasons = tuple(
        _ARM_WORDS.sub(lambda word: chosen[word.group(1)], reason) for reason in decision.reasons
    )
    return replace(decision, reasons=reasons)


def _decide(
    champion: ArmStats, canary: ArmStats, policy: CanaryPolicy, *, look: int
) -> CanaryDecision:
    requests = f"{canary.requests} canary / {champion.requests} champion requests"
    if min(champion.requests, canary.requests) < policy.min_requests:
        reason = f"waiting for data: {requests}, {policy.min_requests} needed per arm"
        action = CanaryAction.WAIT
        if look >= policy.max_looks:
            action = CanaryAction.ROLLBACK
            reason = f"{reason}; out of looks ({look} of {policy.max_looks}) without a decision"
        levels = (policy.worse_alpha, policy.non_inferior_alpha)
        return CanaryDecision(action, (reason,), (), look, *levels)
    checks = [
        *_rate_checks(champion, canary, policy),
        *_speed_checks(champion, canary, policy),
        _length_check(champion, canary, policy),
    ]
    if policy.satisfaction is not None:
        checks.append(satisfaction_check(champion, canary, policy, policy.satisfaction))
    elif policy.reviews is not None:
        checks.append(review_check(champion, canary, policy, policy.reviews))
    combined_p = combined_worse_p(checks, policy)
    tests = (policy.worse_alpha, policy.non_inferior_alpha, combined_p)
    worse = [c for c in checks if c.verdict == "WORSE"]
    if worse:
        reasons = tuple(_explain(c, policy, requests) for c in worse)
        return CanaryDecision(CanaryAction.ROLLBACK, reasons, tuple(checks), look, *tests)
    if combined_p <= policy.alpha:
        reasons = (_explain_jointly_worse(checks, policy, requests, combined_p),)
        return CanaryDecision(CanaryAction.ROLLBACK, reasons, tuple(checks), look, *tests)
    # With satisfaction judged, the signal rates are guardrails: only satisfaction and the
    # speed and length checks hold a promotion.
    holding = [c for c in checks if policy.satisfaction is None or c.metric not in _RATE_METRICS]
    unproven = [c for c in holding if c.verdict == "UNPROVEN"]
    if not unproven:
        reasons = _promotion_reasons(checks, policy, requests)
        return CanaryDecision(CanaryAction.PROMOTE, reasons, tuple(checks), look, *tests)
    reasons = _explain_unproven(unproven, policy, requests)
    if look >= policy.max_looks:
        reasons = (
            *reasons,
            f"out of looks ({look} of {policy.max_looks}) without the canary shown as good as "
            "the champion",
        )
        return CanaryDecision(CanaryAction.ROLLBACK, reasons, tuple(checks), look, *tests)
    return CanaryDecision(CanaryAction.WAIT, reasons, tuple(checks), look, *tests)


def _promotion_reasons(
    checks: Sequence[MetricCheck], policy: CanaryPolicy, requests: str
) -> tuple[str, ...]:
    """Why a canary is promoted: its satisfaction when judged, else every rate."""
    if policy.satisfaction is not None:
        return tuple(_explain_satisfaction(c, policy) for c in checks if c.metric == SATISFACTION)
    proven = [c.non_inferior_p for c in checks if c.non_inferior_p is not None]
    largest = max(p for p in proven if p <= policy.non_inferior_alpha)
    dissatisfied = next(c for c in checks if c.metric == "dissatisfied_rate")
    return (
        f"every rate on the canary within its margin of the champion's, at least "
        f"{sure(largest)} sure of each ({sure(policy.non_inferior_alpha)} needed; {requests}): "
        f"dissatisfied {dissatisfied.canary:.1%} vs {dissatisfied.champion:.1%}",
        *(_explain_reviews(c, policy) for c in checks if c.metric == PASS_RATE),
    )


def _explain_unproven(
    unproven: Sequence[MetricCheck], policy: CanaryPolicy, requests: str
) -> tuple[str, ...]:
    """Why the canary waits: several rates not yet shown within their margins read as one
    sentence (the requests and the certainty needed said once), the rest one by one."""
    rates = [c for c in unproven if c.metric in _RATE_METRICS and c.non_inferior_p is not None]
    if len(rates) < 2:
        return tuple(_explain(c, policy, requests) for c in unproven)
    each = "; ".join(
        f"{metric_label(c.metric)} {_shown(c, c.canary)} vs {_shown(c, c.champion)}, within "
        f"{_points(c.margin)} {sure(c.non_inferior_p or 1.0)} sure"
        for c in rates
    )
    grouped = (
        f"rates not yet shown within their margins of the champion's ({requests}; "
        f"{sure(policy.non_inferior_alpha)} sure needed): {each}"
    )
    return (grouped, *(_explain(c, policy, requests) for c in unproven if c not in rates))


def rollback_evidence(
    policy: CanaryPolicy,
    guardrails: npt.ArrayLike,
    satisfaction: npt.ArrayLike | None = None,
) -> FloatArray:
    """The rollback's e-value: the weighted mean of the rollback tests' e-values
    (satisfaction's share, :attr:`CanaryPolicy.satisfaction_share`, and each guardrail's,
    :attr:`CanaryPolicy.guardrail_share`: fixed weights summing to 1), elementwise over the
    leading axes of ``guardrails`` (the guardrails' e-values on the last axis) and
    ``satisfaction``. A test without data, or not given, counts as 1 (no evidence; a constant
    1 is an e-value), so the mean stays an e-process whichever tests have data yet."""
    values = np.asarray(guardrails, dtype=np.float64)
    slots = policy.worse_tests - (policy.satisfaction is not None)
    missing = slots - values.shape[-1]
    if missing < 0:
        raise ValueError(f"{values.shape[-1]} guardrail e-values for {slots} guardrail tests")
    mean = policy.guardrail_share * (values.sum(axis=-1) + missing)
    if policy.satisfaction is not None:
        sat = 1.0 if satisfaction is None else np.asarray(satisfaction, dtype=np.float64)
        mean = mean + policy.satisfaction_share * sat
    return np.asarray(mean, dtype=np.float64)


def combined_worse_p(checks: Sequence[MetricCheck], policy: CanaryPolicy) -> float:
    """Always-valid p-value that no rate (nor the length, nor the pass rate, nor
    satisfaction) is worse: the reciprocal of :func:`rollback_evidence` over the checks."""
    judged = [(c.metric, c.worse_evidence) for c in checks if c.worse_evidence is not None]
    guardrails = [e for metric, e in judged if metric != SATISFACTION]
    satisfaction = [e for metric, e in judged if metric == SATISFACTION]
    evidence = rollback_evidence(policy, guardrails, satisfaction[0] if satisfaction else None)
    return float(_p_of(evidence))


def _explain_jointly_worse(
    checks: Sequence[MetricCheck], policy: CanaryPolicy, requests: str, combined_p: float
) -> str:
    """Why a canary no single rate shows worse is rolled back: its rates together."""
    ranked = sorted(
        (c for c in checks if c.worse_evidence is not None and c.worse_p is not None),
        key=lambda c: -(c.worse_evidence or 0.0),
    )
    most = ", ".join(f"{metric_label(c.metric)} {_shown(c, c.canary)} vs {_shown(c, c.champion)}"
                     for c in ranked[:3])  # fmt: skip
    return (
        f"worse on its rates together ({requests}): {sure(combined_p)} sure that some rate is "
        f"higher on the canary ({sure(policy.alpha)} needed, the {policy.worse_tests} rollback "
        f"tests pooled); mostly {most}"
    )


def _rate_checks(champion: ArmStats, canary: ArmStats, policy: CanaryPolicy) -> list[MetricCheck]:
    margins = [policy.margin(name) for name in RATES]
    worse_e, non_inferior_e = sequential_evidence(
        [getattr(champion, name) for name in RATES],
        champion.requests,
        [getattr(canary, name) for name in RATES],
        canary.requests,
        margins,
        worse_alpha=policy.worse_alpha,
        non_inferior_alpha=policy.non_inferior_alpha,
    )
    worse_p, non_inferior_p = _p_of(worse_e), _p_of(non_inferior_e)
    checks = []
    for index, name in enumerate(RATES):
        if worse_p[index] <= policy.worse_alpha:
            verdict = "WORSE"
        elif non_inferior_p[index] <= policy.non_inferior_alpha:
            verdict = "OK"
        else:
            verdict = "UNPROVEN"
        checks.append(
            MetricCheck(
                f"{name}_rate",
                champion.rate(name),
                canary.rate(name),
                float(worse_p[index]),
                float(non_inferior_p[index]),
                verdict,
                margins[index],
                worse_evidence=float(worse_e[index]),
            )
        )
    return checks


def review_check(
    champion: ArmStats, canary: ArmStats, policy: CanaryPolicy, test: ReviewTest
) -> MetricCheck:
    """The human pass rate, canary against champion: WORSE when the canary's failure rate
    per review is shown higher; OK when shown within ``test.margin`` (and, with
    ``min_reviews``, on that many reviews per arm); UNPROVEN otherwise when a minimum is
    set, else OK (a guardrail). The values shown are the pass rates."""
    shown = (champion.pass_rate or 0.0, canary.pass_rate or 0.0)
    counts = (champion.reviews, canary.reviews)
    required = test.min_reviews > 0
    if min(counts) == 0:
        verdict = "UNPROVEN" if required else "OK"
        return MetricCheck(PASS_RATE, *shown, None, None, verdict, test.margin, counts)
    worse_e, non_inferior_e = sequential_evidence(
        champion.review_failures, champion.reviews, canary.review_failures, canary.reviews,
        test.margin, worse_alpha=policy.worse_alpha, non_inferior_alpha=policy.non_inferior_alpha,
    )  # fmt: skip
    evidence = float(worse_e)
    worse, non_inferior = float(_p_of(worse_e)), float(_p_of(non_inferior_e))
    if worse <= policy.worse_alpha:
        verdict = "WORSE"
    elif required and min(champion.reviews, canary.reviews) < test.min_reviews:
        verdict = "UNPROVEN"
    elif non_inferior <= policy.non_inferior_alpha or not required:
        verdict = "OK"
    else:
        verdict = "UNPROVEN"
    return MetricCheck(
        PASS_RATE, *shown, worse, non_inferior, verdict, test.margin, counts, evidence
    )


_RATE_METRICS = frozenset(f"{name}_rate" for name in RATES)


def satisfaction_evidence(
    difference: npt.ArrayLike,
    variance: npt.ArrayLike,
    margin: npt.ArrayLike,
    *,
    worse_alpha: float,
    non_inferior_alpha: float,
) -> tuple[FloatArray, FloatArray]:
    """The two mixture likelihood ratios (e-values), elementwise, of an estimated difference
    of satisfaction (canary minus champion) with ``variance``: that the canary satisfies
    less, and that it satisfies at least the champion's minus ``margin``. Tuned like the
    rates' (:func:`sequential_evidence`), non-inferiority's the mean of two mixtures, one
    tuned to an equal canary and one to a clearly better one (:data:`BETTER_DESIGN_EFFECT`)."""
    d = np.asarray(difference, dtype=np.float64)
    v = np.asarray(variance, dtype=np.float64)
    margin_ = np.asarray(margin, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        sd = np.sqrt(v)
        worse_z = np.where(v > 0, -d / sd, 0.0)
        non_inferior_z = np.where(v > 0, (d + margin_) / sd, 0.0)
    worse = mixture_likelihood_ratio(
        worse_z, v, tuned_mixture_scale(WORSE_DESIGN_EFFECT * margin_, worse_alpha)
    )
    # The mean of two e-processes is one (a mixture over both spreads): valid at every look,
    # at most half the evidence of the narrow spread alone for a canary as good as its
    # champion, far more for a clearly better one.
    non_inferior = 0.5 * sum(
        mixture_likelihood_ratio(
            non_inferior_z, v, tuned_mixture_scale(effect * margin_, non_inferior_alpha)
        )
        for effect in (NON_INFERIOR_DESIGN_EFFECT, BETTER_DESIGN_EFFECT)
    )
    return worse, np.asarray(non_inferior, dtype=np.float64)


def satisfaction_check(
    champion: ArmStats, canary: ArmStats, policy: CanaryPolicy, test: SatisfactionTest
) -> MetricCheck:
    """Satisfaction on every answer, canary against champion (:mod:`registry.ppi`): WORSE
    when the canary is shown less satisfying, OK when shown within ``test.margin``,
    UNPROVEN otherwise or with fewer than ``test.min_reviews`` reviews on an arm."""
    empty = SatisfactionSample()
    samples = (champion.satisfaction or empty, canary.satisfaction or empty)
    counts = (samples[0].labelled, samples[1].labelled)
    if min(counts) < test.min_reviews:
        shown = tuple(s.review_pass_rate or 0.0 for s in samples)
        return MetricCheck(
            SATISFACTION, shown[0], shown[1], None, None, "UNPROVEN", test.margin,
            (counts[0], counts[1]),
            detail=f"fewer than {test.min_reviews} reviews on an arm (canary {counts[1]}, "
            f"champion {counts[0]})",
        )  # fmt: skip
    arms = [estimate(s, power_tuned=test.power_tuned) for s in samples]
    difference = arms[1].mean - arms[0].mean
    variance = arms[0].variance + arms[1].variance
    worse_e, non_inferior_e = satisfaction_evidence(
        difference, variance, test.margin,
        worse_alpha=policy.satisfaction_worse_alpha, non_inferior_alpha=policy.non_inferior_alpha,
    )  # fmt: skip
    worse, non_inferior = float(_p_of(worse_e)), float(_p_of(non_inferior_e))
    if worse <= policy.satisfaction_worse_alpha:
        verdict = "WORSE"
    elif non_inferior <= policy.non_inferior_alpha:
        verdict = "OK"
    else:
        verdict = "UNPROVEN"
    spread = SHOWN_INTERVAL_Z * math.sqrt(max(variance, 0.0))
    detail = (
        f"canary satisfies {arms[1].mean:.2f} of {arms[1].answers} answers vs the champion's "
        f"{arms[0].mean:.2f} of {arms[0].answers} (reviews {arms[1].reviews}/{arms[0].reviews}; "
        f"difference {difference:+.2f}, this look's 95% interval {difference - spread:+.2f} to "
        f"{difference + spread:+.2f}; the scores weighted {arms[1].weight:.2f}/"
        f"{arms[0].weight:.2f})"
    )
    return MetricCheck(
        SATISFACTION, arms[0].mean, arms[1].mean, worse, non_inferior, verdict, test.margin,
        (counts[0], counts[1]), float(worse_e), detail,
    )  # fmt: skip


def _explain_satisfaction(check: MetricCheck, policy: CanaryPolicy) -> str:
    """Why satisfaction promotes, holds or rolls back."""
    numbers = check.detail or ""
    if check.worse_p is None or check.non_inferior_p is None:
        return f"satisfaction not judged yet: {numbers}; the canary waits"
    within = f"within {check.margin:.2g} of the champion"
    if check.verdict == "WORSE":
        return (
            f"{numbers}: shown less satisfying, {sure(check.worse_p)} sure "
            f"({sure(policy.satisfaction_worse_alpha)} needed)"
        )
    if check.verdict == "UNPROVEN":
        # Both ways, so a canary heading back reads as such beside this look's interval.
        return (
            f"{numbers}: not yet shown {within} ({sure(check.non_inferior_p)} sure, "
            f"{sure(policy.non_inferior_alpha)} needed) nor less satisfying "
            f"({sure(check.worse_p)} sure, {sure(policy.satisfaction_worse_alpha)} needed over "
            "every look)"
        )
    return (
        f"{numbers}: {within}, {sure(check.non_inferior_p)} sure "
        f"({sure(policy.non_inferior_alpha)} needed); the users' signal rates are guardrails"
    )


def _explain_reviews(check: MetricCheck, policy: CanaryPolicy) -> str:
    """Why the pass rate holds or rolls back, or why it does not hold (a guardrail)."""
    test = policy.reviews
    minimum = test.min_reviews if test is not None else 0
    champion_n, canary_n = check.counts or (0, 0)
    pass_rates = (
        f"pass rate: canary {check.canary:.1%} vs champion {check.champion:.1%} "
        f"({canary_n} canary / {champion_n} champion reviews)"
    )
    if check.worse_p is None or check.non_inferior_p is None:
        if minimum:
            return f"{pass_rates}: waiting for reviews on both arms"
        return f"{pass_rates}: no reviews on one arm yet (a guardrail: it holds nothing)"
    within = f"within {_points(check.margin)} of the champion's"
    if check.verdict == "WORSE":
        return (
            f"{pass_rates}: reviewers fail the canary more often, {sure(check.worse_p)} sure "
            f"({sure(policy.worse_alpha)} needed)"
        )
    if check.verdict == "UNPROVEN" and min(champion_n, canary_n) < minimum:
        return f"{pass_rates}: fewer than {minimum} reviews on an arm"
    if check.verdict == "UNPROVEN":
        return (
            f"{pass_rates}: not yet shown {within}, {sure(check.non_inferior_p)} sure "
            f"({sure(policy.non_inferior_alpha)} needed)"
        )
    return (
        f"{pass_rates}: {within}, {sure(check.non_inferior_p)} sure "
        f"({'required' if minimum else 'a guardrail: it can roll back, never hold'})"
    )


def _explain(check: MetricCheck, policy: CanaryPolicy, requests: str) -> str:
    """One check's finding in words, with its numbers and how sure it is."""
    if check.metric in (PASS_RATE, SATISFACTION):
        explain = _explain_reviews if check.metric == PASS_RATE else _explain_satisfaction
        return explain(check, policy)
    label = metric_label(check.metric)
    arms = f"{_shown(check, check.canary)} vs {_shown(check, check.champion)}"
    if check.metric == "mean_output_tokens" and check.worse_p is not None:
        return (
            f"{label} outside ±{check.margin:.0%} of the champion's: {arms} ({requests}), "
            f"{sure(check.worse_p)} sure ({sure(policy.worse_alpha)} needed)"
        )
    if check.detail is not None:
        shown = "slower on the canary" if check.verdict == "WORSE" else "not judged"
        return f"{label} {shown}: {arms} ({requests}); {check.detail}"
    if check.worse_p is None or check.non_inferior_p is None:
        return f"{label}: {arms}"
    if check.verdict == "WORSE":
        return (
            f"{label} higher on the canary: {arms} ({requests}), {sure(check.worse_p)} sure "
            f"({sure(policy.worse_alpha)} needed)"
        )
    return (
        f"{label} not yet shown within {_points(check.margin)} of the champion's: {arms} "
        f"({requests}), {sure(check.non_inferior_p)} sure ({sure(policy.non_inferior_alpha)} "
        "needed)"
    )


# Metrics in words (a rate's name reads as itself: "thumbs_down_rate" -> "thumbs-down rate").
_LABELS: Mapping[str, str] = {
    "thumbs_down_rate": "thumbs-down rate",
    "task_failure_rate": "task-failure rate",
    "dissatisfied_rate": "dissatisfied rate",
    "p99_latency_ms": "latency",
    "p99_ttft_ms": "time to first token",
    "p50_tpot_ms": "time per output token",
    "mean_output_tokens": "mean answer length",
    PASS_RATE: "pass rate",
    # The shadow's counts (registry.shadow).
    "pii": "answers with PII",
    "refusal": "refusals",
    "length_ratio": "length ratio",
}
_UNITS: Mapping[str, str] = {
    "p99_latency_ms": " ms",
    "p99_ttft_ms": " ms",
    "p50_tpot_ms": " ms",
    "mean_output_tokens": " tokens",
}


def metric_label(metric: str) -> str:
    """A check's metric in words ("thumbs_down_rate" -> "thumbs-down rate")."""
    return _LABELS.get(metric, metric.replace("_", " "))


def metric_value(metric: str, value: float | None) -> str:
    """A metric's value as a person reads it: rates in percent, times and lengths in units."""
    if value is None:
        return "–"
    if metric in _RATE_METRICS or metric == PASS_RATE:
        return f"{value:.1%}"
    if metric == SATISFACTION:
        return f"{value:.2f}"
    return f"{value:.4g}{_UNITS.get(metric, '')}"


# A check's verdict code in words (the code stays in the recorded numbers).
VERDICT_WORDS: Mapping[str, str] = {
    "WORSE": "worse",
    "OK": "holds",
    "UNPROVEN": "not shown yet",
}


def _shown(check: MetricCheck, value: float) -> str:
    return metric_value(check.metric, value)


def _points(margin: float | None) -> str:
    """A rate's margin in percentage points ("3 points")."""
    points = (margin or 0.0) * 100
    return f"{points:.3g} point{'' if points == 1 else 's'}"


def quantile_bounds(
    values: Sequence[float], q: float, level: float
) -> tuple[float | None, float | None]:
    """Distribution-free one-sided confidence bounds on the ``q``-quantile of what
    ``values`` were drawn from: a lower bound and an upper bound, each wrong with
    probability at most ``level``, or None where the sample is too small to give one.

    Order statistics: the k-th smallest of n draws is below the quantile exactly when
    at least k draws are, a Binomial(n, q) event, so the bound is the order statistic
    whose binomial tail reaches ``level``. The upper bound needs ``q**n <= level``: a
    p99 needs about 300 answers at 0.05, a median 5.
    """
    n = len(values)
    if n == 0 or not 0 < q < 1:
        return None, None
    ordered = sorted(values)
    k = np.arange(n)
    # log P(Bin(n, q) = k) by the ratio of successive terms, then P(Bin(n, q) <= k).
    steps = np.log((n - k[:-1]) / (k[:-1] + 1.0)) + math.log(q / (1 - q))
    log_pmf = n * math.log1p(-q) + np.concatenate(([0.0], np.cumsum(steps)))
    cdf = np.cumsum(np.exp(log_pmf))
    below = np.flatnonzero(cdf <= level)
    above = np.flatnonzero(cdf >= 1 - level)
    low = float(ordered[below[-1]]) if below.size else None
    high = float(ordered[above[0]]) if above.size else None
    return low, high


# The quantiles a speed guardrail steps down through when its arms have too few timed
# answers to bound the one it names (a p99 needs hundreds per arm, a median a dozen).
SPEED_QUANTILES = (0.99, 0.95, 0.9, 0.75, 0.5)


def speed_check(
    metric: str,
    quantile: float,
    champion: Sequence[float],
    canary: Sequence[float],
    *,
    ratio: float,
    slack_ms: float,
    level: float,
) -> MetricCheck:
    """A speed guardrail: WORSE when the canary's ``quantile`` is shown above the
    champion's times ``ratio`` plus ``slack_ms``, i.e. the canary's lower confidence bound
    is above the allowed value computed from the champion's upper bound (each bound at
    ``level``). Where the arms are too small to bound ``quantile``, the highest lower
    quantile of :data:`SPEED_QUANTILES` they can bound is tested instead, and said so; with
    no bound at all the guardrail holds nothing (OK, with the reason). The values shown
    are the two arms' observed ``quantile``."""
    shown = tuple(observed_quantile(v, quantile) or 0.0 for v in (champion, canary))
    if not champion or not canary:
        return MetricCheck(metric, shown[0], shown[1], None, None, "OK", detail="no timed answers")
    for q in (quantile, *(q for q in SPEED_QUANTILES if q < quantile)):
        canary_low, _ = quantile_bounds(canary, q, level)
        _, champion_high = quantile_bounds(champion, q, level)
        if canary_low is not None and champion_high is not None:
            break
    else:
        detail = (
            f"too few timed answers ({len(canary)} canary, {len(champion)} champion) to "
            f"bound even a median {sure(level)} sure"
        )
        return MetricCheck(metric, shown[0], shown[1], None, None, "OK", detail=detail)
    allowed = champion_high * ratio + slack_ms
    verdict = "WORSE" if canary_low > allowed else "OK"
    named = f"p{q * 100:g}" + (
        "" if q == quantile else f" (too few answers for p{quantile * 100:g})"
    )
    relation = "over" if verdict == "WORSE" else "within"
    detail = (
        f"{named}: canary at least {canary_low:.4g} ms, {relation} the allowed champion's at "
        f"most {champion_high:.4g} ms x {ratio:g} + {slack_ms:g} ms ({sure(level)} sure of "
        "each bound)"
    )
    return MetricCheck(metric, shown[0], shown[1], None, None, verdict, detail=detail)


def _speed_checks(champion: ArmStats, canary: ArmStats, policy: CanaryPolicy) -> list[MetricCheck]:
    """p99 latency, p99 time to first token and median time per output token against their
    allowed ratios, on confidence bounds (:func:`speed_check`). Guardrails: they roll back a
    canary shown slower and never hold a promotion. Order-statistic bounds are not
    anytime-valid, so each guardrail's ``policy.worse_alpha`` is split over its two bounds
    and over ``max_looks`` (Bonferroni): a canary as fast as its champion is wrongly rolled
    back by one guardrail with probability at most ``worse_alpha`` over all its looks."""
    level = policy.worse_alpha / (2 * policy.max_looks)
    return [
        speed_check(metric, quantile, theirs, ours, ratio=ratio, slack_ms=slack, level=level)
        for metric, quantile, theirs, ours, ratio, slack in (
            (
                "p99_latency_ms",
                0.99,
                champion.latency_samples_ms,
                canary.latency_samples_ms,
                policy.max_p99_ratio,
                policy.p99_slack_ms,
            ),
            (
                "p99_ttft_ms",
                0.99,
                champion.ttft_samples_ms,
                canary.ttft_samples_ms,
                policy.max_ttft_p99_ratio,
                policy.ttft_slack_ms,
            ),
            (
                "p50_tpot_ms",
                0.5,
                champion.tpot_samples_ms,
                canary.tpot_samples_ms,
                policy.max_tpot_ratio,
                policy.tpot_slack_ms,
            ),
        )
    ]


def length_evidence(
    champion_mean: float,
    champion_sd: float,
    champion_n: int,
    canary_mean: float,
    canary_sd: float,
    canary_n: int,
    change: float,
    level: float = DEFAULT_ALPHA / WORSE_TESTS,
) -> tuple[float, float]:
    """Mixture likelihood ratios (e-values) that the canary's mean output length is above
    ``(1 + change)`` times the champion's, and below ``(1 - change)`` times it (Welch's z
    of the difference of means into the same normal-mixture SPRT as the rates, the
    mixture tuned at ``level`` to an effect of ``change`` times the champion's mean)."""
    ratios = []
    for factor, sign in ((1 + change, 1.0), (1 - change, -1.0)):
        variance = canary_sd**2 / canary_n + factor**2 * champion_sd**2 / champion_n
        if variance <= 0:
            ratios.append(1.0)
            continue
        z = sign * (canary_mean - factor * champion_mean) / math.sqrt(variance)
        scale = tuned_mixture_scale(max(change * champion_mean, 1.0), level)
        ratios.append(float(mixture_likelihood_ratio(z, variance, scale)))
    return ratios[0], ratios[1]


def length_p_values(
    champion_mean: float,
    champion_sd: float,
    champion_n: int,
    canary_mean: float,
    canary_sd: float,
    canary_n: int,
    change: float,
    level: float = DEFAULT_ALPHA / WORSE_TESTS,
) -> tuple[float, float]:
    """Always-valid one-sided p-values of :func:`length_evidence`: that the canary's mean
    output length is above ``(1 + change)`` times the champion's, and below ``(1 - change)``
    times it."""
    longer, shorter = length_evidence(
        champion_mean, champion_sd, champion_n, canary_mean, canary_sd, canary_n, change, level
    )
    return float(_p_of(longer)), float(_p_of(shorter))


def _length_check(champion: ArmStats, canary: ArmStats, policy: CanaryPolicy) -> MetricCheck:
    """Mean output length: WORSE when shown outside the tolerated band (a guardrail). Its
    e-value is the mean of its two sides' (one rollback test: a canary cannot be both
    longer and shorter, but the sides' errors would add up if each had the full share)."""
    means = (champion.output_tokens_mean, canary.output_tokens_mean)
    sds = (champion.output_tokens_sd, canary.output_tokens_sd)
    if None in means or None in sds or min(champion.answered, canary.answered) < 2:
        return MetricCheck("mean_output_tokens", means[0] or 0.0, means[1] or 0.0, None, None, "OK")
    champion_mean, canary_mean = float(means[0] or 0.0), float(means[1] or 0.0)
    longer, shorter = length_evidence(
        champion_mean,
        float(sds[0] or 0.0),
        champion.answered,
        canary_mean,
        float(sds[1] or 0.0),
        canary.answered,
        policy.max_length_change,
        policy.worse_alpha,
    )
    evidence = (longer + shorter) / 2
    worse_p = float(_p_of(evidence))
    verdict = "WORSE" if worse_p <= policy.worse_alpha else "OK"
    return MetricCheck(
        "mean_output_tokens",
        champion_mean,
        canary_mean,
        worse_p,
        None,
        verdict,
        policy.max_length_change,
        worse_evidence=evidence,
    )


def _recorded(window: Any) -> dict[str, Any]:
    """A window's numbers as a decision records them: without the timed answers one by
    one (thousands per look; the checks carry the bounds taken from them)."""
    numbers = asdict(window)
    numbers.pop("latency_samples_ms", None)
    for name in ("ttft_samples_ms", "tpot_samples_ms"):
        numbers.get("answers", {}).pop(name, None)
    return numbers


def _arm(
    windows: dict[str | None, Any],
    adapter: str | None,
    satisfaction: dict[str | None, Any] | None = None,
) -> ArmStats:
    """One arm's numbers for the canary's test, from its window of the line's answers and
    signals (``feedback.online.adapter_windows``) and its satisfaction sample, if any."""
    window = windows[adapter]
    return ArmStats(
        adapter=adapter,
        requests=window.requests,
        thumbs_down=window.signals["thumbs_down"],
        regenerate=window.signals["regenerate"],
        edit=window.signals["edit"],
        error=window.errors,
        abandon=window.signals["abandon"],
        task_failure=window.signals["task_failure"],
        dissatisfied=window.signals["dissatisfied"],
        refusal=window.answers.refusals,
        p99_latency_ms=window.p99_latency_ms,
        p99_ttft_ms=window.answers.p99_ttft_ms,
        p50_tpot_ms=window.answers.p50_tpot_ms,
        latency_samples_ms=window.latency_samples_ms,
        ttft_samples_ms=window.answers.ttft_samples_ms,
        tpot_samples_ms=window.answers.tpot_samples_ms,
        answered=window.answers.answered,
        output_tokens_mean=window.answers.output_tokens_mean,
        output_tokens_sd=window.answers.output_tokens_sd,
        reviews=window.reviews,
        review_failures=window.review_failures,
        satisfaction=(satisfaction or {}).get(adapter),
    )
