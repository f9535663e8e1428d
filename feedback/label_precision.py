"""How often a user's unedited verdict is right, from the line's reviewed satisfaction.

A thumbs-up on an answer is evidence that it satisfied, not proof: users misclick,
like a polite answer that did not help, or mark a task done that was not. By Bayes'
rule the chance a positive verdict is right is

    odds(satisfied | signal) = odds(satisfied) * LR ** weight

where ``odds(satisfied)`` is the line's prior (how many of its answers satisfy),
``LR`` how many times likelier a satisfied user gives a full-strength signal, and the
signal's weight scales its evidence (a regenerate says less than a thumb). A
negative verdict is judged the same way against ``odds(unsatisfied)``.

The prior comes from the blind reviews, the one random sample of answers: the
reviewed pass rate, corrected for the reviewers' own error ``e`` (a pass rate
``p`` means ``(p - e) / (1 - 2e)`` satisfied), per model version where it has
enough reviews, else over the window. Judged conservatively: positives at the low end
of its interval, negatives at the high end. A reviewer's own verdict is evidence
``(1 - e) / e``.

At realistic rates this is the difference between learning and not: on a line
whose base model satisfies 1% of users, a thumbs-up is right about one time in ten
(docs/results/2026-12-05-realistic-loop-labels.md found 0 of 5), and training on
those undid what the users' edits taught (docs/results/2026-12-05-positive-noise.md).
Once a champion satisfies half its users, the same thumb is right nine times in ten
and joins the training set.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from feedback.records import FeedbackRecord
from flywheel.intervals import wilson_interval
from flywheel.settings.cleaning import LabelPrecisionSettings

# The satisfaction interval of the window as a whole, beside the per-version ones.
WINDOW = "*"
# Rules of the examples reviewers' verdicts labelled; the satisfaction model never learns
# from them (eval.satisfaction_model.labelled_answers): they rectify its estimates online.
REVIEW_RULE_PREFIX = "review_"


@dataclass(frozen=True, slots=True)
class SatisfactionPrior:
    """How many answers of one model version (or of the window) satisfy, from ``reviews``
    blind verdicts of which ``passes`` passed, corrected for the reviewers' error."""

    reviews: int
    passes: int
    low: float
    high: float

    def as_dict(self) -> dict[str, float | int]:
        """JSON-ready, for the dataset's manifest."""
        return {
            "reviews": self.reviews,
            "passes": self.passes,
            "low": round(self.low, 4),
            "high": round(self.high, 4),
        }


def satisfaction_prior(
    passes: int, reviews: int, settings: LabelPrecisionSettings
) -> SatisfactionPrior:
    """The satisfied share's interval from ``passes`` of ``reviews`` blind verdicts: the
    Wilson interval of the pass rate, each end corrected for the reviewers' error."""
    low, high = wilson_interval(passes, reviews, settings.confidence)
    error = settings.review_error

    def corrected(rate: float) -> float:
        return min(1.0, max(0.0, (rate - error) / (1 - 2 * error)))

    return SatisfactionPrior(reviews, passes, corrected(low), corrected(high))


def signal_precision(
    liked: bool, prior: float, likelihood_ratio: float, weight: float = 1.0
) -> float:
    """The chance a verdict is right: ``liked`` (satisfied) given a line where ``prior`` of
    answers satisfy, the signal ``likelihood_ratio ** weight`` times likelier on an answer
    that earns it."""
    base = prior if liked else 1.0 - prior
    if base <= 0.0:
        return 0.0
    if base >= 1.0:
        return 1.0
    log_odds = math.log(base / (1.0 - base)) + weight * math.log(likelihood_ratio)
    return 1.0 / (1.0 + math.exp(-log_odds))


def review_likelihood_ratio(settings: LabelPrecisionSettings) -> float:
    """A reviewer's verdict as evidence: right ``1 - e`` of the time, wrong ``e``."""
    error = max(settings.review_error, 1e-6)
    return (1.0 - error) / error


@dataclass(frozen=True, slots=True)
class LabelEvidence:
    """The window's satisfaction priors by model version, and the precision of a verdict."""

    settings: LabelPrecisionSettings
    priors: dict[str, SatisfactionPrior] = field(default_factory=dict)

    def prior_for(self, version: str) -> SatisfactionPrior | None:
        """The version's own prior with enough reviews, else the window's, else None."""
        for key in (version, WINDOW):
            found = self.priors.get(key)
            if found is not None and found.reviews >= self.settings.min_reviews:
                return found
        return None

    def precision(self, version: str, liked: bool, signal: str, weight: float) -> float | None:
        """The chance a verdict (``signal`` of strength ``weight``) on an answer of
        ``version`` is right, judged at the conservative end of the prior; None where no
        prior is known."""
        prior = self.prior_for(version)
        if prior is None:
            return None
        if signal.startswith(REVIEW_RULE_PREFIX):
            ratio, weight = review_likelihood_ratio(self.settings), 1.0
        else:
            ratio = self.settings.likelihood_ratio
        return signal_precision(liked, prior.low if liked else prior.high, ratio, weight)

    def admit(self, version: str, liked: bool, signal: str, weight: float) -> tuple[bool, float]:
        """Whether the verdict joins training, and the weight it then carries (its signal's
        weight times its precision; unchanged where the precision is unknown). Edits and
        rankings never come here: they are not verdicts."""
        precision = self.precision(version, liked, signal, weight)
        if precision is None:
            return not (liked and self.settings.without_reviews == "hold"), weight
        if precision < self.settings.min_precision:
            return False, weight
        return True, weight * precision

    def as_dict(self) -> dict[str, dict[str, float | int]]:
        """The priors, JSON-ready (the dataset's manifest records what judged its labels)."""
        return {version: prior.as_dict() for version, prior in sorted(self.priors.items())}


def label_evidence(
    records: Sequence[FeedbackRecord],
    settings: LabelPrecisionSettings,
    version_of: Callable[[FeedbackRecord], str],
    reviewed: Callable[[FeedbackRecord], bool | None],
) -> LabelEvidence:
    """The satisfaction priors of a window's records, by model version (``version_of``) and
    for the window, from their blind review verdicts (``reviewed``: passed, or None)."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for record in records:
        verdict = reviewed(record)
        if verdict is None:
            continue
        for key in (version_of(record), WINDOW):
            counts[key][0] += int(verdict)
            counts[key][1] += 1
    priors = {
        key: satisfaction_prior(passes, total, settings) for key, (passes, total) in counts.items()
    }
    return LabelEvidence(settings, priors)
