"""The nightly stage that trains a line's satisfaction model and records it in MLflow.

Composes :mod:`eval.satisfaction_model` (labelled answers, features, the head),
:mod:`eval.satisfaction` (held-out AUC, calibration, the verdict) and the
registry; the night goes on whatever it decides.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import tempfile
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from composition.clients import Clients
from composition.recipes import recipe_for
from feedback.contributions import LookBound
from flywheel.settings import Settings
from registry.ppi import SatisfactionSample

if TYPE_CHECKING:
    from eval.satisfaction import SatisfactionModelPolicy

logger = logging.getLogger(__name__)

# Base-model readers by model folder, loaded once per process (the canary looks, the nightly).
_READERS: dict[Path, Any] = {}
# Folds of the cross-validation that judges a model when the later split is too thin.
CV_FOLDS = 5


def _labelled_splits(
    settings: Settings, line: str, dataset_hash: str, max_examples: int
) -> tuple[list[Any], list[Any]]:
    """The line's labelled answers up to the night's dataset: (train, held out), newest first,
    an answer in the held-out split never also in training."""
    from eval.satisfaction_model import labelled_answers, read_dataset_rows
    from feedback.datasets import dataset_by_hash, line_builds
    from flywheel.errors import FlywheelError

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


def train_satisfaction_model(
    settings: Settings,
    clients: Clients,
    line: str,
    dataset_hash: str,
    *,
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Train, judge and record the line's satisfaction model on its labelled answers up to
    the night's dataset; returns what it did (``status``: off, refused or accepted)."""
    import numpy as np

    from eval.satisfaction import (
        evaluate_scores,
        judge_satisfaction_model,
        single_class_reason,
        stratified_folds,
    )
    from eval.satisfaction_model import SatisfactionModel
    from training.base_model import ensure_base_model

    policy = recipe_for(settings, line).satisfaction_model
    if not policy.enabled:
        return {"status": "off", "reason": "the recipe's satisfaction_model is not enabled"}
    train, heldout = _labelled_splits(settings, line, dataset_hash, policy.max_examples)
    labels = [a.label for a in train]
    outcome: dict[str, Any] = {
        "train_examples": len(train),
        "train_positive": sum(labels),
        "heldout_examples": len(heldout),
    }
    refused = single_class_reason(labels)
    if refused is not None:
        log(f"satisfaction model of {line} refused: {refused}")
        return outcome | {"status": "refused", "reason": refused}
    reader = reader_for(ensure_base_model(settings.models_dir, settings.base_model))
    log(f"satisfaction model of {line}: reading {len(train) + len(heldout)} labelled answers")
    features = reader.features([(a.prompt, a.answer) for a in train])
    weights = [a.weight for a in train]
    model = SatisfactionModel.fit(reader.base_model, features, labels, weights, l2=policy.l2)
    heldout_labels = [a.label for a in heldout]
    if min(sum(heldout_labels), len(heldout_labels) - sum(heldout_labels)) >= policy.min_per_class:
        scores = model.predict(reader.features([(a.prompt, a.answer) for a in heldout]))
        report = evaluate_scores(labels, scores, heldout_labels)
        outcome["judged_on"] = "held-out answers (the dataset's later split)"
    else:
        # Too few of a class in the later split (quiet users, a rare class): judge it by
        # stratified cross-validation over every labelled answer instead, each scored by a
        # model that never saw it. Time order is lost, so it is said.
        everything = [*train, *heldout]
        all_features = (
            np.vstack([features, reader.features([(a.prompt, a.answer) for a in heldout])])
            if heldout
            else features
        )
        all_labels = [a.label for a in everything]
        out_of_fold = np.zeros(len(everything))
        for fold in stratified_folds(all_labels, CV_FOLDS):
            rest = np.setdiff1d(np.arange(len(everything)), fold)
            fitted = SatisfactionModel.fit(
                reader.base_model,
                all_features[rest],
                [all_labels[i] for i in rest],
                [everything[i].weight for i in rest],
                l2=policy.l2,
            )
            out_of_fold[fold] = fitted.predict(all_features[fold])
        report = evaluate_scores(labels, out_of_fold, all_labels)
        outcome["judged_on"] = f"{CV_FOLDS}-fold cross-validation over every labelled answer"
        model = SatisfactionModel.fit(
            reader.base_model, all_features, all_labels, [a.weight for a in everything],
            l2=policy.l2,
        )  # fmt: skip
    verdict = judge_satisfaction_model(report, policy)
    with tempfile.TemporaryDirectory(prefix="flywheel-satisfaction-") as scratch:
        folder = Path(scratch)
        model.save(folder / "model.npz")
        if report.calibration is not None:
            reliability_plot(report, folder / "reliability.png", line)
        run_id, version = clients.registry.log_satisfaction_model(
            line,
            dataset_hash=dataset_hash,
            base_model=reader.base_model,
            metrics=report.metrics(),
            accepted=verdict.accepted,
            reason=f"{verdict.reason} (judged on {outcome['judged_on']})",
            model_dir=folder,
        )
    log(
        f"satisfaction model of {line} {'accepted' if verdict.accepted else 'refused'}: "
        f"{verdict.reason}"
    )
    return outcome | {
        "status": "accepted" if verdict.accepted else "refused",
        "reason": verdict.reason,
        "auc": report.auc,
        "auc_low": report.auc_low,
        "mlflow_run": run_id,
        "version": version,
    }


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


