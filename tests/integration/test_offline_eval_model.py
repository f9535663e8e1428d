"""Offline evaluation of the real base model (SmolLM2-135M-Instruct, converted from the wheel)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from eval.offline import EvalData, HeldOutPair, PromptAnswer, evaluate_model, load_for_eval

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def ask(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


PAIRS = (
    HeldOutPair(
        ask("What is the capital of Italy?"),
        "The capital of Italy is Rome.",
        "banana window seventeen purple the the of",
    ),
    HeldOutPair(
        ask("How many hours are in a day?"),
        "There are 24 hours in a day.",
        "xq zzv 9&& lorem qqq ipsum pflt",
    ),
    HeldOutPair(
        ask("Can you help me write a thank-you note to my teacher?"),
        "Of course! Dear teacher, thank you for your patience and support this year.",
        "no. go away. table cloud fish run run run",
    ),
    HeldOutPair(
        ask("What is 2 plus 2?"),
        "2 plus 2 equals 4.",
        "elephant carburettor moon 2 2 2 2 ###",
    ),
    HeldOutPair(
        ask("Please suggest a healthy breakfast."),
        "A bowl of oatmeal with fresh fruit and a glass of water is a healthy breakfast.",
        ";;;; ]]]] ~~~~ ^^^^ %%%% &&&&",
    ),
)


@pytest.fixture(scope="session")
def smollm(base_model_dir: Path) -> tuple[Any, Any]:
    return load_for_eval(base_model_dir, None, device="cpu")


def test_the_base_model_prefers_correct_polite_answers_over_garbage(
    smollm: tuple[Any, Any],
) -> None:
    model, tokenizer = smollm
    data = EvalData(
        pairs=PAIRS,
        preferred=tuple(PromptAnswer(p.prompt, p.chosen) for p in PAIRS),
        sample_prompts=(ask("What is the capital of France?"),),
    )

    report = evaluate_model(
        model, tokenizer, data, name="base", canaries=["CANARY-7f3a9c"], max_new_tokens=16
    )

    assert report.preference_accuracy is not None
    assert report.preference_accuracy >= 0.8, report
    assert report.mean_margin is not None
    assert report.mean_margin > 0
    assert math.isfinite(report.general_loss)
    assert 0 < report.general_loss < 10
    assert report.preferred_loss is not None
    assert 0 < report.preferred_loss < 10
    (sample,) = report.samples
    assert "Paris" in sample.answer
    assert not sample.refused
    assert report.canaries_in_generations == 0
