"""The satisfaction model's parts that need no base model: labelled answers from a dataset, the
logistic head, held-out AUC and calibration, and the verdict that refuses a coin."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
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
from eval.satisfaction_model import (
    SatisfactionModel,
    fit_logistic,
    labelled_answers,
    read_dataset_rows,
)
from feedback.datasets import split_by_time, write_dataset
from feedback.events import Signal
from feedback.examples import (
    ModelShare,
    build_examples,
    model_labelled_examples,
    silent_records,
)
from feedback.records import FeedbackRecord
from flywheel.settings.cleaning import DatasetSettings
from tests.unit.test_examples import record


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


def _silent(count: int) -> list[FeedbackRecord]:
    return [
        record(f"s{i}", f"answer {i}", user_id=f"q{i}", prompt_hash=f"ps{i}") for i in range(count)
    ]


def test_model_labels_are_confident_capped_weighted_and_traced() -> None:
    silent = _silent(10)
    scores = [0.99, 0.95, 0.9, 0.6, 0.5, 0.4, 0.1, 0.05, 0.02, 0.88]
    examples = model_labelled_examples(
        silent, scores, model="customer_service-satisfaction-v3",
        share=ModelShare.of({"sft": 100, "kto": 100}, 0.5), confidence=0.85, weight=0.5,
    )  # fmt: skip
    labelled = {(e.kind, e.completion, e.label) for e in examples}
    # Unsure answers (0.4-0.6) are left out; sure ones become SFT targets and KTO labels.
    assert ("sft", "answer 0", None) in labelled
    assert ("kto", "answer 0", True) in labelled
    assert ("kto", "answer 8", False) in labelled
    assert not any(e.completion in {"answer 3", "answer 4", "answer 5"} for e in examples)
    assert all(e.rule == "model:customer_service-satisfaction-v3" for e in examples)
    assert all(e.lineage.request_ids for e in examples)
    strongest = next(e for e in examples if e.completion == "answer 0")
    assert strongest.weight == pytest.approx(0.5 * 0.98)
    # Never more than max_share of each kind's set: 4 human KTO examples allow 4 model ones
    # at 0.5, and the SFT targets count against the SFT set alone (2 human, 2 model).
    share = ModelShare.of({"sft": 2, "kto": 4}, 0.5)
    capped = model_labelled_examples(
        silent, scores, model="m", share=share, confidence=0.85, weight=1.0
    )
    assert Counter(e.kind for e in capped) == {"kto": 4, "sft": 2}
    assert share.left == {"sft": 0, "kto": 0}
    # One kind's room is not another's: the single KTO place goes to the surest answer, and
    # the SFT targets still get their three places.
    share = ModelShare.of({"sft": 3, "kto": 1}, 0.5)
    mixed = model_labelled_examples(silent, scores, model="m", share=share, confidence=0.85,
                                    weight=1.0)  # fmt: skip
    assert [e.completion for e in mixed if e.kind == "sft"] == ["answer 0", "answer 1", "answer 2"]
    assert [(e.completion, e.label) for e in mixed if e.kind == "kto"] == [("answer 0", True)]
    none = ModelShare.of({"sft": 100, "kto": 100}, 0.0)
    assert model_labelled_examples(silent, scores, model="m", share=none, confidence=0.85,
                                   weight=1.0) == []  # fmt: skip
    with pytest.raises(ValueError, match="max_share"):
        ModelShare.of({"sft": 1}, 1.0)
    with pytest.raises(ValueError, match="scores for"):
        model_labelled_examples(silent, [0.9], model="m", share=share, confidence=0.85,
                                weight=1.0)  # fmt: skip
    # Negatives only: no SFT target, no positive label.
    negatives = model_labelled_examples(
        silent, scores, model="m", share=ModelShare.of({"sft": 100, "kto": 100}, 0.5),
        confidence=0.85, weight=1.0, positives=False,
    )  # fmt: skip
    assert negatives
    assert {(e.kind, e.label) for e in negatives} == {("kto", False)}


def test_silent_answers_are_those_without_any_signal() -> None:
    records = [
        record("a", "liked", {"type": "thumbs_up"}),
        record("b", "quiet", prompt_hash="p2"),
        record("c", "edited", {"type": "edit"}, edit="better", prompt_hash="p3"),
        record("d", "failed", prompt_hash="p4", status="error"),
    ]
    assert [r.request_id for r in silent_records(records, used=set())] == ["b"]
    assert silent_records(records, used={"b"}) == []


def test_the_judge_never_learns_from_its_own_labels() -> None:
    prompt = [{"role": "user", "content": "q"}]
    rows = {
        "kto": [
            {"prompt": prompt, "completion": [{"role": "assistant", "content": "A"}],
             "label": True, "rule": "model:x-satisfaction-v1"},
            {"prompt": prompt, "completion": [{"role": "assistant", "content": "B"}],
             "label": False, "rule": "thumbs_down"},
        ]
    }  # fmt: skip
    assert [a.answer for a in labelled_answers(rows)] == ["B"]


def test_the_cleaning_stage_adds_model_labels_to_training_only(tmp_path: Path) -> None:
    from feedback.cleaning import Funnel, SilentLabelling, finish_dataset
    from flywheel.settings.cleaning import CleaningSettings

    records = [
        *(record(f"h{i}", f"liked {i}", {"type": "thumbs_up"}, prompt_hash=f"h{i}",
                 user_id=f"hu{i}", signal="thumbs_up") for i in range(6)),
        *(replace(r, signal=Signal.NONE) for r in _silent(6)),
    ]  # fmt: skip
    labelling = SilentLabelling(
        model="customer_service-satisfaction-v1",
        score=lambda silent: [0.95 if int(r.request_id[1:]) % 2 else 0.05 for r in silent],
        confidence=0.85,
        max_share=0.5,
        weight=0.5,
    )
    funnel = Funnel()
    result = finish_dataset(
        records, "customer_service", funnel, CleaningSettings(), tmp_path, {},
        labelling=labelling,
    )  # fmt: skip
    assert result.dataset is not None
    rules = result.dataset.manifest["rules"]
    assert rules["kto:model:customer_service-satisfaction-v1"] >= 1
    model_items = [i for i in result.dataset.manifest["examples"] if i["rule"].startswith("model:")]
    assert model_items
    assert {i["split"] for i in model_items} == {"train"}
    assert funnel.examples["silent_answers"] == 6
    assert funnel.examples["model_labelled"] == len(model_items)
    # By default the model only marks answers that failed.
    assert {i["kind"] for i in model_items} == {"kto"}


def test_predicted_satisfaction_pairs_the_prompts() -> None:
    from eval.satisfaction import predicted_satisfaction

    compared = predicted_satisfaction([0.9, 0.8, 0.7, 0.9], [0.5, 0.4, 0.6, 0.5])
    assert compared is not None
    assert compared.difference == pytest.approx(0.325)
    assert 0 < compared.low < compared.difference < compared.high
    assert "4 held-out prompts" in compared.describe("m")
    assert predicted_satisfaction([0.5], [0.4]) is None
    with pytest.raises(ValueError, match="candidate scores"):
        predicted_satisfaction([0.5, 0.2], [0.4])


def test_stratified_folds_spread_the_rare_class() -> None:
    from eval.satisfaction import stratified_folds

    labels = [1] * 11 + [0] * 106
    folds = stratified_folds(labels, 5)
    assert sorted(np.concatenate(folds).tolist()) == list(range(117))
    assert [sum(labels[i] for i in fold) for fold in folds] == [3, 2, 2, 2, 2]


def test_best_of_n_picks_the_model_s_best_and_worst_answers() -> None:
    from feedback.examples import best_of_n_examples, restore_placeholder_targets

    silent = _silent(3)
    candidates = [
        ["answer 0", "sampled good", "sampled bad"],
        ["answer 1", "also fine"],  # the model cannot tell them apart: nothing
        ["answer 2", "Ask <PERSON_7> for it", "meh"],  # its best invents a placeholder
    ]
    scores = [[0.5, 0.95, 0.1], [0.6, 0.62], [0.2, 0.99, 0.3]]
    examples = best_of_n_examples(
        silent, candidates, scores, model="customer_service-satisfaction-v2",
        confidence=0.85, min_gap=0.3, weight=0.5, share=ModelShare({"sft": 10, "dpo": 10}),
    )  # fmt: skip
    assert {(e.kind, e.completion, e.chosen, e.rejected) for e in examples} == {
        ("dpo", None, "sampled good", "sampled bad"),
        ("sft", "sampled good", None, None),
        ("dpo", None, "Ask <PERSON_7> for it", "answer 2"),
        ("sft", "Ask <PERSON_7> for it", None, None),
    }
    # The cleaning stage gives the invented placeholder a neutral word before training.
    restored, counts = restore_placeholder_targets(examples)
    assert {e.completion or e.chosen for e in restored} == {
        "sampled good",
        "Ask the customer for it",
    }
    assert counts == {"sft": 1, "dpo": 1}
    assert all(e.rule == "model:customer_service-satisfaction-v2/best-of-3" for e in examples)
    assert all(e.lineage.request_ids in {("s0",), ("s2",)} for e in examples)
    pair = next(e for e in examples if e.kind == "dpo" and e.chosen == "sampled good")
    assert pair.weight == pytest.approx(0.5 * 0.85)
    # The clearest first, each kind never more than the share leaves.
    assert [e.kind for e in examples] == ["sft", "sft", "dpo", "dpo"]
    one_each = best_of_n_examples(
        silent, candidates, scores, model="m", confidence=0.85, min_gap=0.3, weight=1.0,
        share=ModelShare({"sft": 1, "dpo": 1}),
    )  # fmt: skip
    assert [e.kind for e in one_each] == ["sft", "dpo"]
    # Not sure of the best: the pair stays, the SFT target does not.
    unsure = best_of_n_examples(
        silent[:1], candidates[:1], [[0.5, 0.7, 0.1]], model="m", confidence=0.85,
        min_gap=0.3, weight=1.0, share=ModelShare({"sft": 10, "dpo": 10}),
    )  # fmt: skip
    assert [e.kind for e in unsure] == ["dpo"]
    with pytest.raises(ValueError, match="candidate lists"):
        best_of_n_examples(silent, candidates[:1], scores, model="m", confidence=0.85,
                           min_gap=0.3, weight=1.0, share=ModelShare({}))  # fmt: skip


def test_the_cleaning_stage_adds_best_of_n_within_the_model_share(tmp_path: Path) -> None:
    """Sampled answers, scrubbed, then scored by the model, become SFT targets and DPO pairs
    in training only, traced to the silent request; each kind's model labels stay within
    max_share of that kind's set; a prompt whose sampling failed adds nothing."""
    import pyarrow.parquet as pq

    from feedback.cleaning import Funnel, SilentLabelling, finish_dataset
    from flywheel.settings.cleaning import CleaningSettings

    records = [
        *(record(f"h{i}", f"liked {i}", {"type": "thumbs_up"}, prompt_hash=f"h{i}",
                 user_id=f"hu{i}", signal="thumbs_up") for i in range(6)),
        *(record(f"e{i}", f"clumsy {i}", {"type": "edit"}, edit=f"better {i}", prompt_hash=f"e{i}",
                 user_id=f"eu{i}", signal="edit") for i in range(4)),
        *(replace(r, signal=Signal.NONE) for r in _silent(6)),
    ]  # fmt: skip
    asked: list[list[str]] = []

    def sample(silent: list[FeedbackRecord]) -> list[list[str]]:
        asked.append([r.request_id for r in silent])
        return [[] if r.request_id == "s0" else ["GOOD, call 555-0100", "BAD"] for r in silent]

    def scrub(rows: list[FeedbackRecord]) -> list[FeedbackRecord]:
        return [r.with_response(r.response.replace("555-0100", "<PHONE_NUMBER_1>")) for r in rows]

    read: list[str] = []

    def score(rows: list[FeedbackRecord]) -> list[float]:
        read.extend(r.response for r in rows)
        return [0.97 if "GOOD" in r.response else 0.03 if r.response == "BAD" else 0.5
                for r in rows]  # fmt: skip

    labelling = SilentLabelling(
        model="customer_service-satisfaction-v1", score=score, confidence=0.85, max_share=0.5,
        weight=0.5, sample=sample, best_of_prompts=4, min_gap=0.3,
    )  # fmt: skip
    funnel = Funnel()
    result = finish_dataset(
        records, "customer_service", funnel, CleaningSettings(), tmp_path, {},
        labelling=labelling, scrub=scrub,
    )  # fmt: skip
    assert result.dataset is not None
    assert len(asked) == 1
    assert len(asked[0]) <= 4
    # The model never read, and the dataset never holds, the sampled number.
    assert "GOOD, call <PHONE_NUMBER_1>" in read
    assert not any("555-0100" in text for text in read)
    written = str([pq.read_table(p).to_pylist() for p in result.dataset.path.rglob("*.parquet")])
    assert "GOOD, call" in written  # the invented placeholder given a neutral word
    assert "555-0100" not in written
    items = result.dataset.manifest["examples"]
    best_of = [i for i in items if "/best-of-3" in i["rule"]]
    assert {i["kind"] for i in best_of} == {"sft", "dpo"}
    assert {i["split"] for i in best_of} == {"train"}
    assert funnel.examples["best_of_n"] == len(best_of)
    model_made = [i for i in items if i["rule"].startswith("model:")]
    assert funnel.examples["model_labelled"] == len(model_made)
    for kind in ("sft", "dpo", "kto"):
        ours = sum(1 for i in items if i["kind"] == kind and i["rule"].startswith("model:"))
        users = sum(1 for i in items if i["kind"] == kind and not i["rule"].startswith("model:"))
        assert ours <= users, kind  # at most half of each kind's set


