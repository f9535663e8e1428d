"""How often simulated users say something, and what: feedback profiles.

A profile gives, for a satisfied and for an unsatisfied user, the probability of
each signal (:data:`SIGNALS`); the rest of the answers draw no signal at all.
What the user thinks of the answer is decided by the user model from the answer
itself; the profile only says how often that opinion is voiced.

- ``realistic`` (the default): the rates real products report. Thumbs on a few
  percent of answers (at most 5%), written corrections on under 1%, implicit
  signals (regenerate, abandon) more often than explicit ones and mostly on bad
  answers; about nine answers in ten are silent.
- ``dense``: the chatty users the loop was first measured with (a quarter of the
  satisfied give a thumbs-up, one unhappy user in seven edits the answer).
- ``no_edits``: ``realistic`` on a product that offers no way to edit an answer.

A profile can also be a YAML or JSON file with ``satisfied`` and ``unsatisfied``
mappings (and an optional ``name``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from flywheel.errors import InputFileError, UsageError
from flywheel.user_files import read_user_text
from lab.simulation.protocol import REACTION_TYPES

# The signals a profile can give: every reaction but saying nothing.
SIGNALS: tuple[str, ...] = tuple(t for t in REACTION_TYPES if t != "none")
DEFAULT_PROFILE = "realistic"
# A profile is a few rates: a larger file is not one.
MAX_PROFILE_BYTES = 64 * 1024


class FeedbackProfileError(UsageError):
    """A ``--feedback`` value that names no profile or holds rates that cannot be."""


class FeedbackProfile(BaseModel):
    """Each signal's probability for a satisfied and for an unsatisfied user."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    satisfied: dict[str, float]
    unsatisfied: dict[str, float]

    @field_validator("satisfied", "unsatisfied")
    @classmethod
    def _rates_of_known_signals(cls, rates: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(rates) - set(SIGNALS))
        if unknown:
            raise ValueError(f"unknown signals {unknown}; the signals are {list(SIGNALS)}")
        for signal, rate in rates.items():
            if not (isinstance(rate, int | float) and math.isfinite(rate) and 0 <= rate <= 1):
                raise ValueError(f"the rate of {signal} must be in [0, 1], got {rate!r}")
        total = math.fsum(rates.values())
        if total > 1 + 1e-9:
            raise ValueError(f"the rates sum to {total:.4g}, over 1")
        return rates

    def rates(self, happy: bool) -> Mapping[str, float]:
        """The signals' probabilities for a satisfied (``happy``) or an unsatisfied user."""
        return MappingProxyType(self.satisfied if happy else self.unsatisfied)

    def silent_share(self, happy: bool) -> float:
        """The share of answers that draw no signal."""
        return max(0.0, 1 - math.fsum(self.rates(happy).values()))

    def draw(self, happy: bool, uniform: float) -> str:
        """The signal a uniform draw in [0, 1) picks, or ``"none"``."""
        for signal, probability in self.rates(happy).items():
            if uniform < probability:
                return signal
            uniform -= probability
        return "none"

    def describe(self) -> str:
        """One line for a run's header: the thumbs and edit rates and the silence."""
        happy, unhappy = self.rates(True), self.rates(False)
        thumbs = (
            happy.get("thumbs_up", 0) + happy.get("thumbs_down", 0),
            unhappy.get("thumbs_up", 0) + unhappy.get("thumbs_down", 0),
        )
        return (
            f"feedback profile {self.name} (thumbs on {thumbs[0]:.1%} of satisfied / "
            f"{thumbs[1]:.1%} of unsatisfied answers, edits on {unhappy.get('edit', 0):.1%} "
            f"of unsatisfied; silent {self.silent_share(True):.0%} / "
            f"{self.silent_share(False):.0%})"
        )


# What products report: thumbs on a few percent of answers, corrections on under 1%, and
# implicit signals (regenerate, abandon) more often than explicit ones, mostly on bad answers.
_REALISTIC_SATISFIED = {
    "thumbs_up": 0.035,
    "thumbs_down": 0.003,
    "regenerate": 0.01,
    "abandon": 0.01,
    "task_success": 0.03,
    "task_failure": 0.005,
}
_REALISTIC_UNSATISFIED = {
    "thumbs_down": 0.04,
    "thumbs_up": 0.003,
    "edit": 0.01,
    "regenerate": 0.06,
    "abandon": 0.04,
    "task_failure": 0.03,
    "task_success": 0.005,
}
PROFILES: Mapping[str, FeedbackProfile] = MappingProxyType(
    {
        "realistic": FeedbackProfile(
            name="realistic", satisfied=_REALISTIC_SATISFIED, unsatisfied=_REALISTIC_UNSATISFIED
        ),
        "dense": FeedbackProfile(
            name="dense",
            satisfied={"thumbs_up": 0.25, "task_success": 0.10, "thumbs_down": 0.02},
            unsatisfied={
                "edit": 0.14,
                "thumbs_down": 0.13,
                "regenerate": 0.10,
                "abandon": 0.05,
                "task_failure": 0.05,
                "thumbs_up": 0.02,
            },
        ),
        "no_edits": FeedbackProfile(
            name="no_edits",
            satisfied=_REALISTIC_SATISFIED,
            unsatisfied={k: v for k, v in _REALISTIC_UNSATISFIED.items() if k != "edit"},
        ),
    }
)


def profile_from_mapping(raw: Any, source: str) -> FeedbackProfile:
    """A profile from a parsed mapping; errors name ``source`` and the field."""
    if not isinstance(raw, dict):
        raise FeedbackProfileError(
            f"--feedback {source}: expected a mapping with 'satisfied' and 'unsatisfied' rates"
        )
    try:
        return FeedbackProfile.model_validate({"name": source, **raw})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors()
        )
        raise FeedbackProfileError(f"--feedback {source}: {problems}") from None


def load_profile(spec: str | None) -> FeedbackProfile:
    """The profile ``spec`` names: a built-in name (None: :data:`DEFAULT_PROFILE`), or a
    YAML or JSON file."""
    spec = spec or DEFAULT_PROFILE
    if spec in PROFILES:
        return PROFILES[spec]
    path = Path(spec)
    if path.suffix not in {".yaml", ".yml", ".json"}:
        raise FeedbackProfileError(
            f"--feedback {spec}: not a profile name ({', '.join(PROFILES)}) nor a .yaml/.json file"
        )
    try:
        text = read_user_text(path, max_bytes=MAX_PROFILE_BYTES, what="profile (a few rates)")
    except InputFileError as exc:
        raise FeedbackProfileError(f"--feedback {exc}") from None
    try:
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise FeedbackProfileError(
            f"--feedback {spec}: not valid {path.suffix[1:]}: {exc}"
        ) from None
    return profile_from_mapping(raw, spec)
