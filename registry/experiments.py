"""A/B experiments between two adapters of a line, judged on a business metric (pure).

An experiment splits a line's users (sticky, ``registry.routing``) between arm A and
arm B and compares them on one metric from :data:`METRICS`, each a rate per request:

- ``task_success``: of the requests with a task outcome, the share whose outcome is a
  success (and none a failure) — the conversion of finished tasks;
- ``thumbs_up``: of all requests, the share that got a thumbs-up;
- ``abandon``: of all requests, the share abandoned (an ``abandon`` event, or cancelled
  by the client before the answer ended); lower is better;
- ``satisfied``: of all requests, the share with a positive signal (thumbs-up or a
  successful task) and no negative one (thumbs-down, regenerate, edit, abandon, failed
  task, cancelled);
- ``pass_rate``: of the requests a reviewer spot-checked (``review`` events on the
  feedback page), the share that passed (and none failed);
- ``satisfaction`` (:data:`SATISFACTION`): each arm's share of satisfied users estimated on
  every answer, as the canary estimates it (:mod:`registry.ppi`): the line's satisfaction
  model's score of each answer, rectified by the blind reviews (missing at random, unlike
  users' own signals, which are rare and come mostly from unhappy users). It needs a review
  block in the line's recipe and ``min_reviews`` per arm before it decides.

The test is the canary's (``registry.canary``), made two-sided: the Miettinen–Nurminen
score statistic of "B's rate - A's rate" feeds the half-normal mixture SPRT in each
direction, each at ``alpha / 2``, so the always-valid two-sided p-value is twice the
smaller one-sided one and stays valid however often anyone looks. The experiment
decides at the first look where it crosses ``alpha`` with at least ``min_samples`` per
arm (the normal approximation needs some data); that decision is kept. The effect's
interval is the matching confidence sequence: every difference the same test does not
reject at ``alpha / 2`` per side, found on a grid of :data:`EFFECT_GRID_STEP`, and so
valid at every look at once (its plot over looks narrows, never lies).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from feedback.events import ONLINE_SIGNALS, POSITIVE_SIGNALS, USER_SIGNALS
from flywheel.wording import sure
from registry.canary import always_valid_p_value, score_test
from registry.names import adapter_name, parse_adapter_name
from registry.ppi import ArmEstimate, SatisfactionSample, estimate
from registry.routing import RoutingTable

# Facts about one request the metrics are made of (the store computes them per request).
# Their order is each flag's bit in the stored tallies (registry.experiment_tally).
FLAGS = (*(signal.value for signal in USER_SIGNALS), "review_pass", "review_fail")
_POSITIVE = tuple(signal.value for signal in USER_SIGNALS if signal in POSITIVE_SIGNALS)
EFFECT_GRID_STEP = 0.001
ArmLabel = Literal["a", "b"]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ExperimentMetric:
    """A rate per request: of the requests with any of ``among`` (every request when
    empty), the share with any of ``hit_any`` and none of ``hit_none``."""

    name: str
    higher_is_better: bool
    among: tuple[str, ...]
    hit_any: tuple[str, ...]
    hit_none: tuple[str, ...] = ()
    description: str = ""


METRICS: dict[str, ExperimentMetric] = {
    metric.name: metric
    for metric in (
        ExperimentMetric(
            "task_success",
            True,
            among=("task_success", "task_failure"),
            hit_any=("task_success",),
            hit_none=("task_failure",),
            description="of the requests with a task outcome, the share that succeeded",
        ),
        ExperimentMetric(
            "thumbs_up",
            True,
            among=(),
            hit_any=("thumbs_up",),
            description="of all requests, the share with a thumbs-up",
        ),
        ExperimentMetric(
            "abandon",
            False,
            among=(),
            hit_any=("abandon",),
            description="of all requests, the share abandoned or cancelled",
        ),
        ExperimentMetric(
            "satisfied",
            True,
            among=(),
            hit_any=_POSITIVE,
            hit_none=tuple(signal.value for signal in ONLINE_SIGNALS),
            description="of all requests, the share with a positive and no negative signal",
        ),
        ExperimentMetric(
            "pass_rate",
            True,
            among=("review_pass", "review_fail"),
            hit_any=("review_pass",),
            hit_none=("review_fail",),
            description="of the requests a reviewer spot-checked, the share that passed",
        ),
    )
}


SATISFACTION = "satisfaction"
# Every metric an experiment can be judged on: the rates, and satisfaction on every answer.
METRIC_NAMES = (*METRICS, SATISFACTION)


class ExperimentPolicy(BaseModel):
    """How an experiment is judged (the recipe's canary alpha and minimum by default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha: float = Field(
        default=0.05, gt=0, lt=0.5, description="Bound on a wrong decision, over all looks."
    )
    min_samples: int = Field(
        default=200, ge=1, description="Per arm (requests the metric counts) before deciding."
    )
    mixture_scale: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="The mixture's spread: the size of effect (absolute rate difference) the "
        "test is quickest to find.",
    )
    min_reviews: int = Field(
        default=30,
        ge=2,
        description="With the satisfaction metric: reviews per arm before deciding.",
    )


