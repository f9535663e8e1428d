"""Real LoRA training on the default base model: adapter shape, resume, the gate on real models."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from composition.recipes import Recipe
from eval.gate import GatePolicy, decide_promotion
from eval.offline import EvalData, HeldOutPair, PromptAnswer, evaluate_model, load_for_eval
from training.config import LoraShape
from training.train import train_adapter

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FACTS = [
    ("What is the capital of France?", "The capital of France is Paris.", "Bananas sing loudly."),
    ("How many days are in a week?", "A week has seven days.", "Purple is a number."),
    (
        "What color is the sky on a clear day?",
        "The sky is blue on a clear day.",
        "Cheese runs fast.",
    ),
    ("What is 2 plus 2?", "2 plus 2 equals 4.", "The moon eats shoes."),
    ("Which animal barks?", "Dogs bark.", "Windows taste green."),
    ("What do bees make?", "Bees make honey.", "Seven forgot the river."),
]


def rows(swap: bool = False) -> list[dict[str, Any]]:
    out = []
    for question, good, bad in FACTS:
        chosen, rejected = (bad, good) if swap else (good, bad)
        out.append(
            {
                "prompt": [{"role": "user", "content": question}],
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
            }
        )
    return out


def recipe(**overrides: Any) -> Recipe:
    settings: dict[str, Any] = {
        "business_line": "test",
        "method": "dpo",
        "lora": LoraShape(rank=8, alpha=16, dropout=0.0),
        "learning_rate": 5e-4,
        "max_steps": 6,
        "batch_size": 3,
        "max_length": 128,
        "beta": 0.5,
        "min_new_examples": 1,
    }
    settings.update(overrides)
    return Recipe(**settings)


EVAL = EvalData(
    pairs=tuple(HeldOutPair(({"role": "user", "content": q},), g, b) for q, g, b in FACTS),
    preferred=tuple(PromptAnswer(({"role": "user", "content": q},), g) for q, g, _ in FACTS),
    sample_prompts=(({"role": "user", "content": "What is the capital of France?"},),),
)


def evaluate(base: Path, adapter: Path | None, name: str) -> Any:
    model, tokenizer = load_for_eval(base, adapter)
    return evaluate_model(model, tokenizer, EVAL, name=name, max_new_tokens=12, max_length=128)


def test_dpo_adapter_is_servable_and_resumes(base_model_dir: Path, tmp_path: Path) -> None:
    class CrashError(RuntimeError):
        pass

    def crash_after_checkpoint(log: dict[str, Any]) -> None:
        if log.get("step") == 6 and "loss" in log:
            raise CrashError

    output = tmp_path / "run"
    with pytest.raises(CrashError):
        train_adapter(
            recipe(max_steps=7),
            base_model_dir=base_model_dir,
            rows=rows(),
            output_dir=output,
            on_log=crash_after_checkpoint,
        )
    assert (output / "checkpoints" / "checkpoint-5").is_dir()
    result = train_adapter(
        recipe(max_steps=7), base_model_dir=base_model_dir, rows=rows(), output_dir=output
    )
    assert result.resumed_from is not None
    assert result.resumed_from.endswith("checkpoint-5")
    assert result.steps == 7
    config = json.loads((result.adapter_dir / "adapter_config.json").read_text())
    assert config["r"] == 8
    assert set(config["target_modules"]) <= {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert Path(config["base_model_name_or_path"]) == base_model_dir
    assert (result.adapter_dir / "adapter_model.safetensors").exists()
    assert not (output / "checkpoints").exists()
    assert result.peak_rss_mb > 0


def test_gate_rejects_an_adapter_trained_on_swapped_pairs_and_promotes_a_good_one(
    base_model_dir: Path, tmp_path: Path
) -> None:
    # Six held-out pairs show no significant gain: the gate asks only "not clearly worse",
    # plus the (opt-in) mean-margin check.
    policy = GatePolicy(
        preference_test="non_inferior",
        non_inferiority_margin=0.5,
        min_eval_pairs=3,
        max_general_loss_increase=0.5,
        min_margin_gain=0.0,
    )
    base = evaluate(base_model_dir, None, "base")
    bad = train_adapter(
        recipe(), base_model_dir=base_model_dir, rows=rows(swap=True), output_dir=tmp_path / "bad"
    )
    bad_report = evaluate(base_model_dir, bad.adapter_dir, "swapped")
    rejected = decide_promotion(bad_report, base, policy)
    assert not rejected.promote
    assert any(
        r.startswith("FAIL preference_accuracy") or r.startswith("FAIL mean_margin")
        for r in rejected.reasons
    )
    good = train_adapter(
        recipe(), base_model_dir=base_model_dir, rows=rows(), output_dir=tmp_path / "good"
    )
    good_report = evaluate(base_model_dir, good.adapter_dir, "good")
    accepted = decide_promotion(good_report, base, policy)
    assert accepted.promote, accepted.reasons
    assert good_report.mean_margin is not None
    assert base.mean_margin is not None
    assert good_report.mean_margin > base.mean_margin


def kto_rows() -> list[dict[str, Any]]:
    """Each fact's right answer labelled liked and its nonsense labelled disliked, unpaired."""
    out = []
    for question, good, bad in FACTS:
        for answer, liked in ((good, True), (bad, False)):
            out.append(
                {
                    "prompt": [{"role": "user", "content": question}],
                    "completion": [{"role": "assistant", "content": answer}],
                    "label": liked,
                }
            )
    return out