def test_usable_signal_weighs_users_reviewers_and_model_labels_apart() -> None:
    """The nightly's minimum counts what the examples weigh: a model label its confidence
    times the recipe's model weight, a user's signal its strength; a reviewer's verdict or
    correction is counted as the reviewers', not the users'."""
    from feedback.datasets import usable_signal

    manifest = {
        "examples": [
            {"kind": "sft", "split": "train", "rule": "edit", "weight": 1.0},
            {"kind": "sft", "split": "train", "rule": "regenerate", "weight": 0.5},
            {"kind": "sft", "split": "train", "rule": "model:cs-satisfaction-v1", "weight": 0.4},
            {"kind": "sft", "split": "train", "rule": "correction", "weight": 1.0},
            {"kind": "sft", "split": "train", "rule": "review_pass", "weight": 0.5},
            {"kind": "sft", "split": "eval", "rule": "edit", "weight": 1.0},
            {"kind": "kto", "split": "train", "rule": "thumbs_down", "weight": 1.0},
        ]
    }
    signal = usable_signal(manifest, "sft")
    assert (signal.user_examples, signal.review_examples, signal.model_examples) == (2, 2, 1)
    assert signal.weight == pytest.approx(3.4)
    assert signal.describe("sft") == (
        "5 new SFT training examples weighing 3.4 (2 from users' signals, 1.5; "
        "2 from reviewers, 1.5; 1 labelled by the satisfaction model, 0.4)"
    )
    # A manifest from before weights were recorded: each example counts 1.
    older = {"counts": {"sft": {"train": 7}}}
    assert usable_signal(older, "sft").weight == 7.0


