"""Training recipes: one typed YAML file per business line.

A recipe says how a line's adapter is trained (method, LoRA shape, schedule),
how much new data it needs first, and the gate policy its candidates must pass.
Unknown keys are refused so a typo cannot silently fall back to a default;
a test parses every recipe in the repository.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from feedback.events import BUSINESS_LINE
from flywheel.errors import FlywheelError
from registry.canary import CanaryPolicy, ReviewTest
from registry.lifecycle import RolloutPolicy

# Modules vLLM can serve LoRA on for Llama-style models (see --lora-target-modules).
SERVABLE_MODULES = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
)


class LoraShape(BaseModel):
    """The adapter's shape: it must fit the serving vLLM's ``--max-lora-rank``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(default=16, ge=1, le=256)
    alpha: int = Field(default=32, ge=1, le=1024)
    dropout: float = Field(default=0.05, ge=0, lt=1)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    @model_validator(mode="after")
    def _servable(self) -> LoraShape:
        unknown = set(self.target_modules) - SERVABLE_MODULES
        if unknown:
            raise ValueError(
                f"target_modules {sorted(unknown)} cannot be served by vLLM; "
                f"choose from {sorted(SERVABLE_MODULES)}"
            )
        return self


class GatePolicy(BaseModel):
    """What a candidate must show against the champion before it may serve users.

    Preference accuracy is judged by a paired test on the held-out pairs both
    models answered (:mod:`eval.paired`), never on point estimates alone:
    ``superior`` needs the exact McNemar one-sided p-value below ``alpha`` and
    a gain of at least ``min_preference_gain``; ``non_inferior`` needs the
    lower bound of the (1 - ``alpha``) interval of the difference above
    ``-non_inferiority_margin``. Fewer than ``min_eval_pairs`` pairs decide nothing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    preference_test: Literal["superior", "non_inferior"] = Field(
        default="superior",
        description="superior: must beat the champion; non_inferior: must not be worse.",
    )
    alpha: float = Field(
        default=0.05, gt=0, le=0.5, description="Error rate of the paired preference test."
    )
    non_inferiority_margin: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Largest accuracy loss non_inferior tolerates (lower bound > -margin).",
    )
    min_preference_gain: float = Field(
        default=0.0,
        ge=-1,
        le=1,
        description="Held-out preference accuracy gain over the champion (superior test).",
    )
    min_margin_gain: float | None = Field(
        default=None,
        ge=-100,
        le=100,
        description="Mean margin gain over the champion (a point estimate: off unless set; "
        "the paired accuracy test is the decision with its uncertainty).",
    )
    max_preferred_loss_increase: float = Field(
        default=0.05, ge=0, le=10, description="Relative increase of loss on preferred answers."
    )
    max_general_loss_increase: float = Field(
        default=0.10, ge=0, le=10, description="Relative increase of loss on the fixed general set."
    )
    max_refusal_rate_increase: float = Field(default=0.10, ge=0, le=1)
    max_length_ratio: float = Field(default=2.0, ge=1, le=100)
    min_length_ratio: float = Field(default=0.3, gt=0, le=1)
    min_eval_pairs: int = Field(
        default=50,
        ge=1,
        le=1_000_000,
        description="Held-out pairs needed before the gate decides anything.",
    )
    allow_pii_in_generations: bool = False


class RetentionPolicy(BaseModel):
    """How long a line keeps raw prompts and answers in the store (``flywheel retention``).

    Older rows keep only their scrubbed text (``scrub``: PII replaced by placeholders,
    the row and its feedback kept for counts and lineage) or go entirely (``delete``: the
    interaction with its feedback and shadow answers; datasets keep their scrubbed
    examples, whose lineage then names requests no longer stored). Not part of the
    recipe's hash: it changes nothing about training.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    raw_days: float = Field(
        default=30, gt=0, le=3_650, description="Days raw text is kept before the action."
    )
    action: Literal["scrub", "delete"] = "scrub"


ReviewedArm = Literal["canary", "champion"]
_DEFAULT_SHARE: dict[ReviewedArm, float] = {"canary": 0.2, "champion": 0.02}


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
        """The sampled share of ``arm`` (``canary`` or ``champion``; 0 when not given)."""
        return next((value for name, value in self.share.items() if name == arm), 0.0)