@dataclass(frozen=True, slots=True)
class ArmCount:
    """One arm's samples (requests the metric counts) and hits; with the satisfaction
    metric, its answers, the reviews that passed, and the estimate on every answer."""

    samples: int
    hits: int
    estimate: float | None = None
    reviews: int | None = None

    @property
    def rate(self) -> float | None:
        """Hits per sample, or the satisfaction estimate (None before any sample, or before
        satisfaction can be estimated)."""
        if self.reviews is not None:
            return self.estimate
        return self.hits / self.samples if self.samples else None


def flag_mask(flags: Iterable[str]) -> int:
    """The bit mask of a set of :data:`FLAGS` (bit ``k`` for ``FLAGS[k]``): how a request's
    flags are tallied (``registry.experiment_tally``)."""
    mask = 0
    for flag in flags:
        mask |= 1 << FLAGS.index(flag)
    return mask


def metric_counts(tally: Mapping[int, int]) -> dict[str, ArmCount]:
    """Each metric's samples and hits from an arm's tally (how many requests have each
    flag mask): the same rule per request as the store's recount, summed over the cells."""
    counts = {}
    for name, metric in METRICS.items():
        among, hit_any, hit_none = (
            flag_mask(metric.among),
            flag_mask(metric.hit_any),
            flag_mask(metric.hit_none),
        )
        samples = hits = 0
        for mask, requests in tally.items():
            if among and not mask & among:
                continue
            samples += requests
            if mask & hit_any and not mask & hit_none:
                hits += requests
        counts[name] = ArmCount(samples, hits)
    return counts


class Verdict(StrEnum):
    """Where an experiment's test stands after a look."""

    WAITING = "waiting"  # too few samples to decide
    UNDECIDED = "undecided"
    A_BETTER = "a_better"
    B_BETTER = "b_better"


@dataclass(frozen=True, slots=True)
class ExperimentLook:
    """One look's numbers and verdict. ``effect`` is B's rate minus A's, ``lower``/``upper``
    its confidence sequence at ``1 - alpha``; ``p_value`` the always-valid two-sided one."""

    metric: str
    a: ArmCount
    b: ArmCount
    effect: float | None
    lower: float
    upper: float
    p_value: float
    verdict: Verdict
    reasons: tuple[str, ...]
    alpha: float
    min_samples: int

    @property
    def winner(self) -> ArmLabel | None:
        """The arm shown better, if any."""
        if self.verdict is Verdict.A_BETTER:
            return "a"
        if self.verdict is Verdict.B_BETTER:
            return "b"
        return None

    def as_dict(self) -> dict[str, object]:
        """The numbers as stored with the look and logged to MLflow."""
        return {
            "metric": self.metric,
            "a_samples": self.a.samples,
            "a_hits": self.a.hits,
            "a_rate": self.a.rate,
            "b_samples": self.b.samples,
            "b_hits": self.b.hits,
            "b_rate": self.b.rate,
            **(
                {"a_reviews": self.a.reviews, "b_reviews": self.b.reviews}
                if self.metric == SATISFACTION
                else {}
            ),
            "effect": self.effect,
            "lower": self.lower,
            "upper": self.upper,
            "p_value": self.p_value,
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "alpha": self.alpha,
            "min_samples": self.min_samples,
        }


def one_sided_p_values(
    a: ArmCount, b: ArmCount, effect: npt.ArrayLike, mixture_scale: float
) -> tuple[FloatArray, FloatArray]:
    """Always-valid p-values that B's rate minus A's is above ``effect``, and below it
    (the canary's score statistic and normal-mixture SPRT, elementwise over ``effect``)."""
    z, variance = score_test(a.hits, a.samples, b.hits, b.samples, effect)
    above = always_valid_p_value(z, variance, mixture_scale)
    below = always_valid_p_value(-z, variance, mixture_scale)
    return above, below


