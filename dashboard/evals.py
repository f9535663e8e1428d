"""Eval review: the line's training runs in MLflow as a data scientist reads them.

Per run: the gate's verdict and every reason, candidate and champion metrics
side by side with the n and 95% interval of each share (a run the gate did not
judge, on too few held-out pairs, shows "not judged: n=4 < 100" in place of its
pair accuracies), the registered version with its aliases (champion, canary,
previous, candidate) and rollback or promotion notes, the sample generations of
both models (the ``eval/samples.json`` table the registry logs), and links to the
run and version pages of the MLflow UI. Runs are read through one explicit
``MlflowClient`` (never MLflow's global tracking URI) and kept for a few seconds;
a finished run's sample table never changes, so it is kept for good.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eval.reports import PAIR_METRICS
from registry.names import experiment_name, model_name
from registry.records import (
    EVAL_PREFIX,
    INTERVAL_SUFFIXES,
    NOT_JUDGED,
    PREFERENCE_DIFFERENCE,
    TAG_FORGOTTEN_USER_DATA,
    TAG_FORGOTTEN_USER_DATA_AT,
    TAG_GATE_DECISION,
    TAG_GATE_REASONS,
    TAG_GATE_SUMMARY,
    TAG_REGISTERED_VERSION,
    eval_metric,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient

SAMPLES_ARTIFACT = "eval/samples.json"
METRIC_ORDER = (
    "preference_accuracy",
    "mean_margin",
    "preferred_loss",
    "general_loss",
    "refusal_rate",
    "mean_answer_length",
    "pii_in_generations",
    "canaries_in_generations",
    "pairs",
)


@dataclass(frozen=True, slots=True)
class EvalSample:
    """One prompt with the champion's and the candidate's answers (scrubbed for display)."""

    prompt: str
    champion_answer: str | None
    candidate_answer: str | None
    champion_refused: bool | None
    candidate_refused: bool | None
    flags: str


@dataclass(frozen=True, slots=True)
class Spread:
    """A share's n and 95% interval, candidate and champion, and for preference accuracy
    the paired difference (value, low, high); ``None`` where the run did not log it."""

    n: int | None
    candidate: tuple[float, float] | None
    champion: tuple[float, float] | None
    difference: tuple[float, float, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "n": self.n,
            "candidate": list(self.candidate) if self.candidate else None,
            "champion": list(self.champion) if self.champion else None,
            "difference": list(self.difference) if self.difference else None,
        }


@dataclass(frozen=True, slots=True)
class EvalRun:
    """One training run with its offline evaluation and what became of it."""

    run_id: str
    experiment_id: str
    name: str
    started_at: datetime
    status: str
    method: str | None
    dataset_hash: str | None
    gate: str | None
    reasons: tuple[str, ...]
    metrics: tuple[tuple[str, float | None, float | None], ...]
    version: int | None
    aliases: tuple[str, ...]
    version_notes: tuple[str, ...]
    gate_summary: str | None = None
    spreads: tuple[tuple[str, Spread], ...] = ()

    @property
    def judged(self) -> bool:
        """False when the gate had too few held-out pairs to compare the models."""
        return self.gate != NOT_JUDGED

    @property
    def verdict(self) -> str | None:
        """The gate's verdict as shown: ``promote``, ``reject``, ``not judged: n=4 < 100``."""
        if not self.judged:
            return self.gate_summary or NOT_JUDGED
        return self.gate

    @property
    def compared_metrics(self) -> tuple[tuple[str, float | None, float | None], ...]:
        """The metrics to draw side by side: without the pair metrics of a run the gate did
        not judge (4 of 4 against 0 of 4 drawn as 100% against 0% says what it cannot)."""
        return tuple(row for row in self.metrics if self.shows(row[0]))

    def shows(self, name: str) -> bool:
        """Whether the metric's numbers are shown: not a pair metric of a run not judged."""
        return self.judged or name not in PAIR_METRICS

    def metric(self, name: str) -> tuple[float | None, float | None]:
        """(candidate, champion) values of one metric."""
        for metric, candidate, champion in self.metrics:
            if metric == name:
                return candidate, champion
        return None, None

    def spread(self, name: str) -> Spread | None:
        """One share's n and intervals, if the run logged them."""
        return next((found for metric, found in self.spreads if metric == name), None)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "run_id": self.run_id,
            "name": self.name,
            "started_at": self.started_at.isoformat(),
            "status": self.status,
            "method": self.method,
            "dataset_hash": self.dataset_hash,
            "gate": self.gate,
            "gate_summary": self.gate_summary,
            "judged": self.judged,
            "reasons": list(self.reasons),
            "metrics": [{"metric": m, "candidate": a, "champion": b} for m, a, b in self.metrics],
            "intervals": {name: found.as_dict() for name, found in self.spreads},
            "version": self.version,
            "aliases": list(self.aliases),
            "version_notes": list(self.version_notes),
        }


