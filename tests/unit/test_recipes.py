"""Every recipe in the repository parses; bad recipes are refused with the key named."""

from __future__ import annotations

from pathlib import Path

import pytest

from composition.recipes import iter_recipe_files, load_recipe, packaged_recipes_dir, read_recipe
from flywheel.errors import FlywheelError

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


@pytest.mark.parametrize("line", ["customer_service", "legal", "medical"])
def test_production_and_demo_recipes_differ_only_in_volumes_and_times(line: str) -> None:
    """What was measured in the demo (method, adapter, rates, what decides) is what users
    get; production waits for more data, generates and reviews at its scale, and soaks
    and watches longer."""
    production = read_recipe(packaged_recipes_dir() / f"{line}.yaml")
    demo = read_recipe(packaged_recipes_dir() / "demo" / f"{line}.yaml")
    same = (
        "method", "lora", "learning_rate", "continue_learning_rate", "start_from",
        "history_days", "half_life_days", "satisfaction_model",
    )  # fmt: skip
    for field in same:
        assert getattr(production, field) == getattr(demo, field), field
    assert production.canary.satisfaction == demo.canary.satisfaction
    assert production.gate.preference_test == demo.gate.preference_test
    assert production.gate.unjudged == demo.gate.unjudged
    assert production.review is not None
    assert demo.review is not None
    assert production.review.rubric == demo.review.rubric
    assert production.min_new_examples >= 10 * demo.min_new_examples
    assert production.eval_generations >= demo.eval_generations
    assert production.gate.min_eval_pairs >= demo.gate.min_eval_pairs
    assert production.gate.min_predicted_prompts >= demo.gate.min_predicted_prompts
    assert production.rollout.soak_s >= demo.rollout.soak_s
    assert production.canary.max_looks >= demo.canary.max_looks


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "business_line: x\nmethod: sft\nepochs: 1\nlearnin_rate: 1\n",
            "learnin_rate: Extra inputs",
        ),
        ("business_line: x\nmethod: sft\nepochs: 1\nmax_steps: 5\n", "exactly one of"),
        ("business_line: x\nmethod: sft\n", "exactly one of"),
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
