"""The satisfaction model's parts that need no base model: labelled answers from a dataset, the
logistic head, held-out AUC and calibration, and the verdict that refuses a coin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eval.satisfaction import (
    SatisfactionModelPolicy,
    auc_interval,
    calibration,
    evaluate_scores,
    judge_satisfaction_model,
    roc_auc,
    single_class_reason,
)
from feedback.datasets import split_by_time, write_dataset
from feedback.examples import build_examples
from flywheel.settings.cleaning import DatasetSettings
from tests.unit.test_examples import record
from training.satisfaction import (
    SatisfactionModel,
    fit_logistic,
    labelled_answers,
    read_dataset_rows,
)


def test_labelled_answers_from_a_built_dataset(tmp_path: Path) -> None:
    """An edit: the edited text satisfied, the original not; a thumbs-up: satisfied; a
    thumbs-down: not."""
    records = [
        record("a", "No.", {"type": "edit"}, edit="Open Orders, choose Return.", user_id="u1"),
        record("b", "Fine answer.", {"type": "thumbs_up"}, user_id="u2", prompt_hash="p2"),
        record("c", "Bad answer.", {"type": "thumbs_down"}, user_id="u3", prompt_hash="p3"),
    ]
    splits = {k: split_by_time(v, 0.0) for k, v in build_examples(records).by_kind().items()}
    build = write_dataset(
        tmp_path, "customer_service", splits, funnel={}, source={}, settings=DatasetSettings()
    )
    answers = labelled_answers(read_dataset_rows(build.path, "train"))
    by_text = {a.answer: a.label for a in answers}
    assert by_text == {
        "Open Orders, choose Return.": 1,
        "No.": 0,
        "Fine answer.": 1,
        "Bad answer.": 0,
    }
    assert all(a.prompt and a.weight > 0 for a in answers)


def test_an_answer_labelled_both_ways_is_dropped() -> None:
    prompt = [{"role": "user", "content": "q"}]
    rows = {
        "sft": [{"prompt": prompt, "completion": [{"role": "assistant", "content": "A"}]}],
        "kto": [
            {
                "prompt": prompt,
                "completion": [{"role": "assistant", "content": "A"}],
                "label": False,
            },
            {
                "prompt": prompt,
                "completion": [{"role": "assistant", "content": "B"}],
                "label": True,
            },
        ],
    }
    assert [(a.answer, a.label) for a in labelled_answers(rows)] == [("B", 1)]


def test_the_head_learns_a_separable_signal_and_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    labels = rng.random(400) < 0.4
    features = rng.standard_normal((400, 20))
    features[:, 3] += 2.0 * labels
    model = SatisfactionModel.fit("base", features[:300], labels[:300].astype(int).tolist())
    scores = model.predict(features[300:])
    assert roc_auc(scores, labels[300:]) > 0.8
    again = SatisfactionModel.load(model.save(tmp_path / "m.npz"))
    assert np.allclose(again.predict(features[300:]), scores)
    assert again.base_model == "base"
    # Weights count: examples weighted 0 teach nothing.
    coefficients, _ = fit_logistic(features, labels, np.where(np.arange(400) < 200, 1.0, 1e-9))
    alone, _ = fit_logistic(features[:200], labels[:200])
    assert np.allclose(coefficients, alone, atol=1e-3)


def test_auc_matches_the_pairwise_definition_with_ties() -> None:
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 5, 60).astype(float)
    labels = rng.random(60) < 0.5
    pos, neg = scores[labels], scores[~labels]
    pairwise = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert roc_auc(scores, labels) == pytest.approx(pairwise)
    low, high = auc_interval(0.8, 50, 50)
    assert low < 0.8 < high
    assert high - low < auc_interval(0.8, 10, 10)[1] - auc_interval(0.8, 10, 10)[0]
    with pytest.raises(ValueError, match="both classes"):
        roc_auc([0.1, 0.2], [True, True])


def test_calibration_of_perfect_and_overconfident_scores() -> None:
    rng = np.random.default_rng(2)
    truth = rng.random(20_000)
    labels = rng.random(20_000) < truth
    assert calibration(truth, labels).ece < 0.02
    overconfident = np.where(truth > 0.5, 0.99, 0.01)
    assert calibration(overconfident, labels).ece > 0.2


def test_a_model_at_chance_is_refused_and_a_good_one_accepted() -> None:
    rng = np.random.default_rng(3)
    policy = SatisfactionModelPolicy()
    labels = (rng.random(200) < 0.5).astype(int)
    coin = evaluate_scores([0, 1], rng.random(200), labels.tolist())
    verdict = judge_satisfaction_model(coin, policy)
    assert not verdict.accepted
    assert "not shown better than chance" in verdict.reason
    good = evaluate_scores([0, 1], 0.3 * rng.random(200) + 0.6 * labels, labels.tolist())
    assert judge_satisfaction_model(good, policy).accepted
    few = evaluate_scores([0, 1], [0.9, 0.1, 0.8], [1, 0, 1])
    assert "too few held-out answers" in judge_satisfaction_model(few, policy).reason
    assert set(good.metrics()) >= {"auc", "auc_low", "brier", "ece", "heldout_examples"}


def test_a_single_class_cannot_train_a_model() -> None:
    assert "all satisfied: a single class" in str(single_class_reason([1, 1, 1]))
    assert "all unsatisfied" in str(single_class_reason([0, 0]))
    assert single_class_reason([]) == "no labelled answers to train on"
    assert single_class_reason([0, 1]) is None
