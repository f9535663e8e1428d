"""The shadow stage's decision (pure): advance the shadow to the canary, reject it, or wait.

A shadow adapter answers a sampled share of the line's requests after the user
got the champion's answer (``gateway.shadow``); no user sees it, so no user can
judge it. What the pairs can show is a candidate that is broken in a way users
would notice at once: it fails, it refuses what the champion answers, it puts
identifiers (e-mail, phone, card numbers) in its answers, or it answers far
longer or shorter. The shadow stage is a screen before the canary, whose
anytime-valid test on users' signals stays the real judge.

- **Reject** when the shadow is shown worse on one count: its error rate's
  Wilson lower bound is above ``max_error_rate``; it refuses (or leaks PII)
  more often than the champion on the same prompts, by the exact one-sided
  McNemar test on the discordant pairs (p at most ``alpha``) *and* by more than
  the count's margin; or the 95% interval of its mean length over the
  champion's lies wholly outside ``length_ratio_band``.
- **Wait** below ``min_pairs`` answered pairs, or while a count looks worse
  than its margin without proof; after ``max_pairs`` pairs without proof, reject
  (a candidate that cannot show it is not worse does not reach users).
- **Advance** otherwise: the candidate goes on the first canary share.

The tests are fixed-sample, each at ``alpha``: a look every few minutes spends
some of that (the canary's sequential test does not), which errs on the side of
stopping a candidate before users, not of letting one through. The length ratio's
interval is the delta method on the log of the ratio of paired means, with the
pairs' covariance. Satisfaction is not compared: users never see a shadow answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import StrEnum
from statistics import NormalDist, fmean
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from eval.paired import PairedComparison, binomial_upper_tail, compare_paired
from flywheel.intervals import wilson_interval
from flywheel.wording import sure

if TYPE_CHECKING:
    from feedback.shadow import ShadowPair
    from feedback.store import FeedbackStore
    from registry.routing import RoutingTable

CONFIDENCE = 0.95
Verdict = Literal["OK", "WORSE", "UNPROVEN"]


class ShadowPolicy(BaseModel):
    """The shadow stage of a line's rollout (a recipe setting: ``rollout.shadow``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fraction: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of the champion's requests a new candidate answers in shadow before "
        "its canary; 0: no shadow stage (the candidate goes straight to the canary).",
    )
    min_pairs: int = Field(default=100, ge=1, description="Answered pairs before a decision.")
    max_pairs: int = Field(
        default=2_000, ge=1, description="Pairs without proof either way before a rejection."
    )
    alpha: float = Field(default=0.05, gt=0, lt=0.5, description="Level of each test.")
    max_error_rate: float = Field(default=0.02, ge=0, lt=1)
    refusal_margin: float = Field(default=0.02, ge=0, lt=1)
    pii_margin: float = Field(default=0.01, ge=0, lt=1)
    length_ratio_band: tuple[float, float] = Field(
        default=(0.5, 2.0),
        description="Shadow mean output length over the champion's: outside, the answers changed "
        "too much in length.",
    )

    @model_validator(mode="after")
    def _sensible(self) -> ShadowPolicy:
        low, high = self.length_ratio_band
        if not 0 < low < 1 < high:
            raise ValueError("length_ratio_band must hold 1, e.g. [0.5, 2.0]")
        if self.max_pairs < self.min_pairs:
            raise ValueError("max_pairs must be at least min_pairs")
        return self


@dataclass(frozen=True, slots=True)
class PairedCount:
    """A yes/no reading of both answers of each pair (refusal, PII): the 2x2 margins."""

    champion: int
    shadow: int
    shadow_only: int
    champion_only: int
    p_value: float  # exact McNemar, one-sided: the shadow has it more often

    def difference(self, pairs: int) -> float:
        """Shadow rate minus champion rate."""
        return (self.shadow_only - self.champion_only) / pairs if pairs else 0.0


@dataclass(frozen=True, slots=True)
class ShadowReport:
    """A shadow adapter against the answers users got, on the same requests."""

    adapter: str
    attempts: int  # shadow answers asked for (errors included)
    errors: int
    pairs: int  # both answered
    champion_tokens_mean: float | None
    shadow_tokens_mean: float | None
    length_ratio: float | None
    length_ratio_low: float | None
    length_ratio_high: float | None
    refusals: PairedCount
    pii: PairedCount
    similarity_mean: float | None
    identical: int  # pairs whose answers have the same words
    confidence: float = CONFIDENCE

    @property
    def error_rate(self) -> float:
        """Shadow answers that failed, per answer asked for."""
        return self.errors / self.attempts if self.attempts else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (decision logs, ``--json``, the page)."""
        return asdict(self) | {"error_rate": self.error_rate}


@dataclass(frozen=True, slots=True)
class ShadowCheck:
    """One count's verdict, with its numbers."""

    metric: str
    champion: float | None
    shadow: float | None
    p_value: float | None
    verdict: Verdict
    why: str