def arm_satisfaction(
    settings: Settings,
    clients: Clients,
    line: str,
    adapters: Sequence[str | None],
    since: datetime,
    until: datetime,
    bound: LookBound | None = None,
    *,
    arm_labels: Sequence[str] | None = None,
) -> tuple[dict[str | None, SatisfactionSample], str]:
    """Each arm's satisfaction data over ``[since, until)``: the line's newest accepted
    satisfaction model's score on every answer a look counts (within ``bound``: each user's
    first few, each key within its share; cached by request id), and the reviews'
    verdicts. Without an accepted model every score is 0, so the estimate is the reviews'
    alone (still valid, just wider). Returns the samples (by adapter; with ``arm_labels``,
    one per adapter, by the arm label the gateway recorded, as an experiment's arms) and
    which model scored them."""
    import numpy as np

    from eval.satisfaction_model import SatisfactionModel
    from feedback.online import arm_answers
    from training.base_model import ensure_base_model

    found = clients.registry.satisfaction_model_path(line)
    model = SatisfactionModel.load(found[1]) if found is not None else None
    scorer = f"{line} satisfaction model v{found[0]}" if found is not None else "reviews alone"
    cache_path = settings.home / "satisfaction" / f"{line}-v{found[0] if found else 0}.json"
    cache: dict[str, float] = {}
    if model is not None and cache_path.is_file():
        cache = json.loads(cache_path.read_text())
    samples: dict[str | None, SatisfactionSample] = {}
    in_window: set[str] = set()
    arms: list[tuple[str | None, str | None]] = (
        list(zip(adapters, arm_labels, strict=True))
        if arm_labels is not None
        else [(adapter, None) for adapter in dict.fromkeys(adapters)]
    )
    for adapter, label in arms:
        answers = arm_answers(clients.store.engine, line, adapter, since, until, bound, arm=label)
        in_window.update(a.request_id for a in answers)
        if model is not None:
            missing = [a for a in answers if a.request_id not in cache]
            if missing:
                reader = reader_for(ensure_base_model(settings.models_dir, settings.base_model))
                scores = model.predict(
                    reader.features([(_prompt_of(a.messages), a.response) for a in missing])
                )
                cache.update({a.request_id: float(s) for a, s in zip(missing, scores, strict=True)})
        score = {a.request_id: cache.get(a.request_id, 0.0) for a in answers}
        reviewed = [a for a in answers if a.passed is not None]
        samples[label if label is not None else adapter] = SatisfactionSample.of(
            np.array([score[a.request_id] for a in answers if a.passed is None]),
            np.array([score[a.request_id] for a in reviewed]),
            np.array([1.0 if a.passed else 0.0 for a in reviewed]),
        )
    if model is not None:
        # Only this window's scores are kept: a new canary share starts a new window, so the
        # file stays the size of one window, not of every answer ever scored.
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_text(json.dumps({rid: cache[rid] for rid in in_window if rid in cache}))
    return samples, scorer


