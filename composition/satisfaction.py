"""A line's satisfaction model in the night and in the canary's looks.

- ``train_satisfaction_model``: the nightly stage that trains the line's model on its
  labelled answers, judges it (:mod:`eval.satisfaction_training`) and records it in
  MLflow; the night goes on whatever it decides.
- ``arm_satisfaction``: each arm's answers scored by the line's accepted model and their
  users' own signals, with the reviews' verdicts (the canary's and the experiments'
  prediction-powered estimate).
- ``silent_labelling``: the accepted model as a labeller of silent answers, with
  best-of-n sampling from what serves the line (``best_of_sampler``).
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
from composition.recipes import Recipe, recipe_for
from feedback.contributions import LookBound
from flywheel.settings import Settings
from registry.ppi import SatisfactionSample, informed_scores, strongest_signal, user_signal_pull

if TYPE_CHECKING:
    from eval.satisfaction import SatisfactionModelPolicy, SatisfactionModelVerdict
    from eval.satisfaction_training import JudgedModel
    from feedback.records import FeedbackRecord

logger = logging.getLogger(__name__)


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
    from eval.satisfaction import judge_satisfaction_model, single_class_reason
    from eval.satisfaction_training import fit_and_judge, labelled_splits, reader_for
    from training.base_model import ensure_base_model

    policy = recipe_for(settings, line).satisfaction_model
    if not policy.enabled:
        return {"status": "off", "reason": "the recipe's satisfaction_model is not enabled"}
    train, heldout = labelled_splits(settings, line, dataset_hash, policy.max_examples)
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
    judged = fit_and_judge(reader, train, heldout, policy)
    outcome["judged_on"] = judged.judged_on
    verdict = judge_satisfaction_model(judged.report, policy)
    run_id, version = _record(clients, line, dataset_hash, reader.base_model, judged, verdict)
    log(
        f"satisfaction model of {line} {'accepted' if verdict.accepted else 'refused'}: "
        f"{verdict.reason}"
    )
    return outcome | {
        "status": "accepted" if verdict.accepted else "refused",
        "reason": verdict.reason,
        "auc": judged.report.auc,
        "auc_low": judged.report.auc_low,
        "mlflow_run": run_id,
        "version": version,
    }


def _record(
    clients: Clients,
    line: str,
    dataset_hash: str,
    base_model: str,
    judged: JudgedModel,
    verdict: SatisfactionModelVerdict,
) -> tuple[str, int | None]:
    """The judged model in MLflow, with its reliability plot: (run id, registered version)."""
    from eval.satisfaction_training import reliability_plot

    report = judged.report
    with tempfile.TemporaryDirectory(prefix="flywheel-satisfaction-") as scratch:
        folder = Path(scratch)
        judged.model.save(folder / "model.npz")
        if report.calibration is not None:
            reliability_plot(report, folder / "reliability.png", line)
        return clients.registry.log_satisfaction_model(
            line,
            dataset_hash=dataset_hash,
            base_model=base_model,
            metrics=report.metrics(),
            accepted=verdict.accepted,
            reason=f"{verdict.reason} (judged on {judged.judged_on})",
            model_dir=folder,
        )


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
    first few, each key within its share; cached by request id), moved towards what the
    answer's user said where they said something (:func:`registry.ppi.informed_scores`), and
    the reviews' verdicts. Without an accepted model a silent answer's score is 0, so the
    estimate rests on the users' signals and the reviews (still valid, just wider). Returns
    the samples (by adapter; with ``arm_labels``, one per adapter, by the arm label the
    gateway recorded, as an experiment's arms) and what scored them."""
    import numpy as np

    from eval.satisfaction_model import SatisfactionModel
    from eval.satisfaction_training import prompt_of, reader_for
    from feedback.online import arm_answers
    from training.base_model import ensure_base_model

    found = clients.registry.satisfaction_model_path(line)
    model = SatisfactionModel.load(found[1]) if found is not None else None
    scorer = (
        f"{line} satisfaction model v{found[0]} and the users' signals"
        if found is not None
        else "the users' signals (no accepted satisfaction model)"
    )
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
                    reader.features([(prompt_of(a.messages), a.response) for a in missing])
                )
                cache.update({a.request_id: float(s) for a, s in zip(missing, scores, strict=True)})
        # The model's score (cached: fixed per answer), then the user's own signal folded in
        # at each look (a signal may come after the answer was first scored).
        pulls = [user_signal_pull(strongest_signal(a.signals)) for a in answers]
        informed = informed_scores(
            [cache.get(a.request_id, 0.0) for a in answers],
            [pull for pull, _ in pulls],
            [towards for _, towards in pulls],
        )
        score = dict(zip((a.request_id for a in answers), informed.tolist(), strict=True))
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