class ShadowAction(StrEnum):
    """What the rollout does with the shadow."""

    ADVANCE = "advance"
    REJECT = "reject"
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class ShadowDecision:
    """The action and why, with each count's verdict."""

    action: ShadowAction
    reasons: tuple[str, ...]
    checks: tuple[ShadowCheck, ...] = ()


def _paired(champion: Sequence[bool], shadow: Sequence[bool]) -> PairedCount:
    shadow_only = sum(s and not c for c, s in zip(champion, shadow, strict=True))
    champion_only = sum(c and not s for c, s in zip(champion, shadow, strict=True))
    discordant = shadow_only + champion_only
    return PairedCount(
        champion=sum(champion),
        shadow=sum(shadow),
        shadow_only=shadow_only,
        champion_only=champion_only,
        p_value=binomial_upper_tail(shadow_only, discordant) if discordant else 1.0,
    )


def length_ratio_interval(
    champion: Sequence[float], shadow: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """The interval of mean(shadow) / mean(champion) over paired lengths: the delta method on
    the log of the ratio, with the pairs' covariance. None below two pairs or a zero mean."""
    n = len(champion)
    if n < 2 or len(shadow) != n:
        return None
    mean_c, mean_s = fmean(champion), fmean(shadow)
    if mean_c <= 0 or mean_s <= 0:
        return None
    var_c = sum((x - mean_c) ** 2 for x in champion) / (n - 1)
    var_s = sum((y - mean_s) ** 2 for y in shadow) / (n - 1)
    cov = sum((x - mean_c) * (y - mean_s) for x, y in zip(champion, shadow, strict=True)) / (n - 1)
    variance = (var_s / mean_s**2 + var_c / mean_c**2 - 2 * cov / (mean_s * mean_c)) / n
    spread = NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(max(variance, 0.0))
    centre = math.log(mean_s / mean_c)
    return math.exp(centre - spread), math.exp(centre + spread)


def compare_shadow(
    adapter: str, pairs: Sequence[ShadowPair], *, confidence: float = CONFIDENCE
) -> ShadowReport:
    """The shadow's numbers against the champion's over ``pairs`` (pure)."""
    answered = [p for p in pairs if p.shadow_ok]
    champion_tokens = [float(p.champion_tokens) for p in answered]
    shadow_tokens = [float(p.shadow_tokens) for p in answered]
    mean_c = fmean(champion_tokens) if answered else None
    mean_s = fmean(shadow_tokens) if answered else None
    ratio = mean_s / mean_c if mean_c and mean_s is not None else None
    interval = length_ratio_interval(champion_tokens, shadow_tokens, confidence)
    return ShadowReport(
        adapter=adapter,
        attempts=len(pairs),
        errors=len(pairs) - len(answered),
        pairs=len(answered),
        champion_tokens_mean=mean_c,
        shadow_tokens_mean=mean_s,
        length_ratio=ratio,
        length_ratio_low=interval[0] if interval else None,
        length_ratio_high=interval[1] if interval else None,
        refusals=_paired(
            [p.champion_refused for p in answered], [p.shadow_refused for p in answered]
        ),
        pii=_paired([p.champion_pii for p in answered], [p.shadow_pii for p in answered]),
        similarity_mean=fmean(p.similarity for p in answered) if answered else None,
        identical=sum(p.similarity >= 1.0 for p in answered),
        confidence=confidence,
    )


def _error_check(report: ShadowReport, policy: ShadowPolicy) -> ShadowCheck:
    rate = report.error_rate
    low, _ = wilson_interval(report.errors, report.attempts, 1 - 2 * policy.alpha)
    numbers = f"{report.errors} of {report.attempts} shadow answers failed ({rate:.1%})"
    if low > policy.max_error_rate:
        verdict: Verdict = "WORSE"
        why = (
            f"{numbers}: more than the {policy.max_error_rate:.1%} allowed, "
            f"{1 - policy.alpha:.0%} sure (at least {low:.1%})"
        )
    elif rate > policy.max_error_rate:
        verdict = "UNPROVEN"
        why = f"{numbers}: over the {policy.max_error_rate:.1%} allowed, not sure yet"
    else:
        verdict, why = "OK", numbers
    return ShadowCheck("error_rate", 0.0, rate, None, verdict, why)


def _count_check(
    name: str, count: PairedCount, pairs: int, margin: float, alpha: float
) -> ShadowCheck:
    champion, shadow = count.champion / pairs, count.shadow / pairs
    difference = count.difference(pairs)
    numbers = (
        f"{name}: shadow {shadow:.1%} vs champion {champion:.1%} on {pairs} pairs "
        f"({count.shadow_only} only the shadow, {count.champion_only} only the champion)"
    )
    certainty = f"{sure(count.p_value)} sure the shadow does it more often ({sure(alpha)} needed)"
    if difference > margin and count.p_value <= alpha:
        verdict: Verdict = "WORSE"
        why = f"{numbers}: {difference:+.1%}, over the {margin:.1%} allowed; {certainty}"
    elif difference > margin:
        verdict = "UNPROVEN"
        why = f"{numbers}: {difference:+.1%}, over the {margin:.1%} allowed; {certainty}"
    else:
        verdict, why = "OK", numbers
    return ShadowCheck(name, champion, shadow, count.p_value, verdict, why)


def _length_check(report: ShadowReport, policy: ShadowPolicy) -> ShadowCheck:
    low_band, high_band = policy.length_ratio_band
    ratio, low, high = report.length_ratio, report.length_ratio_low, report.length_ratio_high
    champion, shadow = report.champion_tokens_mean, report.shadow_tokens_mean
    if ratio is None or low is None or high is None:
        why = "length ratio: not measurable (too few pairs or empty answers)"
        return ShadowCheck("length_ratio", champion, shadow, None, "UNPROVEN", why)
    numbers = (
        f"length: shadow {shadow:.1f} vs champion {champion:.1f} tokens, ratio {ratio:.2f} "
        f"({report.confidence:.0%} interval {low:.2f} to {high:.2f}; allowed {low_band:g} to "
        f"{high_band:g})"
    )
    if high < low_band or low > high_band:
        return ShadowCheck("length_ratio", champion, shadow, None, "WORSE", numbers)
    if not low_band <= ratio <= high_band:
        return ShadowCheck("length_ratio", champion, shadow, None, "UNPROVEN", numbers)
    return ShadowCheck("length_ratio", champion, shadow, None, "OK", numbers)


def _checks(report: ShadowReport, policy: ShadowPolicy) -> list[ShadowCheck]:
    """The counts there are enough data for: errors from ``min_pairs`` answers asked for,
    the rest from ``min_pairs`` answered pairs."""
    checks = []
    if report.attempts >= policy.min_pairs:
        checks.append(_error_check(report, policy))
    if report.pairs >= policy.min_pairs:
        alpha = policy.alpha
        checks += [
            _count_check("refusal", report.refusals, report.pairs, policy.refusal_margin, alpha),
            _count_check("pii", report.pii, report.pairs, policy.pii_margin, alpha),
            _length_check(report, policy),
        ]
    return checks


def judge_shadow(report: ShadowReport, policy: ShadowPolicy) -> ShadowDecision:
    """Advance the shadow to the canary, reject it, or wait (see the module's rules)."""
    if report.attempts == 0:
        return ShadowDecision(ShadowAction.WAIT, ("no shadow answers yet",))
    checks = _checks(report, policy)
    worse = [c.why for c in checks if c.verdict == "WORSE"]
    if worse:
        return ShadowDecision(ShadowAction.REJECT, tuple(worse), tuple(checks))
    pairs = f"{report.pairs} answered pairs, {report.errors} errors"
    if report.pairs < policy.min_pairs:
        reason = f"waiting for data: {pairs}, {policy.min_pairs} pairs needed"
        return ShadowDecision(ShadowAction.WAIT, (reason,), tuple(checks))
    unproven = tuple(c.why for c in checks if c.verdict == "UNPROVEN")
    if unproven and report.pairs >= policy.max_pairs:
        out = f"not sure either way after {report.pairs} pairs (at most {policy.max_pairs})"
        return ShadowDecision(ShadowAction.REJECT, (*unproven, out), tuple(checks))
    if unproven:
        return ShadowDecision(ShadowAction.WAIT, unproven, tuple(checks))
    reason = f"no count worse than the champion's on {pairs}; on to the canary"
    return ShadowDecision(ShadowAction.ADVANCE, (reason,), tuple(checks))


def shadow_satisfaction(
    champion_satisfied: Sequence[bool],
    shadow_satisfied: Sequence[bool],
    *,
    confidence: float = CONFIDENCE,
) -> PairedComparison:
    """How often a judge (simulated users' ``satisfied()``, reviewers) is satisfied by the
    shadow's answer against the champion's on the same prompts: the paired difference with
    Newcombe's interval and the exact one-sided McNemar p-value that the shadow satisfies
    more often (``eval.paired``)."""
    return compare_paired(shadow_satisfied, champion_satisfied, confidence=confidence)


def shadow_report(
    store: FeedbackStore, table: RoutingTable, history: Sequence[Any], until: datetime
) -> ShadowReport:
    """The line's shadow against its champion since the shadow started answering."""
    from feedback.shadow import shadow_pairs
    from registry.lifecycle import shadow_since

    assert table.shadow is not None
    since = shadow_since(history, table) or datetime.min.replace(tzinfo=UTC)
    pairs = shadow_pairs(store.engine, table.business_line, table.shadow, since, until)
    return compare_shadow(table.shadow, pairs)