def assert_margin_rises(base_model_dir: Path, adapter: Path, name: str) -> None:
    """The adapter's mean per-token margin on the facts is above the base model's."""
    base = evaluate(base_model_dir, None, "base")
    report = evaluate(base_model_dir, adapter, name)
    assert report.mean_margin is not None
    assert base.mean_margin is not None
    assert report.mean_margin > base.mean_margin


def test_kto_learns_from_labelled_answers(base_model_dir: Path, tmp_path: Path) -> None:
    """What a recipe trains when pairs are scarce (kto_below_pairs): liked and disliked
    answers alone move the model's preference towards the liked ones."""
    result = train_adapter(
        recipe(method="kto", max_steps=8, batch_size=4),
        base_model_dir=base_model_dir,
        rows=kto_rows(),
        output_dir=tmp_path / "kto",
    )
    assert result.steps == 8
    assert_margin_rises(base_model_dir, result.adapter_dir, "kto")


def test_length_normalised_dpo_with_an_sft_term_raises_the_per_token_margin(
    base_model_dir: Path, tmp_path: Path
) -> None:
    """``dpo_loss: sigmoid_norm`` (per-token log-ratios) plus an SFT term trains and moves
    the per-token margin the gate scores toward the chosen answers."""
    trained = train_adapter(
        recipe(dpo_loss="sigmoid_norm", beta=5.0, sft_weight=0.5),
        base_model_dir=base_model_dir,
        rows=rows(),
        output_dir=tmp_path / "norm",
    )
    assert trained.steps == 6
    assert_margin_rises(base_model_dir, trained.adapter_dir, "norm")


def test_a_time_budget_decays_the_rate_and_a_continuation_trains_at_its_own_rate(
    base_model_dir: Path, tmp_path: Path
) -> None:
    """With a time budget the rate falls with the wall time (not over an epoch count it
    never reaches); continuing an adapter starts at the recipe's continue_learning_rate."""
    budgeted: list[tuple[float, float]] = []

    def note_rate(log: dict[str, Any]) -> None:
        if "loss" in log:
            budgeted.append((time.perf_counter(), log["learning_rate"]))

    first = train_adapter(
        # float32: bfloat16 autocast's first step builds its CPU kernels, seconds of the budget
        recipe(max_steps=None, epochs=100, precision="fp32"),
        base_model_dir=base_model_dir,
        rows=rows(),
        output_dir=tmp_path / "budget",
        max_seconds=90,
        on_log=note_rate,
    )
    assert first.steps < 200  # stopped by the budget, not by the 100 epochs
    rates = [rate for _, rate in budgeted]
    assert len(rates) >= 2
    assert rates[0] == pytest.approx(5e-4)
    assert all(later < earlier for earlier, later in itertools.pairwise(rates))
    # The last step began with at most its own duration left of the 90 s it crossed.
    last_step_s = budgeted[-1][0] - budgeted[-2][0]
    assert rates[-1] <= 5e-4 * min(1.0, last_step_s / 90) * 1.05

    continued: list[float] = []
    train_adapter(
        recipe(max_steps=2, continue_learning_rate=1e-4),
        base_model_dir=base_model_dir,
        rows=rows(),
        output_dir=tmp_path / "continued",
        init_adapter=first.adapter_dir,
        on_log=lambda log: continued.extend([log["learning_rate"]] if "loss" in log else []),
    )
    # The logged rate is the one each step used: the first step trains at the peak.
    assert continued[0] == pytest.approx(1e-4)


def test_a_guard_stops_at_the_first_measure_over_its_limit_and_keeps_the_last_inside(
    base_model_dir: Path, tmp_path: Path
) -> None:
    """The guard measures at its steps; the first measure over the limit stops training and
    the saved adapter is the one of the last measure inside it, not the one that overshot."""
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    from flywheel.progress import training_steps
    from training.train import LossGuard

    # Step 0 (the base model) measures 1.0, so the limit is 1.10; the check at step 6 is over.
    scripted = iter([1.0, 1.01, 1.02, 1.05, 1.2, 1.0])
    seen: list[dict[str, Any]] = []  # the weights at each measure: steps 0, 1, 2, 4, 6

    def measure(model: Any, _tokenizer: Any) -> float:
        seen.append({k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()})
        return next(scripted)

    ended: list[tuple[int, int | None]] = []
    with training_steps(lambda step, _t, _l, done, kept: done and ended.append((step, kept))):
        result = train_adapter(
            recipe(max_steps=8, precision="fp32"),
            base_model_dir=base_model_dir,
            rows=rows(),
            output_dir=tmp_path / "guarded",
            loss_guard=LossGuard(measure=measure, checks=4, max_over_base=0.1, headroom=0.0),
        )
    assert ended == [(6, 4)]  # the progress display is told the kept step as training ends
    assert result.loss_checks == ((0, 1.0), (1, 1.01), (2, 1.02), (4, 1.05), (6, 1.2))
    assert result.loss_limit == pytest.approx(1.1)
    assert result.steps == 6  # stopped at the measure over the limit, not at 8
    assert result.kept_step == 4
    saved = load_file(str(result.adapter_dir / "adapter_model.safetensors"))
    kept, overshot = seen[3], seen[4]
    assert saved.keys() == kept.keys()
    assert all(torch.equal(saved[k], kept[k]) for k in saved)
    assert not all(torch.equal(saved[k], overshot[k]) for k in saved)