def test_predicted_satisfaction_covers_on_a_handful_of_prompts() -> None:
    """On 3 to 6 held-out prompts the paired interval covers the true difference at least
    95% of the time (a normal interval on so few covers about 80-88%)."""
    from eval.satisfaction import predicted_satisfaction

    rng = np.random.default_rng(3)
    for prompts in (3, 6):
        covered = 0
        for _ in range(2_000):
            champion = rng.uniform(0.2, 0.6, prompts)
            candidate = champion + 0.1 + rng.normal(0, 0.15, prompts)  # truly 0.1 better
            compared = predicted_satisfaction(candidate.tolist(), champion.tolist())
            assert compared is not None
            covered += compared.low <= 0.1 <= compared.high
        assert covered / 2_000 >= 0.94, (prompts, covered)


def test_the_judge_never_learns_from_the_reviews_that_rectify_it() -> None:
    """Reviewers' verdicts and corrections train adapters, not the satisfaction model: the
    canary's estimate rectifies the model's scores with a random sample of reviews, which
    must not be what the model was fitted to (a correction's original is a failed review)."""
    prompt = [{"role": "user", "content": "q"}]
    rows = {
        "sft": [
            {"prompt": prompt, "completion": [{"role": "assistant", "content": "A"}],
             "rule": "review_pass"},
            {"prompt": prompt, "completion": [{"role": "assistant", "content": "D"}],
             "rule": "correction"},
        ],
        "dpo": [
            {"prompt": prompt, "chosen": [{"role": "assistant", "content": "D"}],
             "rejected": [{"role": "assistant", "content": "E"}],
             "rule": "correction>original"},
        ],
        "kto": [
            {"prompt": prompt, "completion": [{"role": "assistant", "content": "B"}],
             "label": False, "rule": "review_fail"},
            {"prompt": prompt, "completion": [{"role": "assistant", "content": "C"}],
             "label": True, "rule": "thumbs_up"},
        ],
    }  # fmt: skip
    assert [a.answer for a in labelled_answers(rows)] == ["C"]


