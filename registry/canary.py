"""The online canary decision (pure): promote, roll back, or keep waiting.

Canary and champion are compared on the same window of gateway traffic, arm
against arm, on rates where higher is worse: thumbs-down, regenerate, edit and
error rates, plus p99 latency.

- **Roll back** as soon as one rate is significantly *worse* on the canary
  (one-sided two-proportion z-test, pooled variance) or its p99 latency is
  over the allowed ratio.
- **Promote** (or step up to the next canary share) once every rate is shown
  *non-inferior*: the canary's rate is below the champion's plus a margin
  (one-sided z-test of the difference against the margin).
- Otherwise **wait**; after ``max_looks`` looks without proof, roll back
  (an adapter that cannot show it is not worse does not get all the traffic).

Every look tests every rate, so the significance level is split over the
planned looks and the rates (Bonferroni: ``alpha / (max_looks * rates)`` per
test), which keeps the overall error rates at most ``alpha`` however often the
canary flow runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

RATES = ("thumbs_down", "regenerate", "edit", "error")


class CanaryPolicy(BaseModel):
    """How a canary is judged online (a recipe setting)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_requests: int = Field(default=200, ge=1, description="Per arm, before any decision.")
    alpha: float = Field(default=0.05, gt=0, lt=0.5, description="Over all looks.")
    max_looks: int = Field(default=48, ge=1, le=10_000)
    margins: dict[str, float] = Field(
        default_factory=lambda: {
            "thumbs_down": 0.03,
            "regenerate": 0.03,
            "edit": 0.03,
            "error": 0.01,
        },
        description="Largest tolerated rise of each rate (absolute) to call it non-inferior.",
    )
    max_p99_ratio: float = Field(default=1.5, ge=1.0, description="Canary p99 over champion p99.")
    p99_slack_ms: float = Field(default=50.0, ge=0, description="Latency noise always allowed.")


@dataclass(frozen=True, slots=True)
class ArmStats:
    """One arm's online numbers over a window."""

    adapter: str | None
    requests: int
    thumbs_down: int = 0
    regenerate: int = 0
    edit: int = 0
    error: int = 0
    p99_latency_ms: float | None = None

    def rate(self, name: str) -> float:
        """Events of kind ``name`` per request."""
        return getattr(self, name) / self.requests if self.requests else 0.0


class CanaryAction(StrEnum):
    """What the canary flow does next."""

    PROMOTE = "promote"
    ROLLBACK = "rollback"
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class MetricCheck:
    """One metric's comparison, with its numbers."""

    metric: str
    champion: float
    canary: float
    worse_p: float | None
    non_inferior_p: float | None
    verdict: str

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
    per_look_alpha: float


def _normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def worse_p_value(champion_hits: int, champion_n: int, canary_hits: int, canary_n: int) -> float:
    """One-sided p-value that the canary's rate is higher (pooled two-proportion z-test)."""
    pooled = (champion_hits + canary_hits) / (champion_n + canary_n)
    variance = pooled * (1 - pooled) * (1 / champion_n + 1 / canary_n)
    difference = canary_hits / canary_n - champion_hits / champion_n
    if variance == 0:
        return 0.0 if difference > 0 else 1.0
    return _normal_sf(difference / math.sqrt(variance))


def non_inferior_p_value(
    champion_hits: int, champion_n: int, canary_hits: int, canary_n: int, margin: float
) -> float:
    """One-sided p-value against "the canary is worse by ``margin`` or more" (Wald z-test of
    the difference; a small p means the canary is shown within the margin)."""
    p_champion = champion_hits / champion_n
    p_canary = canary_hits / canary_n
    # Half an event keeps the variance positive when a rate is 0 or 1 on small counts.
    floor_champion = min(max(p_champion, 0.5 / champion_n), 1 - 0.5 / champion_n)
    floor_canary = min(max(p_canary, 0.5 / canary_n), 1 - 0.5 / canary_n)
    variance = (
        floor_champion * (1 - floor_champion) / champion_n
        + floor_canary * (1 - floor_canary) / canary_n
    )
    z = (p_canary - p_champion - margin) / math.sqrt(variance)
    return 1 - _normal_sf(z)


def decide_canary(
    champion: ArmStats, canary: ArmStats, policy: CanaryPolicy, *, look: int
) -> CanaryDecision:
    """The decision at the ``look``-th check (1-based) of this canary."""
    per_look = policy.alpha / (policy.max_looks * len(RATES))
    if min(champion.requests, canary.requests) < policy.min_requests:
        reason = (
            f"waiting for data: {canary.requests} canary and {champion.requests} champion "
            f"requests, {policy.min_requests} needed per arm"
        )
        action = CanaryAction.WAIT
        if look >= policy.max_looks:
            action = CanaryAction.ROLLBACK
            reason = f"{reason}; out of looks ({look}/{policy.max_looks})"
        return CanaryDecision(action, (reason,), (), look, per_look)
    checks = [
        _rate_check(name, champion, canary, policy.margins.get(name, 0.0), per_look)
        for name in RATES
    ]
    checks.append(_latency_check(champion, canary, policy))
    worse = [c for c in checks if c.verdict == "WORSE"]
    if worse:
        return CanaryDecision(
            CanaryAction.ROLLBACK, tuple(str(c) for c in worse), tuple(checks), look, per_look
        )
    unproven = [c for c in checks if c.verdict == "UNPROVEN"]
    if not unproven:
        reasons = ("every metric is non-inferior on the canary",)
        return CanaryDecision(CanaryAction.PROMOTE, reasons, tuple(checks), look, per_look)
    reasons = tuple(str(c) for c in unproven)
    if look >= policy.max_looks:
        reasons = (*reasons, f"out of looks ({look}/{policy.max_looks}) without proof")
        return CanaryDecision(CanaryAction.ROLLBACK, reasons, tuple(checks), look, per_look)
    return CanaryDecision(CanaryAction.WAIT, reasons, tuple(checks), look, per_look)


def _rate_check(
    name: str, champion: ArmStats, canary: ArmStats, margin: float, per_look: float
) -> MetricCheck:
    args = (getattr(champion, name), champion.requests, getattr(canary, name), canary.requests)
    worse_p = worse_p_value(*args)
    non_inferior_p = non_inferior_p_value(*args, margin)
    if worse_p < per_look:
        verdict = "WORSE"
    elif non_inferior_p < per_look:
        verdict = "OK"
    else:
        verdict = "UNPROVEN"
    return MetricCheck(
        f"{name}_rate",
        champion.rate(name),
        canary.rate(name),
        worse_p,
        non_inferior_p,
        verdict,
    )


def _latency_check(champion: ArmStats, canary: ArmStats, policy: CanaryPolicy) -> MetricCheck:
    if champion.p99_latency_ms is None or canary.p99_latency_ms is None:
        return MetricCheck("p99_latency_ms", 0.0, 0.0, None, None, "OK")
    allowed = champion.p99_latency_ms * policy.max_p99_ratio + policy.p99_slack_ms
    verdict = "WORSE" if canary.p99_latency_ms > allowed else "OK"
    return MetricCheck(
        "p99_latency_ms", champion.p99_latency_ms, canary.p99_latency_ms, None, None, verdict
    )
