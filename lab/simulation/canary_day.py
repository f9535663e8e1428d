"""The loop's canary at its true share, simulated by the numbers: a 5% share of each look's
users, quiet users speaking at a feedback profile's rates (the guardrails), blind reviewers
checking each arm's review share with some of their verdicts wrong, and the product's
``decide_canary`` at every look. No satisfaction model (reviews alone): a line's first canary.
Used by the canary tests and ``lab/bench/canary_first_day_bench.py``."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import numpy as np

from feedback.events import ONLINE_SIGNALS
from lab.simulation.feedback_profiles import PROFILES
from registry.canary import ArmStats, CanaryAction, CanaryPolicy, decide_canary
from registry.ppi import SatisfactionSample

# One look of the loop: its six looks a day of about 1,500 requests.
DAY_PART = 250
LOOKS_A_DAY = 6
SHARE = 0.05
REVIEW_NOISE = 0.1
# The signals the canary counts as an answer's dissatisfied user.
NEGATIVE = tuple(signal.value for signal in ONLINE_SIGNALS)


@dataclass(frozen=True)
class ShareOutcome:
    """How one simulated canary ended: its action, at which look, and whether a rollback
    showed it worse (rather than running out of looks)."""

    action: str
    look: int
    shown_worse: bool


def share_canary(
    policy: CanaryPolicy,
    review_shares: dict[str, float],
    champion: float,
    canary: float,
    seed: int,
    *,
    profile: str = "realistic",
) -> ShareOutcome:
    """One canary whose users are satisfied at ``canary`` against the champion's
    ``champion``, looked at up to ``policy.max_looks`` times, until the first decision."""
    rates = PROFILES[profile]
    rng = random.Random(seed)
    satisfied = {"champion": champion, "canary": canary}
    counts = {arm: Counter[str]() for arm in satisfied}
    verdicts: dict[str, list[float]] = {arm: [] for arm in satisfied}
    for look in range(1, policy.max_looks + 1):
        for _ in range(DAY_PART):
            arm = "canary" if rng.random() < SHARE else "champion"
            happy = rng.random() < satisfied[arm]
            counts[arm]["requests"] += 1
            kind = rates.draw(happy, rng.random())
            if kind in NEGATIVE:
                counts[arm][kind] += 1
                counts[arm]["dissatisfied"] += 1
            if rng.random() < review_shares[arm]:
                verdicts[arm].append(float(happy != (rng.random() < REVIEW_NOISE)))
        arms = []
        for arm in ("champion", "canary"):
            reviewed = np.array(verdicts[arm])
            sample = SatisfactionSample.of(
                np.zeros(counts[arm]["requests"] - reviewed.size), np.zeros(reviewed.size), reviewed
            )
            arms.append(ArmStats(arm, **counts[arm], satisfaction=sample))
        decision = decide_canary(arms[0], arms[1], policy, look=look)
        if decision.action is not CanaryAction.WAIT:
            worse = any(c.verdict == "WORSE" for c in decision.checks)
            worse |= decision.combined_worse_p <= policy.alpha
            return ShareOutcome(decision.action.value, look, worse)
    raise AssertionError("the last look always decides")