def test_silent_answers_are_labelled_only_for_a_recipe_that_trains_on_the_labels() -> None:
    from composition.recipes import Recipe, load_recipe, packaged_recipes_dir
    from composition.satisfaction import unused_model_labels

    on = SatisfactionModelPolicy(enabled=True, pseudo_labels=True)
    sft = Recipe(business_line="legal", method="sft", max_steps=2, satisfaction_model=on)
    reason = unused_model_labels(sft)
    assert reason is not None
    assert "sft" in reason
    assert "label_positives" in reason
    assert unused_model_labels(
        Recipe(business_line="legal", method="dpo", max_steps=2, satisfaction_model=on)
    )
    positives = on.model_copy(update={"label_positives": True})
    best_of = on.model_copy(update={"best_of_n": 4})
    assert unused_model_labels(sft.model_copy(update={"satisfaction_model": positives})) is None
    assert unused_model_labels(sft.model_copy(update={"satisfaction_model": best_of})) is None
    assert unused_model_labels(sft.model_copy(update={"method": "kto"})) is None
    dpo = Recipe(
        business_line="legal", method="dpo", max_steps=2, kto_below_pairs=50, satisfaction_model=on
    )
    assert unused_model_labels(dpo) is None
    # The production recipes train SFT on users' positives: their model labels would go unused.
    assert unused_model_labels(load_recipe("medical", packaged_recipes_dir())) is not None
