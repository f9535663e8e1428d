"""What the feedback page's review queue samples for human spot checks, and how (a recipe block)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ReviewedArm = Literal["canary", "champion", "experiment"]
_DEFAULT_SHARE: dict[ReviewedArm, float] = {"canary": 0.2, "champion": 0.02}
# Each A/B experiment arm's sampled share when the recipe names none: experiments judged on
# satisfaction need reviews of both arms.
DEFAULT_EXPERIMENT_SHARE = 0.1


class ReviewPolicy(BaseModel):
    """Human spot checks of a line's answers on the feedback page (the review queue).

    Reviewers get a sample of the canary's and the champion's answers, blind to the
    arm: each answer of an arm is in the sample with its ``share`` (the same answers
    whichever reviewer asks, by a hash of the request id); while a canary is live its
    queue does not run dry (more of its answers are drawn beyond the share). A verdict
    needs a reason from the ``rubric``; the pass rate per arm joins the canary's test
    (``min_reviews`` per arm before a promotion, ``margin``: the tolerated drop). Not
    part of the recipe's hash: it changes nothing about training.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    share: dict[ReviewedArm, float] = Field(
        default_factory=_DEFAULT_SHARE.copy,
        description="Share of each arm's answers sampled for review.",
    )
    rubric: tuple[str, ...] = Field(
        min_length=1,
        max_length=50,
        description="The reasons a reviewer picks from (for a pass or a fail).",
    )
    min_reviews: int = Field(default=0, ge=0, le=1_000_000)
    margin: float = Field(default=0.05, gt=0, lt=1)
    claim_s: float = Field(
        default=900,
        ge=10,
        le=86_400,
        description="How long an item handed to one reviewer is kept from the others.",
    )
    window_days: float = Field(
        default=7,
        gt=0,
        le=365,
        description="Answers this recent are sampled when no canary is live (with one: "
        "since its share last changed).",
    )

    @model_validator(mode="after")
    def _shares_and_reasons(self) -> ReviewPolicy:
        for arm, share in self.share.items():
            if not 0 <= share <= 1:
                raise ValueError(f"review share of {arm} must be in [0, 1], got {share}")
        for reason in self.rubric:
            if not reason.strip() or len(reason) > 200:
                raise ValueError(f"rubric reason {reason!r} must be 1-200 characters")
        if len(set(self.rubric)) != len(self.rubric):
            raise ValueError("rubric reasons must be distinct")
        return self

    def share_of(self, arm: str) -> float:
        """The sampled share of ``arm`` (``canary``, ``champion`` or ``experiment``, each arm
        of a live A/B experiment; 0 when not given, an experiment arm
        :data:`DEFAULT_EXPERIMENT_SHARE`)."""
        default = DEFAULT_EXPERIMENT_SHARE if arm == "experiment" else 0.0
        return next((value for name, value in self.share.items() if name == arm), default)
