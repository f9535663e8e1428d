"""What an offline evaluation reports about one model (a candidate or the champion)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from flywheel.intervals import DEFAULT_CONFIDENCE, wilson_interval

# The metrics measured on the held-out pairs: what a gate on too few pairs does not judge.
PAIR_METRICS = frozenset({"preference_accuracy", "mean_margin"})


@dataclass(frozen=True, slots=True)
class GenerationSample:
    """One sample prompt, the model's greedy answer, and what the checks saw in it:
    ``pii_invented`` holds the types of ``pii_found`` whose value no answer the model was
    trained on holds (it made them up; empty where that was not checked)."""

    prompt: str
    answer: str
    refused: bool
    pii_found: tuple[str, ...] = ()
    canaries_found: tuple[str, ...] = ()
    pii_invented: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EvalReport:
    """Offline metrics of one model on one line's held-out data.

    ``preference_accuracy`` and ``mean_margin`` compare the log-probability of the
    chosen and the rejected answer of each held-out pair; losses are mean
    negative log-likelihood per answer token. ``pair_wins`` says, pair by pair
    in held-out order, whether the chosen answer scored above the rejected one
    (mean log-probability per token): what the gate's paired test compares.
    Reports written before it existed have none.
    """

    model: str
    pairs: int
    preference_accuracy: float | None
    mean_margin: float | None
    preferred_loss: float | None
    general_loss: float
    refusal_rate: float
    mean_answer_length: float
    pii_in_generations: int
    canaries_in_generations: int
    samples: tuple[GenerationSample, ...] = field(default=())
    pair_wins: tuple[bool, ...] = field(default=())

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """The numeric metrics, named for MLflow (``None`` ones left out)."""
        values = {
            "pairs": self.pairs,
            "preference_accuracy": self.preference_accuracy,
            "mean_margin": self.mean_margin,
            "preferred_loss": self.preferred_loss,
            "general_loss": self.general_loss,
            "refusal_rate": self.refusal_rate,
            "mean_answer_length": self.mean_answer_length,
            "pii_in_generations": self.pii_in_generations,
            "canaries_in_generations": self.canaries_in_generations,
        }
        return {f"{prefix}{k}": float(v) for k, v in values.items() if v is not None}

    def intervals(
        self, confidence: float = DEFAULT_CONFIDENCE
    ) -> dict[str, tuple[int, float, float]]:
        """``(n, low, high)`` of the metrics that are shares of a count, by Wilson score:
        preference accuracy over the held-out pairs, refusal rate over the generations."""
        found: dict[str, tuple[int, float, float]] = {}
        if self.preference_accuracy is not None and self.pairs > 0:
            right = (
                sum(self.pair_wins)
                if len(self.pair_wins) == self.pairs
                else round(self.preference_accuracy * self.pairs)
            )
            low, high = wilson_interval(right, self.pairs, confidence)
            found["preference_accuracy"] = (self.pairs, low, high)
        if self.samples:
            refused = sum(sample.refused for sample in self.samples)
            n = len(self.samples)
            low, high = wilson_interval(refused, n, confidence)
            found["refusal_rate"] = (n, low, high)
        return found

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class GateCheck:
    """One rule of the gate, its numbers, and whether it passed."""

    name: str
    passed: bool
    detail: str


# The gate verdicts that put a candidate on the canary.
GOES_TO_CANARY = frozenset({"promote", "left to canary"})


@dataclass(frozen=True, slots=True)
class GateDecision:
    """Whether a candidate may go to canary, with the reason for every check.

    ``not_judged`` says why the gate compared nothing (too few held-out pairs:
    ``"n=4 < 100"``): such a candidate is never promoted, and is shown as not
    judged rather than as a loss or a win on a handful of pairs. ``left_to_canary``
    says why such a candidate goes to the canary all the same (the recipe's
    ``gate.unjudged: canary``, every other check passed): the canary's blind reviews
    judge it on users, the gate having compared nothing.
    """

    promote: bool
    checks: tuple[GateCheck, ...]
    not_judged: str | None = None
    left_to_canary: str | None = None

    def __post_init__(self) -> None:
        if self.promote and self.not_judged is not None:
            raise ValueError("a gate that judged nothing cannot promote")
        if self.left_to_canary is not None and not self.promote:
            raise ValueError("a candidate left to the canary goes to the canary")

    @property
    def verdict(self) -> Literal["promote", "reject", "not judged", "left to canary"]:
        """``promote``, ``reject``, ``not judged`` or ``left to canary``."""
        if self.not_judged is not None:
            return "not judged"
        if self.left_to_canary is not None:
            return "left to canary"
        return "promote" if self.promote else "reject"

    @property
    def reasons(self) -> list[str]:
        """One readable line per check, failures first."""
        ordered = sorted(self.checks, key=lambda c: c.passed)
        return [f"{'PASS' if c.passed else 'FAIL'} {c.name}: {c.detail}" for c in ordered]

    @property
    def summary(self) -> str:
        """``promote``, ``reject`` with the failed checks named, or ``not judged`` and why."""
        if self.not_judged is not None:
            return f"not judged: {self.not_judged}"
        if self.left_to_canary is not None:
            return f"left to canary: {self.left_to_canary}"
        failed = [c.name for c in self.checks if not c.passed]
        return "promote" if self.promote else f"reject ({', '.join(failed)})"