def reader_for(base_dir: Path) -> Any:
    """The base model reading answers for satisfaction models, loaded once per process."""
    from eval.satisfaction_model import AnswerReader

    if base_dir not in _READERS:
        _READERS[base_dir] = AnswerReader(base_dir)
    return _READERS[base_dir]


def _prompt_of(messages: Sequence[dict[str, Any]]) -> tuple[dict[str, str], ...]:
    """The conversation the answer came in (every message before it), as the model reads it."""
    return tuple({"role": str(m.get("role")), "content": str(m.get("content"))} for m in messages)


def silent_labelling(settings: Settings, clients: Clients, line: str) -> Any:
    """The line's newest accepted satisfaction model as a labeller of silent answers, when its
    recipe lets model labels in (``satisfaction_model.pseudo_labels``); else None."""
    from eval.satisfaction_model import SatisfactionModel
    from feedback.cleaning import SilentLabelling
    from training.base_model import ensure_base_model

    policy = recipe_for(settings, line).satisfaction_model
    if not (policy.enabled and policy.pseudo_labels):
        return None
    found = clients.registry.satisfaction_model_path(line)
    if found is None:
        return None
    version, path = found
    model = SatisfactionModel.load(path)

    def score(records: list[dict[str, Any]]) -> Sequence[float]:
        reader = reader_for(ensure_base_model(settings.models_dir, settings.base_model))
        items = [(_prompt_of(r["messages"]), str(r["response"])) for r in records]
        return model.predict(reader.features(items)).tolist()

    return SilentLabelling(
        model=f"{line}-satisfaction-v{version}",
        score=score,
        confidence=policy.confidence,
        max_share=policy.max_model_share,
        weight=policy.model_weight,
        positives=policy.label_positives,
        sample=best_of_sampler(settings, clients, line, policy) if policy.best_of_n else None,
        best_of_prompts=policy.best_of_prompts,
        min_gap=policy.best_of_min_gap,
    )


def best_of_sampler(
    settings: Settings, clients: Clients, line: str, policy: SatisfactionModelPolicy
) -> Callable[[list[dict[str, Any]]], list[list[str]]]:
    """Best-of-n's offline sampling: ``policy.best_of_n`` answers to each record's prompt from
    what serves the line now (its champion adapter, else the base model), on a replica that
    holds the line. A prompt whose sampling fails gets no answers (logged): best-of-n is extra
    data, never a reason for the night to fail."""
    from registry.placement import placed

    table = clients.routes.table(line)
    url = placed(table, settings.gateway.upstreams)[0]

    def sample(records: list[dict[str, Any]]) -> list[list[str]]:
        return asyncio.run(_sample_all(url, table.champion, settings, records, policy))

    return sample


async def _sample_all(
    url: str,
    adapter: str | None,
    settings: Settings,
    records: list[dict[str, Any]],
    policy: SatisfactionModelPolicy,
) -> list[list[str]]:
    import httpx

    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=300) as client:
        model = adapter or settings.gateway.base_model_name or await _served_base(client)
        if model is None:
            logger.warning("best-of-n: %s serves no base model; nothing sampled", url)
            return [[] for _ in records]
        gate = asyncio.Semaphore(8)

        async def one(record: dict[str, Any]) -> list[str]:
            body = {
                "model": model,
                "messages": [
                    {"role": m["role"], "content": m["content"]} for m in record["messages"]
                ],
                "n": policy.best_of_n,
                "max_tokens": policy.best_of_max_tokens,
                "temperature": policy.best_of_temperature,
                "seed": int(hashlib.sha256(str(record["request_id"]).encode()).hexdigest()[:8], 16),
            }
            async with gate:
                try:
                    response = await client.post("/v1/chat/completions", json=body)
                    response.raise_for_status()
                    choices = response.json()["choices"]
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    logger.warning("best-of-n: sampling failed on %s: %s", model, exc)
                    return []
            return [str(c["message"].get("content") or "") for c in choices]

        return list(await asyncio.gather(*(one(r) for r in records)))


async def _served_base(client: Any) -> str | None:
    """The base model's name as vLLM serves it (the model without a parent)."""
    import httpx

    try:
        models = (await client.get("/v1/models")).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    return next((str(m["id"]) for m in models if not m.get("parent")), None)