class Recipe(BaseModel):
    """How one business line's adapter is trained and judged."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    business_line: str = Field(pattern=BUSINESS_LINE)
    method: Literal["sft", "dpo", "kto"]
    kto_below_pairs: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="DPO recipes: when the training set holds fewer preference pairs than "
        "this and more labelled answers (KTO examples: liked or disliked, unpaired), train "
        "KTO on those instead; users give thumbs far more often than two answers to compare.",
    )
    lora: LoraShape = Field(default_factory=LoraShape)
    learning_rate: float = Field(default=2e-4, gt=0, le=1)
    epochs: float | None = Field(default=None, gt=0, le=100)
    max_steps: int | None = Field(default=None, ge=1, le=1_000_000)
    batch_size: int = Field(default=4, ge=1, le=1024)
    gradient_accumulation: int = Field(default=1, ge=1, le=1024)
    max_length: int = Field(default=512, ge=32, le=32_768)
    beta: float = Field(default=0.1, gt=0, le=10, description="DPO / KTO temperature.")
    sft_weight: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="DPO only: weight of an added SFT loss on the chosen answers (RPO).",
    )
    history_days: float = Field(
        default=0.0,
        ge=0,
        le=3_650,
        description="Train on every dataset of the line from this many days back (0: the "
        "night's window only); held-out examples of any of them are never trained on.",
    )
    half_life_days: float = Field(
        default=7.0, gt=0, le=3_650, description="An accumulated example's weight halves so."
    )
    start_from: Literal["base", "champion"] = Field(
        default="base",
        description="Train a fresh adapter on the base model, or continue the champion's "
        "adapter (its LoRA shape wins).",
    )
    copies_per_weight: float = Field(
        default=2.0,
        ge=1,
        le=10,
        description="Expected copies of an example in training per unit of its signal weight "
        "(edits and thumbs weigh 1, regenerates 0.5, abandons 0.25).",
    )
    min_new_examples: int = Field(default=1_000, ge=1, le=100_000_000)
    eval_generations: int = Field(default=8, ge=0, le=1_000)
    seed: int = 0
    gate: GatePolicy = Field(default_factory=GatePolicy)
    canary_steps: tuple[float, ...] = Field(default=(0.05, 0.25, 0.5, 1.0), min_length=1)
    canary: CanaryPolicy = Field(default_factory=CanaryPolicy)
    rollout: RolloutPolicy = Field(default_factory=RolloutPolicy)
    retention: RetentionPolicy = Field(default_factory=RetentionPolicy)
    review: ReviewPolicy | None = None

    @model_validator(mode="after")
    def _schedule(self) -> Recipe:
        if (self.epochs is None) == (self.max_steps is None):
            raise ValueError("set exactly one of 'epochs' and 'max_steps'")
        steps = list(self.canary_steps)
        if steps != sorted(steps) or not 0 < steps[0] <= steps[-1] <= 1:
            raise ValueError("canary_steps must rise within (0, 1], e.g. [0.05, 0.25, 1.0]")
        return self

    def canary_policy(self) -> CanaryPolicy:
        """The canary's test, with the human pass rate when the recipe has a review block."""
        if self.review is None:
            return self.canary
        test = ReviewTest(min_reviews=self.review.min_reviews, margin=self.review.margin)
        return self.canary.model_copy(update={"reviews": test})


def training_method(recipe: Recipe, train_counts: Mapping[str, int]) -> tuple[str, str | None]:
    """The method to train ``recipe`` with on a training set of ``train_counts`` examples
    per method, and why when it is not the recipe's own (KTO where pairs are scarce)."""
    if recipe.method != "dpo" or recipe.kto_below_pairs is None:
        return recipe.method, None
    pairs, labelled = train_counts.get("dpo", 0), train_counts.get("kto", 0)
    if pairs < recipe.kto_below_pairs and labelled > pairs:
        return "kto", (
            f"{pairs} preference pairs, fewer than kto_below_pairs {recipe.kto_below_pairs}: "
            f"KTO on {labelled} labelled answers instead"
        )
    return "dpo", None


def packaged_recipes_dir() -> Path:
    """The recipes shipped with flywheel (``training/recipes``)."""
    return Path(str(resources.files("training").joinpath("recipes")))


def read_recipe(path: Path) -> Recipe:
    """Parse one recipe file; errors name the file and the key."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        return Recipe.model_validate(data)
    except yaml.YAMLError as exc:
        raise FlywheelError(f"{path}: not valid YAML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(recipe)'}: {e['msg']}" for e in exc.errors()
        )
        raise FlywheelError(f"{path}: {problems}") from None


def load_recipe(business_line: str, recipes_dir: Path) -> Recipe:
    """The recipe of a line from ``recipes_dir/<line>.yaml``."""
    path = recipes_dir / f"{business_line}.yaml"
    if not path.exists():
        raise FlywheelError(f"no recipe for business line {business_line!r}: {path} is missing")
    recipe = read_recipe(path)
    if recipe.business_line != business_line:
        raise FlywheelError(f"{path} is for {recipe.business_line!r}, not {business_line!r}")
    return recipe


def iter_recipe_files(root: Path) -> Iterator[Path]:
    """Every recipe file under ``root`` (recursively)."""
    yield from sorted(root.rglob("*.yaml"))
