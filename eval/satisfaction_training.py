"""Training and judging a line's satisfaction model on its labelled answers.

The nightly's satisfaction stage (``composition.satisfaction``) reads the labelled
answers up to the night's dataset (:func:`labelled_splits`), fits and judges the model
(:func:`fit_and_judge`) and records it; the canary looks and the gate score answers with
the base model read once per process (:func:`reader_for`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eval.satisfaction import (
    SatisfactionModelPolicy,
    SatisfactionModelReport,
    evaluate_scores,
    stratified_folds,
)
from eval.satisfaction_model import (
    AnswerReader,
    LabelledAnswer,
    SatisfactionModel,
    labelled_answers,
    read_dataset_rows,
)
from feedback.datasets import dataset_by_hash, line_builds
from flywheel.errors import FlywheelError
from flywheel.settings import Settings

# Base-model readers by model folder, loaded once per process (the canary looks, the nightly).
_READERS: dict[Path, Any] = {}
# Folds of the cross-validation that judges a model when the later split is too thin.
CV_FOLDS = 5


def labelled_splits(
    settings: Settings, line: str, dataset_hash: str, max_examples: int
) -> tuple[list[Any], list[Any]]:
    """The line's labelled answers up to the night's dataset: (train, held out), newest first,
    an answer in the held-out split never also in training."""
    night = dataset_by_hash(settings.datasets_dir, line, dataset_hash)
    if night is None:
        raise FlywheelError(f"{line} has no dataset {dataset_hash[:16]}")
    builds = sorted(
        (
            b
            for b in line_builds(settings.datasets_dir, line)
            if b.manifest["created_at"] <= night.manifest["created_at"]
        ),
        key=lambda b: b.manifest["created_at"],
        reverse=True,
    )
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {"train": {}, "eval": {}}
    for build in builds:
        for split, by_kind in rows.items():
            for kind, found in read_dataset_rows(build.path, split).items():
                by_kind.setdefault(kind, []).extend(found)
    heldout = labelled_answers(rows["eval"])
    held = {(repr(a.prompt), a.answer) for a in heldout}
    train = [a for a in labelled_answers(rows["train"]) if (repr(a.prompt), a.answer) not in held]
    return train[:max_examples], heldout[: max(max_examples // 4, 1)]


@dataclass(frozen=True, slots=True)
class JudgedModel:
    """A satisfaction model fitted on a line's labelled answers, its report and what it was
    judged on (the held-out answers, or a cross-validation when they are too few)."""

    model: SatisfactionModel
    report: SatisfactionModelReport
    judged_on: str


def fit_and_judge(
    reader: Any,
    train: Sequence[LabelledAnswer],
    heldout: Sequence[LabelledAnswer],
    policy: SatisfactionModelPolicy,
) -> JudgedModel:
    """Fit the model on ``train`` and score it on ``heldout``; with too few of a class there,
    judge it by stratified cross-validation over every labelled answer instead."""
    labels = [a.label for a in train]
    features = reader.features([(a.prompt, a.answer) for a in train])
    weights = [a.weight for a in train]
    model = SatisfactionModel.fit(reader.base_model, features, labels, weights, l2=policy.l2)
    heldout_labels = [a.label for a in heldout]
    if min(sum(heldout_labels), len(heldout_labels) - sum(heldout_labels)) >= policy.min_per_class:
        scores = model.predict(reader.features([(a.prompt, a.answer) for a in heldout]))
        report = evaluate_scores(labels, scores, heldout_labels)
        return JudgedModel(model, report, "held-out answers (the dataset's later split)")
    return _cross_validated(reader, train, heldout, features, policy)


def out_of_fold_scores(
    base_model: str,
    features: Any,
    answers: Sequence[LabelledAnswer],
    policy: SatisfactionModelPolicy,
) -> Any:
    """Each answer's score by a model fitted on the other folds (stratified, ``CV_FOLDS``),
    with the answers' labels and weights."""
    labels = [a.label for a in answers]
    scores = np.zeros(len(answers))
    for fold in stratified_folds(labels, CV_FOLDS):
        rest = np.setdiff1d(np.arange(len(answers)), fold)
        fitted = SatisfactionModel.fit(
            base_model,
            features[rest],
            [labels[i] for i in rest],
            [answers[i].weight for i in rest],
            l2=policy.l2,
        )
        scores[fold] = fitted.predict(features[fold])
    return scores


def _cross_validated(
    reader: Any,
    train: Sequence[LabelledAnswer],
    heldout: Sequence[LabelledAnswer],
    features: Any,
    policy: SatisfactionModelPolicy,
) -> JudgedModel:
    """Too few of a class in the later split (quiet users, a rare class): the model judged by
    stratified cross-validation over every labelled answer, each scored by a model that never
    saw it, then fitted on them all. Time order is lost, so it is said."""
    everything = [*train, *heldout]
    all_features = (
        np.vstack([features, reader.features([(a.prompt, a.answer) for a in heldout])])
        if heldout
        else features
    )
    all_labels = [a.label for a in everything]
    out_of_fold = out_of_fold_scores(reader.base_model, all_features, everything, policy)
    report = evaluate_scores([a.label for a in train], out_of_fold, all_labels)
    model = SatisfactionModel.fit(
        reader.base_model, all_features, all_labels, [a.weight for a in everything], l2=policy.l2
    )
    judged_on = f"{CV_FOLDS}-fold cross-validation over every labelled answer"
    return JudgedModel(model, report, judged_on)


def reliability_plot(report: Any, path: Path, line: str) -> Path:
    """Predicted against observed satisfaction per bin, with the bins' counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = report.calibration.bins
    figure, axis = plt.subplots(figsize=(5, 5))
    axis.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
    axis.scatter(
        [b[0] for b in bins], [b[1] for b in bins], s=[20 + 4 * b[2] for b in bins], label="bins"
    )
    for predicted, observed, count in bins:
        axis.annotate(f"n={count}", (predicted, observed), fontsize=7, xytext=(4, 4),
                      textcoords="offset points")  # fmt: skip
    auc = f"AUC {report.auc:.3f} ({report.auc_low:.3f}-{report.auc_high:.3f})" if report.auc else ""
    axis.set_title(
        f"{line}: satisfaction model on {report.heldout_examples} held-out answers\n{auc}"
    )
    axis.set_xlabel("predicted satisfied")
    axis.set_ylabel("observed satisfied")
    axis.set_xlim(0, 1)
    axis.set_ylim(0, 1)
    axis.legend(loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def reader_for(base_dir: Path) -> Any:
    """The base model reading answers for satisfaction models, loaded once per process."""
    if base_dir not in _READERS:
        _READERS[base_dir] = AnswerReader(base_dir)
    return _READERS[base_dir]


def prompt_of(messages: Sequence[dict[str, Any]]) -> tuple[dict[str, str], ...]:
    """The conversation the answer came in (every message before it), as the model reads it."""
    return tuple({"role": str(m.get("role")), "content": str(m.get("content"))} for m in messages)
