"""Recipes: one typed YAML file per business line (the top-level ``recipes/`` folder).

A recipe composes the policies of the packages that apply them: the training
configuration (:class:`training.config.TrainingConfig`, its fields at the top
level), the offline gate (``gate``: :class:`eval.gate.GatePolicy`), the canary
(``canary``: :class:`registry.canary.CanaryPolicy`) and the rollout (``rollout``:
:class:`registry.lifecycle.RolloutPolicy`), raw-text retention (``retention``:
:class:`feedback.retention.RetentionPolicy`) and human review (``review``:
:class:`feedback.reviews.ReviewPolicy`). Unknown keys are refused so a typo
cannot silently fall back to a default; a test parses every recipe in the
repository. The registry records a recipe by :func:`recipe_hash`, a plain value.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, Field, ValidationError, model_validator

from eval.gate import GatePolicy
from eval.satisfaction import SatisfactionModelPolicy
from feedback.contributions import DEFAULT_ANSWERS_PER_USER, DEFAULT_KEY_SHARE
from feedback.events import BUSINESS_LINE
from feedback.retention import RetentionPolicy, RetentionReport, apply_retention
from feedback.reviews import ReviewPolicy
from flywheel.errors import FlywheelError
from flywheel.settings import Settings
from flywheel.user_files import load_user_yaml
from registry.canary import DEFAULT_SATISFACTION_SHARE, CanaryPolicy, ReviewTest
from registry.lifecycle import RolloutPolicy
from registry.records import flatten_params
from training.config import TrainingConfig

if TYPE_CHECKING:
    from registry.tracking import Registry

# A recipe is a page of settings; a larger file is a mistake.
MAX_RECIPE_BYTES = 256 * 1024
# A demo recipe extends a production one; deeper chains are hard to read, and a cycle never ends.
MAX_EXTENDS = 4


class Recipe(TrainingConfig):
    """How one business line's adapter is trained (:class:`TrainingConfig`) and judged: the
    offline gate, the canary, the rollout, raw-text retention and human review."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    business_line: str = Field(pattern=BUSINESS_LINE)
    min_new_examples: int = Field(
        default=1_000,
        ge=1,
        le=100_000_000,
        description="Least usable signal a night trains on: the new training examples' total "
        "weight (a user's edit or thumbs 1, a regenerate 0.5, a model label its confidence "
        "times satisfaction_model.model_weight).",
    )
    eval_generations: int = Field(default=8, ge=0, le=1_000)
    gate: GatePolicy = Field(default_factory=GatePolicy)
    canary_steps: tuple[float, ...] = Field(default=(0.05, 0.25, 0.5, 1.0), min_length=1)
    canary: CanaryPolicy = Field(default_factory=CanaryPolicy)
    rollout: RolloutPolicy = Field(default_factory=RolloutPolicy)
    retention: RetentionPolicy = Field(default_factory=RetentionPolicy)
    review: ReviewPolicy | None = None
    satisfaction_model: SatisfactionModelPolicy = Field(
        default_factory=lambda: SatisfactionModelPolicy(enabled=False)
    )

    @model_validator(mode="after")
    def _schedule(self) -> Recipe:
        steps = list(self.canary_steps)
        if steps != sorted(steps) or not 0 < steps[0] <= steps[-1] <= 1:
            raise ValueError("canary_steps must rise within (0, 1], e.g. [0.05, 0.25, 1.0]")
        if self.canary.satisfaction is not None and self.review is None:
            raise ValueError(
                "canary.satisfaction needs a review block: reviewers' spot checks are the "
                "random sample that keeps the satisfaction estimate valid"
            )
        return self

    def canary_policy(self) -> CanaryPolicy:
        """The canary's test, with the human pass rate when the recipe has a review block."""
        if self.review is None:
            return self.canary
        test = ReviewTest(min_reviews=self.review.min_reviews, margin=self.review.margin)
        return self.canary.model_copy(update={"reviews": test})


# Dotted paths into the recipe ("gate.x": the gate block's field x).
_HASHED_ONLY_WHEN_SET: dict[str, object] = {
    "dpo_loss": "sigmoid",
    "continue_learning_rate": None,
    "gradient_checkpointing": "auto",
    "quantization": "none",
    "gate.max_general_loss_drift": None,
    "gate.predicted_satisfaction_margin": None,
    "gate.min_predicted_prompts": 8,
    "gate.unjudged": "hold",
    "canary.satisfaction": None,
    "canary.satisfaction.rollback_share": DEFAULT_SATISFACTION_SHARE,
    "canary.max_answers_per_user": DEFAULT_ANSWERS_PER_USER,
    "canary.max_key_share": DEFAULT_KEY_SHARE,
}