def confidence_sequence(
    a: ArmCount, b: ArmCount, alpha: float, mixture_scale: float
) -> tuple[float, float]:
    """The differences (B - A) the two-sided test does not reject at ``alpha``: the
    confidence sequence's bounds on a grid of :data:`EFFECT_GRID_STEP` (-1..1 without
    data), widened by one step so the grid never narrows it."""
    if min(a.samples, b.samples) == 0:
        return -1.0, 1.0
    grid = np.round(np.arange(-1 + EFFECT_GRID_STEP, 1, EFFECT_GRID_STEP), 6)
    above, below = one_sided_p_values(a, b, grid, mixture_scale)
    kept = grid[(above > alpha / 2) & (below > alpha / 2)]
    if kept.size == 0:  # pragma: no cover - the estimate itself is never rejected
        estimate = (b.hits / b.samples) - (a.hits / a.samples)
        return estimate, estimate
    lower = max(-1.0, float(kept.min()) - EFFECT_GRID_STEP)
    upper = min(1.0, float(kept.max()) + EFFECT_GRID_STEP)
    return lower, upper


def judge_experiment(
    metric: ExperimentMetric, a: ArmCount, b: ArmCount, policy: ExperimentPolicy
) -> ExperimentLook:
    """The verdict on A against B from their counts so far: which arm is better on
    ``metric`` (the always-valid two-sided test at ``policy.alpha``), or not yet, or too
    few samples to say (fewer than ``policy.min_samples`` on an arm)."""
    for name, arm in (("A", a), ("B", b)):
        if arm.samples < 0 or not 0 <= arm.hits <= arm.samples:
            raise ValueError(f"arm {name}: {arm.hits} hits of {arm.samples} samples")
    effect = None if a.rate is None or b.rate is None else b.rate - a.rate
    lower, upper = confidence_sequence(a, b, policy.alpha, policy.mixture_scale)
    if min(a.samples, b.samples) == 0:
        p_value = 1.0
    else:
        above, below = one_sided_p_values(a, b, 0.0, policy.mixture_scale)
        p_value = float(min(1.0, 2 * min(float(above), float(below))))
    counts = f"A {a.hits}/{a.samples}, B {b.hits}/{b.samples}"
    if min(a.samples, b.samples) < policy.min_samples:
        reason = f"waiting for data: {counts} on {metric.name}, {policy.min_samples} needed per arm"
        verdict = Verdict.WAITING
    elif p_value <= policy.alpha:
        assert effect is not None
        b_higher = effect > 0
        verdict = Verdict.B_BETTER if b_higher == metric.higher_is_better else Verdict.A_BETTER
        better = "B" if verdict is Verdict.B_BETTER else "A"
        reason = (
            f"{better} is better on {metric.name} ({counts}; difference B-A {effect:+.3f}, "
            f"{_interval(lower, upper, policy)}); {sure(p_value)} sure "
            f"({sure(policy.alpha)} needed)"
        )
    else:
        shown = f"{effect:+.3f}" if effect is not None else "n/a"
        reason = (
            f"no difference shown yet on {metric.name} ({counts}; difference B-A {shown}, "
            f"{_interval(lower, upper, policy)}); {sure(p_value)} sure there is one, "
            f"{sure(policy.alpha)} needed"
        )
        verdict = Verdict.UNDECIDED
    return ExperimentLook(
        metric=metric.name,
        a=a,
        b=b,
        effect=effect,
        lower=lower,
        upper=upper,
        p_value=p_value,
        verdict=verdict,
        reasons=(reason,),
        alpha=policy.alpha,
        min_samples=policy.min_samples,
    )


def metric_named(name: str) -> str:
    """``name`` when an experiment can be judged on it (:data:`METRIC_NAMES`); ValueError
    naming the known ones otherwise."""
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown metric {name!r}; the metrics are {', '.join(METRIC_NAMES)}")
    return name