def unused_model_labels(recipe: Recipe) -> str | None:
    """Why the recipe would train on none of the model's labels of silent answers, or None
    when it may: without ``label_positives`` and best-of-n they are negative KTO labels only,
    which an SFT recipe, or a DPO one that never falls back to KTO, never reads."""
    policy = recipe.satisfaction_model
    if policy.label_positives or policy.best_of_n:
        return None
    if recipe.method == "kto" or (recipe.method == "dpo" and recipe.kto_below_pairs is not None):
        return None
    return (
        f"silent answers not labelled: the model's labels would be negative KTO labels only, "
        f"and {recipe.method} without a KTO fallback trains on none of them "
        f"(label_positives or best_of_n would use them)"
    )


def silent_labelling(settings: Settings, clients: Clients, line: str) -> Any:
    """The line's newest accepted satisfaction model as a labeller of silent answers, when its
    recipe lets model labels in (``satisfaction_model.pseudo_labels``) and would train on what
    it labels (:func:`unused_model_labels`); else None."""
    from eval.satisfaction_model import SatisfactionModel
    from eval.satisfaction_training import prompt_of
    from feedback.cleaning import SilentLabelling
    from training.base_model import ensure_base_model

    recipe = recipe_for(settings, line)
    policy = recipe.satisfaction_model
    if not (policy.enabled and policy.pseudo_labels):
        return None
    # Reading every silent answer with the base model is most of a quiet night's cleaning
    # (6 of a medical night's 12 minutes on 2 cores): not done for labels nothing trains on.
    unused = unused_model_labels(recipe)
    if unused is not None:
        logger.info("%s: %s", line, unused)
        return None
    found = clients.registry.satisfaction_model_path(line)
    if found is None:
        return None
    version, path = found
    model = SatisfactionModel.load(path)

    def score(records: list[FeedbackRecord]) -> Sequence[float]:
        from eval.satisfaction_training import reader_for

        reader = reader_for(ensure_base_model(settings.models_dir, settings.base_model))
        items = [(prompt_of(r.messages), r.response) for r in records]
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
) -> Callable[[list[FeedbackRecord]], list[list[str]]]:
    """Best-of-n's offline sampling: ``policy.best_of_n`` answers to each record's prompt from
    what serves the line now (its champion adapter, else the base model), on a replica that
    holds the line. A prompt whose sampling fails gets no answers (logged): best-of-n is extra
    data, never a reason for the night to fail."""
    from registry.placement import placed

    table = clients.routes.table(line)
    url = placed(table, settings.gateway.upstreams)[0]

    def sample(records: list[FeedbackRecord]) -> list[list[str]]:
        return asyncio.run(_sample_all(url, table.champion, settings, records, policy))

    return sample


async def _sample_all(
    url: str,
    adapter: str | None,
    settings: Settings,
    records: list[FeedbackRecord],
    policy: SatisfactionModelPolicy,
) -> list[list[str]]:
    import httpx

    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=300) as client:
        model = adapter or settings.gateway.base_model_name or await _served_base(client)
        if model is None:
            logger.warning("best-of-n: %s serves no base model; nothing sampled", url)
            return [[] for _ in records]
        gate = asyncio.Semaphore(8)

        async def one(record: FeedbackRecord) -> list[str]:
            body = {
                "model": model,
                "messages": [{"role": m["role"], "content": m["content"]} for m in record.messages],
                "n": policy.best_of_n,
                "max_tokens": policy.best_of_max_tokens,
                "temperature": policy.best_of_temperature,
                "seed": int(hashlib.sha256(record.request_id.encode()).hexdigest()[:8], 16),
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
