"""Every recipe in the repository parses; bad recipes are refused with the key named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from composition.recipes import iter_recipe_files, load_recipe, packaged_recipes_dir, read_recipe
from flywheel.errors import FlywheelError
from flywheel.user_files import load_user_yaml

RECIPES = list(iter_recipe_files(packaged_recipes_dir()))


def test_the_repository_has_recipes() -> None:
    names = {path.stem for path in RECIPES}
    assert {"customer_service", "medical", "legal"} <= names
    assert any(path.parent.name == "demo" for path in RECIPES)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(packaged_recipes_dir())))
def test_every_recipe_parses(path: Path) -> None:
    recipe = read_recipe(path)
    assert recipe.business_line == path.stem
    assert recipe.lora.rank <= 16, "must fit the serving vLLM's --max-lora-rank 16"


# What a demo recipe may change of the production recipe it extends: volumes (how much data a
# night waits for, how many answers the gate generates and the reviewers check), times (how long
# a night trains, how long each share soaks, how many looks, how noisy a shared CPU's speed is)
# and the margins and error rate that a small day's samples can resolve.
SCALE_SETTINGS = {
    "business_line", "extends", "epochs", "max_steps", "max_length", "min_new_examples",
    "eval_generations", "gate.non_inferiority_margin", "gate.min_eval_pairs",
    "gate.predicted_satisfaction_margin", "gate.min_predicted_prompts",
    "gate.max_refusal_rate_increase", "canary_steps", "rollout", "canary.min_requests",
    "canary.max_looks", "canary.alpha", "canary.margins", "canary.max_p99_ratio",
    "canary.p99_slack_ms", "canary.max_ttft_p99_ratio", "canary.ttft_slack_ms",
    "canary.max_tpot_ratio", "canary.tpot_slack_ms", "review.share",
}  # fmt: skip


def _settings_set(data: dict[str, Any], prefix: str = "") -> set[str]:
    names: set[str] = set()
    for key, value in data.items():
        name = prefix + key
        names |= _settings_set(value, name + ".") if isinstance(value, dict) else {name}
    return names


def _is_scale(name: str) -> bool:
    parts = name.split(".")
    return any(".".join(parts[:n]) in SCALE_SETTINGS for n in range(1, len(parts) + 1))


@pytest.mark.parametrize("line", ["customer_service", "legal", "medical"])
def test_demo_recipes_are_the_production_recipes_at_a_cpus_volumes_and_times(line: str) -> None:
    """What the loop and the demo measure (method, adapter, what decides, the bounds on what
    users see) is what users get: each demo recipe extends its production recipe and sets
    only volumes, times and the margins a small day can resolve; production waits for more
    data, generates and reviews at its scale, and soaks and watches longer."""
    demo_path = packaged_recipes_dir() / "demo" / f"{line}.yaml"
    demo_file = load_user_yaml(demo_path, max_bytes=1 << 20, what="recipe")
    assert demo_file["extends"] == f"../{line}.yaml"
    changed = sorted(name for name in _settings_set(demo_file) if not _is_scale(name))
    assert not changed, f"{demo_path} changes more than volumes and times: {changed}"

    production = read_recipe(packaged_recipes_dir() / f"{line}.yaml")
    demo = read_recipe(demo_path)
    for field in ("method", "lora", "learning_rate", "start_from", "satisfaction_model"):
        assert getattr(production, field) == getattr(demo, field), field
    assert production.canary.satisfaction == demo.canary.satisfaction
    assert production.canary.max_length_change == demo.canary.max_length_change
    assert production.gate.min_length_ratio == demo.gate.min_length_ratio
    assert production.review is not None
    assert demo.review is not None
    assert production.review.rubric == demo.review.rubric
    assert production.min_new_examples >= 10 * demo.min_new_examples
    assert production.eval_generations >= demo.eval_generations
    assert production.gate.min_eval_pairs >= demo.gate.min_eval_pairs
    assert production.gate.min_predicted_prompts >= demo.gate.min_predicted_prompts
    assert production.rollout.soak_s >= demo.rollout.soak_s
    assert production.canary.max_looks >= demo.canary.max_looks
    assert production.canary.alpha <= demo.canary.alpha


def test_a_recipe_extends_another_and_changes_only_what_it_sets(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(
        "business_line: legal\nmethod: sft\nepochs: 1\nlearning_rate: 1.0e-4\n"
        "gate: {min_eval_pairs: 30, non_inferiority_margin: 0.1}\n"
    )
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "legal.yaml").write_text(
        "extends: ../base.yaml\nepochs: null\nmax_steps: 5\ngate: {min_eval_pairs: 3}\n"
    )
    recipe = load_recipe("legal", tmp_path / "small")
    assert (recipe.epochs, recipe.max_steps, recipe.learning_rate) == (None, 5, 1.0e-4)
    assert (recipe.gate.min_eval_pairs, recipe.gate.non_inferiority_margin) == (3, 0.1)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"a.yaml": "extends: b.yaml\n", "b.yaml": "extends: a.yaml\n"}, "a cycle"),
        ({"a.yaml": "extends: a.yaml\n"}, "a cycle"),
        ({"a.yaml": "extends: missing.yaml\n"}, "is not a file"),
        ({"a.yaml": "extends: /etc/passwd\n"}, "the path of a recipe file"),
        ({"a.yaml": "extends: [b.yaml]\n"}, "the path of a recipe file"),
        ({"a.yaml": "extends: b.yaml\n", "b.yaml": "- a list\n"}, "a mapping of settings"),
        (
            {f"{n}.yaml": f"extends: {n + 1}.yaml\n" for n in range(6)}
            | {"a.yaml": "extends: 0.yaml\n"},
            "more than 4 recipe files",
        ),
        ({"a.yaml": "extends: b.yaml\n", "b.yaml": "business_line: a\nmethod: [sft\n"}, "b.yaml"),
    ],
)
def test_a_bad_extends_is_refused_naming_the_file(
    tmp_path: Path, files: dict[str, str], message: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(FlywheelError, match=message):
        read_recipe(tmp_path / "a.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "business_line: x\nmethod: sft\nepochs: 1\nlearnin_rate: 1\n",
            "learnin_rate: Extra inputs",
        ),
        ("business_line: x\nmethod: sft\n", "set 'epochs', 'max_steps' or both"),
        ("business_line: x\nmethod: ppo\nepochs: 1\n", "method"),
        (
            "business_line: x\nmethod: sft\nepochs: 1\nlora: {target_modules: [lm_head]}\n",
            "cannot be served by vLLM",
        ),
        ("business_line: x\nmethod: sft\nepochs: 1\ncanary_steps: [0.5, 0.05]\n", "canary_steps"),
        ("business_line: x\nmethod: [sft\n", "not valid YAML"),
        ("business_line: x\nmethod: sft\nepochs: 1\nprecision: fp16\n", "precision"),
    ],
)
def test_bad_recipes_are_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    with pytest.raises(FlywheelError, match=message.replace("[", r"\[")):
        read_recipe(path)


def test_load_recipe_checks_the_line(tmp_path: Path) -> None:
    (tmp_path / "legal.yaml").write_text("business_line: medical\nmethod: sft\nepochs: 1\n")
    with pytest.raises(FlywheelError, match="is for 'medical'"):
        load_recipe("legal", tmp_path)
    with pytest.raises(FlywheelError, match="no recipe"):
        load_recipe("finance", tmp_path)


def test_kto_is_chosen_where_pairs_are_scarce() -> None:
    from composition.recipes import Recipe
    from training.config import training_method

    fields = {"business_line": "legal", "max_steps": 10}
    auto = Recipe(method="dpo", kto_below_pairs=200, **fields)
    method, why = training_method(auto, {"dpo": 40, "kto": 900})
    assert method == "kto"
    assert why is not None
    assert "40 preference pairs" in why
    assert training_method(auto, {"dpo": 400, "kto": 900}) == ("dpo", None)
    # Fewer labelled answers than pairs: KTO would not have more to learn from.
    assert training_method(auto, {"dpo": 40, "kto": 30}) == ("dpo", None)
    plain = Recipe(method="dpo", **fields)
    assert training_method(plain, {"dpo": 0, "kto": 900}) == ("dpo", None)
    sft = Recipe(method="sft", kto_below_pairs=200, **fields)
    assert training_method(sft, {"dpo": 0, "kto": 900}) == ("sft", None)


def test_precision_auto_follows_the_cpu() -> None:
    from flywheel.hardware import cpu_has_bf16
    from training.train import trains_in_bf16

    assert trains_in_bf16("auto", on_gpu=False) is cpu_has_bf16()
    assert trains_in_bf16("bf16", on_gpu=False) is True
    assert trains_in_bf16("fp32", on_gpu=True) is False
    assert read_recipe(packaged_recipes_dir() / "demo" / "medical.yaml").precision == "auto"


def test_a_time_budget_decays_the_rate_linearly_to_zero() -> None:
    from training.train import time_decay

    assert time_decay(0, 900) == 1.0
    assert time_decay(450, 900) == pytest.approx(0.5)
    assert time_decay(900, 900) == 0.0
    assert time_decay(1_000, 900) == 0.0


def test_a_continuation_rate_is_a_recipe_field_checked_like_the_rate() -> None:
    from composition.recipes import Recipe

    assert Recipe(business_line="x", method="sft", max_steps=10).continue_learning_rate is None
    with pytest.raises(ValueError, match="continue_learning_rate"):
        Recipe(business_line="x", method="sft", max_steps=10, continue_learning_rate=0)