def metric_rows(metrics: dict[str, float]) -> tuple[tuple[str, float | None, float | None], ...]:
    """``(metric, candidate, champion)`` from a run's ``eval.candidate.*``/``eval.champion.*``
    metrics (``candidate.*``/``champion.*`` in runs logged before), known metrics first; a
    share's n and interval bounds are :func:`metric_spreads`' (pure)."""
    sides = ("candidate.", "champion.")
    names = {
        key.removeprefix(EVAL_PREFIX).split(".", 1)[1]
        for key in metrics
        if key.removeprefix(EVAL_PREFIX).startswith(sides)
    }
    names -= {
        name
        for name in names
        for suffix in INTERVAL_SUFFIXES
        if name.endswith(suffix) and name.removesuffix(suffix) in names
    }
    rank = {name: i for i, name in enumerate(METRIC_ORDER)}
    ordered = sorted(names, key=lambda n: (rank.get(n, len(rank)), n))
    return tuple(
        (name, eval_metric(metrics, "candidate", name), eval_metric(metrics, "champion", name))
        for name in ordered
    )


def metric_spreads(metrics: dict[str, float]) -> tuple[tuple[str, Spread], ...]:
    """The n and 95% intervals a run logged (``eval.<side>.<metric>_n/_low/_high``, and the
    paired difference of preference accuracy), by metric (pure)."""

    def bounds(side: str, name: str) -> tuple[float, float] | None:
        low = metrics.get(f"{EVAL_PREFIX}{side}.{name}_low")
        high = metrics.get(f"{EVAL_PREFIX}{side}.{name}_high")
        return None if low is None or high is None else (low, high)

    found = []
    for name, _, _ in metric_rows(metrics):
        candidate, champion = bounds("candidate", name), bounds("champion", name)
        if candidate is None and champion is None:
            continue
        n = metrics.get(f"{EVAL_PREFIX}candidate.{name}_n")
        if n is None:
            n = metrics.get(f"{EVAL_PREFIX}champion.{name}_n")
        difference = None
        key = f"{EVAL_PREFIX}{PREFERENCE_DIFFERENCE}"
        if name == "preference_accuracy" and key in metrics:
            low, high = metrics.get(f"{key}_low"), metrics.get(f"{key}_high")
            if low is not None and high is not None:
                difference = (metrics[key], low, high)
        found.append((name, Spread(None if n is None else int(n), candidate, champion, difference)))
    return tuple(found)


def samples_of_table(table: dict[str, Any]) -> list[EvalSample]:
    """Rows of an MLflow table artifact (``{"columns": [...], "data": [[...]]}``) (pure)."""
    columns = list(table.get("columns") or [])
    samples = []
    for values in table.get("data") or []:
        row = dict(zip(columns, values, strict=False))
        samples.append(
            EvalSample(
                prompt=str(row.get("prompt") or ""),
                champion_answer=row.get("champion_answer"),
                candidate_answer=row.get("candidate_answer"),
                champion_refused=row.get("champion_refused"),
                candidate_refused=row.get("candidate_refused"),
                flags=str(row.get("candidate_flags") or ""),
            )
        )
    return samples