def judge_satisfaction(
    a: SatisfactionSample, b: SatisfactionSample, policy: ExperimentPolicy
) -> ExperimentLook:
    """The verdict on A against B on satisfaction estimated on every answer (PPI++ per arm,
    :func:`registry.ppi.estimate`): the same always-valid two-sided test and confidence
    sequence as the rates', on the difference of the two estimates with its variance;
    waiting until each arm has ``policy.min_reviews`` reviews."""
    reviews = (a.labelled, b.labelled)
    if min(reviews) < max(policy.min_reviews, 2):
        counts = (_satisfaction_count(a, None), _satisfaction_count(b, None))
        reason = (
            f"waiting for reviews: A {reviews[0]}, B {reviews[1]} reviewed answers, "
            f"{policy.min_reviews} needed per arm"
        )
        return ExperimentLook(
            SATISFACTION, *counts, None, -1.0, 1.0, 1.0, Verdict.WAITING, (reason,),
            policy.alpha, policy.min_reviews,
        )  # fmt: skip
    arms = (estimate(a), estimate(b))
    effect = arms[1].mean - arms[0].mean
    variance = arms[0].variance + arms[1].variance
    lower, upper = _satisfaction_sequence(effect, variance, policy)
    p_value = float(_two_sided_p(effect, variance, 0.0, policy.mixture_scale))
    numbers = (
        f"A {arms[0].mean:.3f} of {arms[0].answers} answers ({arms[0].reviews} reviewed), "
        f"B {arms[1].mean:.3f} of {arms[1].answers} ({arms[1].reviews} reviewed); "
        f"difference B-A {effect:+.3f}, {_interval(lower, upper, policy)}"
    )
    if p_value <= policy.alpha:
        verdict = Verdict.B_BETTER if effect > 0 else Verdict.A_BETTER
        better = "B" if verdict is Verdict.B_BETTER else "A"
        reason = (
            f"{better} satisfies more users ({numbers}); {sure(p_value)} sure "
            f"({sure(policy.alpha)} needed)"
        )
    else:
        verdict = Verdict.UNDECIDED
        reason = (
            f"no difference in satisfaction shown yet ({numbers}); {sure(p_value)} sure there is "
            f"one, {sure(policy.alpha)} needed"
        )
    return ExperimentLook(
        SATISFACTION,
        _satisfaction_count(a, arms[0]),
        _satisfaction_count(b, arms[1]),
        effect, lower, upper, p_value, verdict, (reason,), policy.alpha, policy.min_reviews,
    )  # fmt: skip


def _interval(lower: float, upper: float, policy: ExperimentPolicy) -> str:
    """The confidence sequence in words: valid at every look, not only this one."""
    return f"{sure(policy.alpha)} interval {lower:+.3f} to {upper:+.3f}, valid at every look"


def _satisfaction_count(sample: SatisfactionSample, arm: ArmEstimate | None) -> ArmCount:
    return ArmCount(
        sample.answers,
        int(sample.label_sum),
        estimate=arm.mean if arm is not None else None,
        reviews=sample.labelled,
    )


def _two_sided_p(
    effect: npt.ArrayLike, variance: float, null: npt.ArrayLike, mixture_scale: float
) -> FloatArray:
    """Twice the smaller one-sided always-valid p-value that the difference ``effect``
    (with ``variance``) is above / below ``null``, elementwise over ``null``."""
    z = (np.asarray(effect, dtype=np.float64) - np.asarray(null, dtype=np.float64)) / np.sqrt(
        variance
    )
    above = always_valid_p_value(z, variance, mixture_scale)
    below = always_valid_p_value(-z, variance, mixture_scale)
    return np.asarray(np.minimum(1.0, 2 * np.minimum(above, below)))


def _satisfaction_sequence(
    effect: float, variance: float, policy: ExperimentPolicy
) -> tuple[float, float]:
    """The satisfaction differences the two-sided test does not reject at ``alpha``."""
    if not variance > 0:
        return effect, effect
    grid = np.round(np.arange(-1 + EFFECT_GRID_STEP, 1, EFFECT_GRID_STEP), 6)
    kept = grid[
        np.asarray(_two_sided_p(effect, variance, grid, policy.mixture_scale)) > policy.alpha
    ]
    if kept.size == 0:  # pragma: no cover - the estimate itself is never rejected
        return effect, effect
    return (
        max(-1.0, float(kept.min()) - EFFECT_GRID_STEP),
        min(1.0, float(kept.max()) + EFFECT_GRID_STEP),
    )


def arm_reference(ref: str, business_line: str) -> int | Literal["base", "champion"]:
    """What an arm argument names: ``base``, ``champion``, or a registry version
    (``<line>-v<N>``, ``v<N>`` or ``<N>``); ValueError otherwise."""
    text = ref.strip()
    if text in ("base", "champion"):
        return "base" if text == "base" else "champion"
    parsed = parse_adapter_name(text)
    if parsed is not None:
        if parsed[0] != business_line:
            raise ValueError(f"{ref!r} is an adapter of {parsed[0]}, not of {business_line}")
        return parsed[1]
    digits = text.removeprefix("v")
    if digits.isdigit() and int(digits) >= 1:
        return int(digits)
    raise ValueError(
        f"arm {ref!r} is not 'base', 'champion' or a version ({adapter_name(business_line, 3)}, "
        "v3 or 3)"
    )


def start_refusal(table: RoutingTable) -> str | None:
    """Why an experiment cannot start on the line now (one rollout at a time), or None."""
    line = table.business_line
    if table.experiment is not None:
        return f"experiment {table.experiment.id} is already live on {line}"
    if table.canary is not None:
        return f"canary {table.canary} is live on {line} at {table.canary_fraction:.0%}"
    if table.shadow is not None:
        return f"shadow {table.shadow} is being judged on {line}"
    return None