def recipe_hash(recipe: Recipe) -> str:
    """A stable hash of everything in a recipe but its retention policy, review block and
    satisfaction model (key order and formatting do not matter)."""
    # Retention is about the store and the review block about the feedback page's queue,
    # not training: changing them must not look like a new recipe.
    # The satisfaction model is trained beside the adapter, not into it.
    trained = recipe.model_dump(mode="json", exclude={"retention", "review", "satisfaction_model"})
    # Fields added after recipes were first hashed leave the hash alone at their default,
    # so upgrading flywheel does not retrain every line on unchanged data.
    for path, default in _HASHED_ONLY_WHEN_SET.items():
        *blocks, name = path.split(".")
        holder = trained
        for block in blocks:
            holder = holder.get(block) or {}
        if name in holder and holder[name] == default:
            holder.pop(name)
    canonical = json.dumps(trained, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def recipe_params(recipe: Recipe) -> dict[str, str]:
    """A recipe flattened into MLflow params."""
    return flatten_params(recipe.model_dump(mode="json"))


def start_training_run(
    registry: Registry,
    recipe: Recipe,
    dataset_hash: str,
    dataset_manifest_path: Path,
    base_model: str,
    code_version: str,
) -> str:
    """Open the MLflow run of one training with ``recipe``: its params, its hash as lineage."""
    return registry.start_training_run(
        recipe.business_line,
        method=recipe.method,
        recipe_hash=recipe_hash(recipe),
        recipe_params=recipe_params(recipe),
        dataset_hash=dataset_hash,
        dataset_manifest_path=dataset_manifest_path,
        base_model=base_model,
        code_version=code_version,
    )


def packaged_recipes_dir() -> Path:
    """The recipes shipped with flywheel (the top-level ``recipes`` folder, installed as a
    package of data files)."""
    spec = importlib.util.find_spec("recipes")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise FlywheelError("flywheel's packaged recipes are missing: reinstall flywheel")
    return Path(locations[0])


def recipes_dir(settings: Settings) -> Path:
    """The configured recipes folder (``FLYWHEEL_RECIPES_DIR``), else the packaged one."""
    return settings.recipes_dir or packaged_recipes_dir()


def recipe_for(settings: Settings, line: str) -> Recipe:
    """The recipe of a line from the configured folder."""
    return load_recipe(line, recipes_dir(settings))


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on it: mappings merge key by key, anything else replaces."""
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        both_mappings = isinstance(value, dict) and isinstance(below, dict)
        merged[key] = _merged(below, value) if both_mappings else value  # type: ignore[arg-type]
    return merged


def recipe_settings(path: Path, chain: tuple[Path, ...] = ()) -> Any:
    """One recipe file's settings (parsed YAML, not yet validated) over those of the recipe it
    ``extends`` (a path relative to it), read within bounds, a chain of at most
    :data:`MAX_EXTENDS` files without a cycle: what to edit and write elsewhere to derive a
    recipe."""
    data = load_user_yaml(path, max_bytes=MAX_RECIPE_BYTES, what="recipe") or {}
    if not isinstance(data, dict) or "extends" not in data:
        return data
    data = dict(data)
    parent = data.pop("extends")
    if not isinstance(parent, str) or Path(parent).suffix not in (".yaml", ".yml"):
        raise FlywheelError(f"{path}: extends: the path of a recipe file (.yaml), got {parent!r}")
    chain = (*chain, path.resolve())
    parent_path = (path.parent / parent).resolve()
    if parent_path in chain:
        raise FlywheelError(f"{path}: extends: {parent} extends this file again (a cycle)")
    if len(chain) >= MAX_EXTENDS:
        raise FlywheelError(f"{path}: extends: more than {MAX_EXTENDS} recipe files in a chain")
    if not parent_path.is_file():
        raise FlywheelError(f"{path}: extends: {parent_path} is not a file")
    parent_data = recipe_settings(parent_path, chain)
    if not isinstance(parent_data, dict):
        raise FlywheelError(f"{parent_path}: a recipe is a mapping of settings")
    return _merged(parent_data, data)


def read_recipe(path: Path) -> Recipe:
    """Parse one recipe file, read within bounds; errors name the file and the key (one that
    cannot be read or parsed: :class:`~flywheel.errors.InputFileError`). A recipe may
    ``extends: other.yaml`` (relative to it) and change only what it sets: mappings (``gate``,
    ``canary``, ...) merge key by key, a value of ``null`` unsets one (``epochs: null`` beside
    ``max_steps``)."""
    data = recipe_settings(path)
    try:
        return Recipe.model_validate(data)
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


def retention_policy_for(settings: Settings, line: str) -> RetentionPolicy:
    """The line's retention policy: its recipe's, or the default for a line with none
    (data imported for a line never trained is kept no longer than any other)."""
    recipes = recipes_dir(settings)
    if not (recipes / f"{line}.yaml").exists():
        return RetentionPolicy()
    return recipe_for(settings, line).retention


def apply_line_retention(
    settings: Settings,
    engine: Any,
    line: str,
    scrub: Callable[..., list[dict[str, Any]]],
    *,
    dry_run: bool = False,
) -> RetentionReport:
    """Scrub (or delete) the line's raw text older than its recipe's ``retention.raw_days``."""
    policy = retention_policy_for(settings, line)
    return apply_retention(engine, line, policy, scrub, dry_run=dry_run)