class EvalReview:
    """Reads a line's runs, versions and eval tables from MLflow."""

    def __init__(
        self,
        tracking_uri: str,
        ui_url: str | None,
        *,
        client_factory: Callable[[], MlflowClient] | None = None,
        ttl_s: float = 15.0,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.ui_url = ui_url
        self._factory = client_factory
        self._client: MlflowClient | None = None
        self._ttl_s = ttl_s
        self._runs: dict[str, tuple[float, list[EvalRun]]] = {}
        self._samples: dict[str, list[EvalSample]] = {}
        self._lock = threading.Lock()

    def available(self) -> bool:
        """False for a local MLflow store that was never created (no training yet)."""
        if self.tracking_uri.startswith("sqlite:///"):
            return Path(self.tracking_uri.removeprefix("sqlite:///").split("?", 1)[0]).exists()
        return True

    def _mlflow(self) -> MlflowClient:
        if self._client is None:
            if self._factory is not None:
                self._client = self._factory()
            else:
                from mlflow import MlflowClient

                self._client = MlflowClient(
                    tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri
                )
        return self._client

    def runs(self, business_line: str, limit: int = 20) -> list[EvalRun]:
        """The line's newest training runs with their evaluations, newest first."""
        if not self.available():
            return []
        now = time.monotonic()
        with self._lock:
            cached = self._runs.get(business_line)
        if cached is not None and now - cached[0] < self._ttl_s:
            return cached[1]
        found = self._read_runs(business_line, limit)
        with self._lock:
            self._runs[business_line] = (now, found)
        return found

    def _read_runs(self, business_line: str, limit: int) -> list[EvalRun]:
        from mlflow.exceptions import MlflowException

        client = self._mlflow()
        experiment = client.get_experiment_by_name(experiment_name(business_line))
        if experiment is None:
            return []
        versions: dict[int, Any] = {}
        aliases: dict[int, list[str]] = {}
        try:
            model = client.get_registered_model(model_name(business_line))
            for alias, version in model.aliases.items():
                aliases.setdefault(int(version), []).append(alias)
            for found in client.search_model_versions(f"name = '{model_name(business_line)}'"):
                versions[int(found.version)] = found
        except MlflowException:
            pass  # nothing registered yet for this line
        runs = client.search_runs(
            [experiment.experiment_id], order_by=["attributes.start_time DESC"], max_results=limit
        )
        result = []
        for run in runs:
            tags = run.data.tags
            registered = tags.get(TAG_REGISTERED_VERSION)
            version = int(registered) if registered and registered.isdigit() else None
            notes: list[str] = []
            if version is not None and version in versions:
                version_tags = versions[version].tags or {}
                for key in ("promoted_reason", "rolled_back"):
                    if version_tags.get(key) and version_tags[key] != "-":
                        notes.append(f"{key.replace('_', ' ')}: {version_tags[key]}")
            if tags.get(TAG_FORGOTTEN_USER_DATA) == "true":
                day = tags.get(TAG_FORGOTTEN_USER_DATA_AT, "")
                notes.append(f"trained on data of a user forgotten {day}: retrain or retire")
            reasons = tags.get(TAG_GATE_REASONS)
            result.append(
                EvalRun(
                    run_id=run.info.run_id,
                    experiment_id=run.info.experiment_id,
                    name=run.info.run_name or run.info.run_id[:12],
                    started_at=datetime.fromtimestamp(run.info.start_time / 1000, tz=UTC),
                    status=run.info.status,
                    method=tags.get("flywheel.method"),
                    dataset_hash=tags.get("flywheel.dataset_hash"),
                    gate=tags.get(TAG_GATE_DECISION),
                    reasons=tuple(reasons.splitlines()) if reasons else (),
                    metrics=metric_rows(dict(run.data.metrics)),
                    version=version,
                    aliases=tuple(sorted(aliases.get(version, []))) if version else (),
                    version_notes=tuple(notes),
                    gate_summary=tags.get(TAG_GATE_SUMMARY),
                    spreads=metric_spreads(dict(run.data.metrics)),
                )
            )
        return result

    def samples(self, run_id: str) -> list[EvalSample]:
        """The run's sample generations, candidate beside champion (raw: scrub to show)."""
        with self._lock:
            if run_id in self._samples:
                return self._samples[run_id]
        from mlflow.exceptions import MlflowException

        client = self._mlflow()
        try:
            with tempfile.TemporaryDirectory(prefix="flywheel-eval-") as scratch:
                path = client.download_artifacts(run_id, SAMPLES_ARTIFACT, scratch)
                table = json.loads(Path(path).read_text(encoding="utf-8"))
        except (MlflowException, OSError, ValueError):
            return []
        found = samples_of_table(table)
        with self._lock:
            self._samples[run_id] = found
        return found

    def run_url(self, run: EvalRun) -> str | None:
        """The run's page in the MLflow UI."""
        if not self.ui_url:
            return None
        return f"{self.ui_url}/#/experiments/{run.experiment_id}/runs/{run.run_id}"

    def version_url(self, business_line: str, version: int) -> str | None:
        """The registered version's page in the MLflow UI."""
        if not self.ui_url:
            return None
        return f"{self.ui_url}/#/models/{model_name(business_line)}/versions/{version}"
