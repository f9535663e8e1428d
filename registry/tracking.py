"""Training runs and adapter versions in MLflow: experiments, the model registry, aliases.

One experiment per business line (``flywheel/<line>``) holds a run per training;
one registered model per line (``flywheel-<line>``) holds the adapter versions,
with lineage tags and the aliases ``candidate``, ``champion`` and ``previous``
(stages are deprecated in MLflow and never used).

Everything goes through one explicit :class:`mlflow.MlflowClient`; nothing here
sets MLflow's global tracking URI, so two registries (a test's and the user's)
never leak into each other.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse
from urllib.request import url2pathname

from mlflow import MlflowClient
from mlflow.entities import (
    Dataset,
    DatasetInput,
    InputTag,
    LoggedModelOutput,
    Metric,
    Param,
    RunTag,
)
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from eval.reports import EvalReport, GateDecision
from flywheel.errors import FlywheelError
from flywheel.file_modes import open_private, private_dir
from registry.names import adapter_name, experiment_name, model_name, training_run_name
from registry.plots import comparison_plot
from registry.records import (
    EVAL_PREFIX,
    TAG_BASE_MODEL,
    TAG_CODE_VERSION,
    TAG_DATASET_HASH,
    TAG_ENDED_BECAUSE,
    TAG_GATE_DECISION,
    TAG_LINE,
    TAG_METHOD,
    TAG_RECIPE_HASH,
    TAG_REGISTERED_VERSION,
    TAG_TRAINER,
    CanaryRecord,
    FlaggedModels,
    Promotion,
    Rollback,
    RunSummary,
    checked_lineage,
    dataset_digest,
    eval_metrics,
    forgotten_tags,
    gate_tags,
    gate_text,
    history_metrics,
    metrics_table,
    samples_table,
    summarize_run,
    trainer_is_gone,
    truncate,
)

RunStatus = Literal["FINISHED", "FAILED", "KILLED"]
ADAPTER_ARTIFACT = "adapter"
LOGGED_MODEL_TYPE = "peft-lora-adapter"
TAG_LOGGED_MODEL = "flywheel.logged_model_id"
TAG_SATISFACTION_VERDICT = "flywheel.satisfaction.verdict"
TAG_SATISFACTION_REASON = "flywheel.satisfaction.reason"
EVAL_ARTIFACTS = "eval"
ADAPTER_CONFIG = "adapter_config.json"

# MLflow's batch limits (mlflow.utils.validation): params and metrics per log_batch call.
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1_000


class VersionNotFoundError(FlywheelError):
    """A registered model has no such version (or the line has no registered model)."""


def tracking_uri_for(home: Path, configured: str | None) -> str:
    """The MLflow tracking URI: the configured one, or SQLite under ``home/mlflow``.

    The model registry needs a database backend, so the local default is
    SQLite rather than MLflow's ``./mlruns`` file store.
    """
    if configured:
        return configured
    return f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"


def artifact_root_for(home: Path) -> Path:
    """Where run artifacts (adapters, eval tables, plots) go with the local store."""
    return home / "mlflow" / "artifacts"


def _is_remote(tracking_uri: str) -> bool:
    return urlparse(tracking_uri).scheme in {"http", "https", "databricks"}


def _local_path(uri: str) -> Path | None:
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path))
    if parsed.scheme == "":
        return Path(uri)
    return None


def _error_code(exc: MlflowException) -> str:
    return str(getattr(exc, "error_code", ""))


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@contextmanager
def _schema_setup_quiet() -> Iterator[None]:
    """MLflow's own INFO lines while it creates or upgrades a SQLite schema ("Creating initial
    MLflow database tables...") held back: they reached every first command's terminal."""
    loggers = [logging.getLogger(name) for name in ("mlflow.store.db.utils", "alembic")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class Registry:
    """Flywheel's training runs and adapter versions in one MLflow tracking store.

    ``artifact_root`` is where new experiments keep their artifacts (a folder or
    a URI); leave it ``None`` against a tracking server so the server's own
    ``--artifacts-destination`` applies. ``download_dir`` is where adapters are
    fetched for serving, digest-checked (:func:`registry.delivery.fetch_adapter`);
    without one, a local store's adapter folders are checked and used in place.
    """

    def __init__(
        self,
        tracking_uri: str,
        artifact_root: Path | str | None = None,
        *,
        download_dir: Path | None = None,
        client: MlflowClient | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.artifact_root = artifact_root
        self.download_dir = download_dir
        if tracking_uri.startswith("sqlite:///") and client is None:
            # SQLite creates the file but not its folder.
            database = Path(tracking_uri.removeprefix("sqlite:///").split("?", 1)[0])
            # Owner-only: runs hold eval samples (users' prompts and answers).
            private_dir(database.parent)
            os.close(open_private(database, os.O_RDWR | os.O_CREAT))
            lock = open_private(database.with_name(database.name + ".lock"), os.O_RDWR | os.O_CREAT)
            try:
                # MLflow creates (or upgrades) its schema on first use; two processes doing it
                # at once on a new file fail in its migrations (training workers of a pool).
                fcntl.flock(lock, fcntl.LOCK_EX)
                with _schema_setup_quiet():
                    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
                    client.search_experiments(max_results=1)
                    client.search_registered_models(max_results=1)
            finally:
                os.close(lock)  # closing the descriptor releases the lock
        self.client = client or MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        self._experiments: dict[str, str] = {}

    @classmethod
    def for_home(cls, home: Path, tracking_uri: str | None = None) -> Registry:
        """The registry of a flywheel home: local SQLite unless ``tracking_uri`` is set."""
        uri = tracking_uri_for(home, tracking_uri)
        root = None if _is_remote(uri) else artifact_root_for(home)
        return cls(uri, root, download_dir=home / "mlflow" / "downloads")

    def experiment_id(self, line: str) -> str:
        """The id of the line's experiment, created (with its artifact location) if missing."""
        if line in self._experiments:
            return self._experiments[line]
        name = experiment_name(line)
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            try:
                experiment_id = self.client.create_experiment(
                    name,
                    artifact_location=self._artifact_location(line),
                    tags={TAG_LINE: line},
                )
            except MlflowException as exc:
                # Another line's flow (or a second worker) created it first.
                if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                    raise
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
                experiment_id = experiment.experiment_id
        elif experiment.lifecycle_stage == "deleted":
            raise FlywheelError(
                f"MLflow experiment {name!r} is deleted; restore it "
                f"(mlflow experiments restore --experiment-id {experiment.experiment_id}) "
                "or delete it for good (mlflow gc)"
            )
        else:
            experiment_id = experiment.experiment_id
        self._experiments[line] = experiment_id
        return experiment_id

    def _artifact_location(self, line: str) -> str | None:
        if self.artifact_root is None:
            return None
        root = str(self.artifact_root)
        if isinstance(self.artifact_root, Path) or _local_path(root) is not None:
            local = _local_path(root) or Path(root)
            return (local.resolve() / line).as_uri()
        return f"{root.rstrip('/')}/{line}"

    def start_training_run(
        self,
        line: str,
        *,
        method: str,
        recipe_hash: str,
        recipe_params: Mapping[str, str],
        dataset_hash: str,
        dataset_manifest_path: Path,
        base_model: str,
        code_version: str,
    ) -> str:
        """Open a run for one training of ``line``; returns its run id.

        Logs the recipe's params, lineage as tags (the recipe by its hash), and the
        dataset as a run input whose digest is the manifest's content hash and whose
        source is the manifest's path.
        """
        from mlflow.data.dataset_source_registry import get_dataset_source_from_json
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        tags = {
            TAG_LINE: line,
            TAG_DATASET_HASH: dataset_hash,
            TAG_RECIPE_HASH: recipe_hash,
            TAG_BASE_MODEL: base_model,
            TAG_CODE_VERSION: code_version,
            TAG_METHOD: method,
            TAG_TRAINER: f"{os.uname().nodename}:{os.getpid()}",
        }
        run = self.client.create_run(
            self.experiment_id(line),
            run_name=training_run_name(line, method, dataset_hash),
            tags={key: truncate(value) for key, value in tags.items()},
        )
        run_id = str(run.info.run_id)
        params = [Param(key, value) for key, value in recipe_params.items()]
        for chunk in _chunks(params, _PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=list(chunk))
        manifest = dataset_manifest_path.resolve()
        source = get_dataset_source_from_json(json.dumps({"uri": str(manifest)}), "local")
        # MetaDataset leaves Dataset's abstract ``profile`` unimplemented; it works at runtime.
        dataset = MetaDataset(  # type: ignore[abstract]
            source, name=f"{line}-{dataset_hash[:12]}", digest=dataset_digest(dataset_hash)
        ).to_dict()
        self.client.log_inputs(
            run_id,
            datasets=[
                DatasetInput(
                    Dataset(
                        name=dataset["name"],
                        digest=dataset["digest"],
                        source_type=dataset["source_type"],
                        source=dataset["source"],
                    ),
                    tags=[InputTag(MLFLOW_DATASET_CONTEXT, "train")],
                )
            ],
        )
        return run_id

    def log_loss_curve(self, run_id: str, history: Sequence[Mapping[str, Any]]) -> int:
        """Log a trainer's ``log_history`` as metrics at their steps; returns the point count."""
        timestamp = int(time.time() * 1000)
        metrics = [Metric(p.key, p.value, timestamp, p.step) for p in history_metrics(history)]
        for chunk in _chunks(metrics, _METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=list(chunk))
        return len(metrics)

    def log_metrics(self, run_id: str, metrics: Mapping[str, float]) -> None:
        """Log single-value metrics (e.g. training time, throughput, peak memory)."""
        stamp = int(time.time() * 1000)
        batch = [Metric(key, float(value), stamp, 0) for key, value in metrics.items()]
        self.client.log_batch(run_id, metrics=batch)

    def log_evaluation(
        self,
        run_id: str,
        candidate: EvalReport,
        champion: EvalReport,
        decision: GateDecision,
    ) -> None:
        """Record an offline evaluation and the gate's decision on the run.

        Metrics side by side as ``eval.candidate.*`` and ``eval.champion.*``, shares with
        their n and 95% interval, the paired difference (:func:`registry.records.eval_metrics`);
        under ``eval/`` the metric table, the sample generations side by side, both reports,
        the comparison plot and the gate text; the decision (``promote``, ``reject``, ``not
        judged``), its summary and its reasons as ``gate.*`` tags.
        """
        timestamp = int(time.time() * 1000)
        model_id = self.logged_model_id(run_id)
        # The candidate's numbers belong to its model too (the LoggedModel's metrics page).
        metrics = [
            Metric(
                key,
                value,
                timestamp,
                0,
                model_id=model_id if key.startswith(f"{EVAL_PREFIX}candidate.") else None,
            )
            for key, value in eval_metrics(candidate, champion).items()
        ]
        tags = [RunTag(key, value) for key, value in gate_tags(decision).items()]
        self.client.log_batch(run_id, metrics=metrics, tags=tags)
        self._log_table(run_id, metrics_table(candidate, champion), "metrics.json")
        if candidate.samples or champion.samples:
            self._log_table(run_id, samples_table(candidate, champion), "samples.json")
        self.client.log_dict(run_id, candidate.as_dict(), f"{EVAL_ARTIFACTS}/candidate_report.json")
        self.client.log_dict(run_id, champion.as_dict(), f"{EVAL_ARTIFACTS}/champion_report.json")
        self.client.log_text(run_id, gate_text(decision), f"{EVAL_ARTIFACTS}/gate.txt")
        with tempfile.TemporaryDirectory(prefix="flywheel-plot-") as scratch:
            plot = comparison_plot(
                candidate, champion, Path(scratch) / "comparison.png", verdict=decision.summary
            )
            self.client.log_artifact(run_id, str(plot), EVAL_ARTIFACTS)

    def _log_table(self, run_id: str, table: dict[str, list[Any]], name: str) -> None:
        import pandas as pd

        # Object columns throughout: MLflow's table check otherwise warns on pandas 3 strings.
        frame = pd.DataFrame(table, dtype=object)
        self.client.log_table(run_id, frame, f"{EVAL_ARTIFACTS}/{name}")

    def log_adapter(self, run_id: str, adapter_dir: Path) -> str:
        """Log a trained adapter folder as an MLflow LoggedModel of the run (its files are
        the model's artifacts; vLLM loads that folder); returns the model id.

        Metrics the run logs afterwards for the candidate are linked to the model, and the
        registered version points at it, so ``models:/flywheel-<line>@champion`` resolves.
        Logging again for the same run returns the model logged first.
        """
        from mlflow.entities import LoggedModelStatus

        from registry.delivery import adapter_digest, delivery_tags

        if not (adapter_dir / ADAPTER_CONFIG).is_file():
            raise FlywheelError(f"{adapter_dir} is not an adapter folder: {ADAPTER_CONFIG} missing")
        run = self.client.get_run(run_id)
        existing = run.data.tags.get(TAG_LOGGED_MODEL)
        if existing:
            return existing
        tags = {
            key: run.data.tags[key]
            for key in (TAG_LINE, TAG_DATASET_HASH, TAG_BASE_MODEL, TAG_METHOD)
            if key in run.data.tags
        }
        # The digest covers flywheel_base.json too: the base it records cannot be swapped.
        tags.update(delivery_tags(adapter_dir, adapter_digest(adapter_dir)))
        model = self.client.create_logged_model(
            run.info.experiment_id,
            name=ADAPTER_ARTIFACT,
            source_run_id=run_id,
            tags=tags,
            model_type=LOGGED_MODEL_TYPE,
        )
        self.client.log_model_artifacts(model.model_id, str(adapter_dir))
        self.client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
        self._link_output(run_id, model.model_id)
        return model.model_id

    def _link_output(self, run_id: str, model_id: str) -> None:
        """The LoggedModel as the run's output (what MLflow's run page lists under "Logged
        models", as ``mlflow.<flavor>.log_model`` records it) and as the run's tag."""
        self.client.log_outputs(run_id, [LoggedModelOutput(model_id, step=0)])
        self.client.set_tag(run_id, TAG_LOGGED_MODEL, model_id)

    def log_satisfaction_model(
        self,
        line: str,
        *,
        dataset_hash: str,
        base_model: str,
        metrics: Mapping[str, float],
        accepted: bool,
        reason: str,
        model_dir: Path,
    ) -> tuple[str, int | None]:
        """Record one night's satisfaction model of ``line`` in the line's experiment: its
        held-out AUC and calibration as metrics, the verdict as tags, ``model_dir``'s files
        (the model, its reliability plot) as a LoggedModel; an accepted model becomes a
        version of ``flywheel-<line>-satisfaction``. Returns (run id, version or None)."""
        tags = {
            TAG_LINE: line,
            TAG_DATASET_HASH: dataset_hash,
            TAG_BASE_MODEL: base_model,
            TAG_SATISFACTION_VERDICT: "accepted" if accepted else "refused",
            TAG_SATISFACTION_REASON: truncate(reason),
        }
        run = self.client.create_run(
            self.experiment_id(line),
            run_name=f"{line}-satisfaction-{dataset_hash[:8]}",
            tags=tags,
        )
        run_id = str(run.info.run_id)
        try:
            version = self._record_satisfaction_model(
                run, line, tags, metrics, accepted, reason, model_dir
            )
        except BaseException:
            self.finish_run(run_id, "FAILED")
            raise
        self.finish_run(run_id)
        return run_id, version

    def _record_satisfaction_model(
        self,
        run: Any,
        line: str,
        tags: Mapping[str, str],
        metrics: Mapping[str, float],
        accepted: bool,
        reason: str,
        model_dir: Path,
    ) -> int | None:
        """The satisfaction run's metrics, verdict and LoggedModel; its version if accepted."""
        from mlflow.entities import LoggedModelStatus

        run_id = str(run.info.run_id)
        self.log_metrics(run_id, {f"satisfaction.{k}": v for k, v in metrics.items()})
        self.client.log_text(run_id, reason, "satisfaction/verdict.txt")
        model = self.client.create_logged_model(
            run.info.experiment_id,
            name="satisfaction_model",
            source_run_id=run_id,
            tags={key: tags[key] for key in (TAG_LINE, TAG_DATASET_HASH, TAG_BASE_MODEL)},
            model_type="flywheel-satisfaction-model",
        )
        self.client.log_model_artifacts(model.model_id, str(model_dir))
        self.client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
        self._link_output(run_id, model.model_id)
        if not accepted:
            return None
        name = f"{model_name(line)}-satisfaction"
        self._ensure_registered_model(
            line, name, f"Satisfaction models of the {line} business line"
        )
        with _global_tracking_uri(self.tracking_uri):
            created = self.client.create_model_version(
                name,
                source=f"models:/{model.model_id}",
                model_id=model.model_id,
                run_id=run_id,
                tags={k: v for k, v in tags.items() if k != TAG_SATISFACTION_REASON},
                description=truncate(reason),
            )
        version = int(created.version)
        self.client.set_tag(run_id, TAG_REGISTERED_VERSION, str(version))
        return version

    def satisfaction_model_path(self, line: str) -> tuple[int, Path] | None:
        """The newest accepted satisfaction model of ``line``: (version, local ``model.npz``),
        downloaded once under ``download_dir`` from a remote store; None when there is none."""
        name = f"{model_name(line)}-satisfaction"
        versions = self._versions(f"name = '{_safe(name)}'")
        if not versions:
            return None
        newest = max(versions, key=lambda v: int(v.version))
        version = int(newest.version)
        source = newest.source or ""
        if source.startswith("models:/"):
            source = self.client.get_logged_model(source.removeprefix("models:/")).artifact_location
        local = _local_path(source)
        if local is not None:
            return version, local / "model.npz"
        if self.download_dir is None:
            raise FlywheelError(f"{name} v{version} is stored at {source}; no download_dir")
        target = self.download_dir / f"{line}-satisfaction-v{version}"
        if not (target / "model.npz").is_file():
            target.mkdir(parents=True, exist_ok=True)
            _download_artifacts(
                artifact_uri=f"{source.rstrip('/')}/model.npz",
                dst_path=str(target),
                tracking_uri=self.tracking_uri,
            )
        return version, target / "model.npz"

    def logged_model_id(self, run_id: str) -> str | None:
        """The LoggedModel holding the run's adapter, if it logged one."""
        return self.client.get_run(run_id).data.tags.get(TAG_LOGGED_MODEL)

    def close_orphan_runs(self, line: str) -> list[str]:
        """Mark KILLED the line's runs left RUNNING by a trainer of this host that died.

        A run whose process was killed (SIGKILL, OOM, a lost node) stays RUNNING
        in MLflow for good; the next training of the line closes it, with why.
        """
        experiment = self.client.get_experiment_by_name(experiment_name(line))
        if experiment is None:
            return []
        closed = []
        host = os.uname().nodename
        for run in self.client.search_runs(
            [experiment.experiment_id], filter_string="attributes.status = 'RUNNING'"
        ):
            trainer = run.data.tags.get(TAG_TRAINER, "")
            if trainer_is_gone(trainer, host, _process_alive):
                self.client.set_tag(
                    run.info.run_id,
                    TAG_ENDED_BECAUSE,
                    f"its trainer {trainer} ended without closing the run",
                )
                self.client.set_terminated(run.info.run_id, "KILLED")
                closed.append(str(run.info.run_id))
        return closed

    def tag_run(self, run_id: str, key: str, value: str) -> None:
        """Set one tag on a run."""
        self.client.set_tag(run_id, key, value)

    def finish_run(self, run_id: str, status: RunStatus = "FINISHED") -> None:
        """Close the run with ``status`` (``FINISHED``, ``FAILED`` or ``KILLED``)."""
        self.client.set_terminated(run_id, status)

    def register_adapter(self, run_id: str, line: str, lineage: Mapping[str, object]) -> int:
        """Register the run's ``adapter/`` artifacts as a new version of ``flywheel-<line>``.

        ``lineage`` must carry ``base_model``, ``dataset_hash``, ``recipe_hash`` and
        ``code_version``; they become version tags. Registering the same run twice
        (a retried task) returns the version registered the first time.
        """
        tags = checked_lineage(lineage)
        name = model_name(line)
        already = self._versions(f"name = '{name}' and run_id = '{_safe(run_id)}'")
        if already:
            return max(int(v.version) for v in already)
        model_id = self.logged_model_id(run_id)
        if model_id is None:
            raise FlywheelError(f"run {run_id} logged no adapter to register")
        from registry.delivery import DELIVERY_TAGS

        logged = self.client.get_logged_model(model_id).tags or {}
        tags.update({key: logged[key] for key in DELIVERY_TAGS if logged.get(key)})
        self._ensure_registered_model(line)
        # MLflow's SQL registry resolves a models:/ source with a client on the global
        # tracking URI (its own TODO), not this one's: point it here for the call.
        with _global_tracking_uri(self.tracking_uri):
            created = self.client.create_model_version(
                name,
                source=f"models:/{model_id}",
                model_id=model_id,
                run_id=run_id,
                tags=tags,
                description=(
                    f"LoRA adapter of {line} trained on dataset {tags['dataset_hash'][:12]}"
                ),
            )
        version = int(created.version)
        self.client.set_tag(run_id, TAG_REGISTERED_VERSION, str(version))
        return version

    def _ensure_registered_model(
        self, line: str, name: str | None = None, description: str | None = None
    ) -> None:
        """Create the registered model ``name`` (default the line's adapters) if missing."""
        name = name or model_name(line)
        try:
            self.client.get_registered_model(name)
        except MlflowException as exc:
            if _error_code(exc) != "RESOURCE_DOES_NOT_EXIST":
                raise
            try:
                self.client.create_registered_model(
                    name,
                    tags={TAG_LINE: line},
                    description=description or f"LoRA adapters of the {line} business line",
                )
            except MlflowException as again:
                if _error_code(again) != "RESOURCE_ALREADY_EXISTS":
                    raise

    def _versions(self, filter_string: str) -> list[ModelVersion]:
        found: list[ModelVersion] = []
        token: str | None = None
        while True:
            page = self.client.search_model_versions(filter_string, page_token=token)
            found.extend(page)
            token = page.token
            if not token:
                return found

    def find_version(
        self, line: str, dataset_hash: str, recipe_hash: str, base_model: str
    ) -> int | None:
        """The newest version trained on the same data, recipe and base model, if any.

        A rerun on unchanged inputs reuses it instead of registering a duplicate.
        A version that was rolled back is still returned; check
        :meth:`version_tags` for ``rolled_back`` before serving it again.
        """
        matches = [
            int(v.version)
            for v in self._versions(
                f"name = '{model_name(line)}' and tags.dataset_hash = '{_safe(dataset_hash)}'"
            )
            if v.tags.get("recipe_hash") == recipe_hash and v.tags.get("base_model") == base_model
        ]
        return max(matches, default=None)

    def version_tags(self, line: str, version: int) -> dict[str, str]:
        """The tags of one version: lineage, promotion and rollback records."""
        return dict(self._version(line, version).tags)

    def _version(self, line: str, version: int) -> ModelVersion:
        try:
            return self.client.get_model_version(model_name(line), str(version))
        except MlflowException as exc:
            if _error_code(exc) in {"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"}:
                raise VersionNotFoundError(f"{model_name(line)} has no version {version}") from None
            raise

    def aliases(self, line: str) -> dict[str, int]:
        """Every alias of the line's registered model and the version it points at."""
        try:
            model = self.client.get_registered_model(model_name(line))
        except MlflowException as exc:
            if _error_code(exc) == "RESOURCE_DOES_NOT_EXIST":
                return {}
            raise
        return {alias: int(version) for alias, version in model.aliases.items()}

    def alias_version(self, line: str, alias: str) -> int | None:
        """The version an alias (``candidate``, ``champion``, ``previous``) points at."""
        return self.aliases(line).get(alias)

    def set_candidate(self, line: str, version: int) -> None:
        """Point ``candidate`` at ``version`` (it passed the gate and may go to canary)."""
        self._version(line, version)
        self.client.set_registered_model_alias(model_name(line), "candidate", str(version))

    def promote(
        self, line: str, version: int, *, actor: str = "flywheel", reason: str = ""
    ) -> Promotion:
        """Make ``version`` the champion; the old champion becomes ``previous``.

        ``candidate`` is removed when it pointed at ``version``. Who promoted and
        why are recorded as version tags. Promoting the champion again changes
        nothing. Safe to retry after a failure half-way.
        """
        self._version(line, version)
        name = model_name(line)
        current = self.aliases(line)
        champion = current.get("champion")
        if champion == version:
            previous = current.get("previous")
        else:
            previous = champion
            if champion is not None:
                self.client.set_registered_model_alias(name, "previous", str(champion))
            for key, value in {
                "promoted_by": actor,
                "promoted_reason": truncate(reason) if reason else "-",
                "promoted_at": _now(),
            }.items():
                self.client.set_model_version_tag(name, str(version), key, value)
            self.client.set_registered_model_alias(name, "champion", str(version))
        if current.get("candidate") == version:
            self.client.delete_registered_model_alias(name, "candidate")
        return Promotion(line=line, champion=version, previous=previous)

    def rollback(self, line: str, reason: str, *, actor: str = "flywheel") -> Rollback:
        """Put ``previous`` back as champion; the version taken out is tagged ``rolled_back``.

        ``previous`` is removed afterwards (it would point at the champion).
        """
        if not reason.strip():
            raise FlywheelError("a rollback needs a reason (it is recorded on the version)")
        name = model_name(line)
        current = self.aliases(line)
        champion, previous = current.get("champion"), current.get("previous")
        if champion is None:
            raise FlywheelError(f"{name} has no champion to roll back")
        if previous is None:
            raise FlywheelError(f"{name} has no previous version to roll back to")
        if previous == champion:
            # A rollback that failed after moving the champion: only the cleanup is left.
            self.client.delete_registered_model_alias(name, "previous")
            raise FlywheelError(f"{name} v{champion} is already the champion; nothing to roll back")
        # Tag first: a retry after a failure below must still know which version was removed.
        for key, value in {
            "rolled_back": truncate(reason),
            "rolled_back_by": actor,
            "rolled_back_at": _now(),
        }.items():
            self.client.set_model_version_tag(name, str(champion), key, value)
        self.client.set_registered_model_alias(name, "champion", str(previous))
        self.client.delete_registered_model_alias(name, "previous")
        return Rollback(line=line, rolled_back=champion, champion=previous)

    def log_canary_outcome(
        self,
        line: str,
        version: int,
        record: CanaryRecord,
        numbers: Mapping[str, Any] | None = None,
    ) -> str | None:
        """Write what the canary decided about ``version`` back to the run that trained it:
        the record's tags and metrics, and ``numbers`` (the decision's windows and checks)
        as its JSON artifact. Returns the run id; None for a version without a run."""
        run_id = self._version(line, version).run_id
        if not run_id:
            return None
        stamp = int(time.time() * 1000)
        self.client.log_batch(
            run_id,
            metrics=[Metric(key, value, stamp, 0) for key, value in record.metrics.items()],
            tags=[RunTag(key, value) for key, value in record.tags.items()],
        )
        if numbers is not None:
            self.client.log_dict(run_id, dict(numbers), record.artifact)
        return str(run_id)

    def version_verdict(self, line: str, version: int) -> tuple[str | None, str | None]:
        """(gate decision of the run that made ``version``, its ``rolled_back`` reason)."""
        found = self._version(line, version)
        gate = None
        if found.run_id:
            gate = self.client.get_run(found.run_id).data.tags.get(TAG_GATE_DECISION)
        return gate, (found.tags or {}).get("rolled_back")

    def set_alias(self, line: str, alias: str, version: int) -> None:
        """Point ``alias`` (e.g. ``canary``) at ``version``."""
        self._version(line, version)
        self.client.set_registered_model_alias(model_name(line), alias, str(version))

    def remove_alias(self, line: str, alias: str) -> None:
        """Remove ``alias`` if it is set."""
        if alias in self.aliases(line):
            self.client.delete_registered_model_alias(model_name(line), alias)

    def reject(self, line: str, version: int, reason: str, *, actor: str = "flywheel") -> None:
        """A canary that failed online: tagged ``rolled_back`` with the reason; its
        ``candidate`` and ``canary`` aliases are removed (the champion is untouched)."""
        if not reason.strip():
            raise FlywheelError("a rollback needs a reason (it is recorded on the version)")
        name = model_name(line)
        self._version(line, version)
        for key, value in {
            "rolled_back": truncate(reason),
            "rolled_back_by": actor,
            "rolled_back_at": _now(),
        }.items():
            self.client.set_model_version_tag(name, str(version), key, value)
        for alias, pointed in self.aliases(line).items():
            if alias in {"candidate", "canary"} and pointed == version:
                self.client.delete_registered_model_alias(name, alias)

    def adapter_source(self, line: str, version: int) -> str:
        """The artifact URI of the version's adapter files (its LoggedModel's location)."""
        source = self._version(line, version).source
        if not source:
            raise FlywheelError(f"{model_name(line)} v{version} has no artifact source")
        if source.startswith("models:/"):
            # A LoggedModel: its files live at its artifact location.
            source = self.client.get_logged_model(source.removeprefix("models:/")).artifact_location
        return str(source)

    def download_adapter(self, line: str, version: int, destination: Path) -> Path:
        """Copy the version's adapter files from the artifact store (local, proxied by an
        MLflow server, or an object store) into a new folder under ``destination``; returns
        that folder. Unchecked: :func:`registry.delivery.fetch_adapter` checks the digest."""
        fetched = _download_artifacts(
            artifact_uri=self.adapter_source(line, version),
            dst_path=str(destination),
            tracking_uri=self.tracking_uri,
        )
        return Path(fetched)

    def adapter_path(self, line: str, version: int) -> Path:
        """A local folder holding the version's adapter files, digest-checked, ready for
        vLLM to load: fetched once into ``download_dir/<line>-v<version>``
        (:func:`registry.delivery.fetch_adapter`). A registry without a ``download_dir``
        checks a local store's artifact folder in place and hands that."""
        from registry.delivery import TAG_ADAPTER_DIGEST, AdapterDigestError, adapter_digest

        if self.download_dir is not None:
            from registry.delivery import fetch_adapter

            return fetch_adapter(self, line, version, self.download_dir)
        source = self.adapter_source(line, version)
        local = _local_path(source)
        if local is None:
            raise FlywheelError(
                f"{model_name(line)} v{version} is stored at {source}; "
                "give the registry a download_dir to fetch it"
            )
        if not (local / ADAPTER_CONFIG).is_file():
            raise FlywheelError(f"{model_name(line)} v{version}: {local} holds no adapter")
        expected = self.version_tags(line, version).get(TAG_ADAPTER_DIGEST)
        if expected is not None and (found := adapter_digest(local)) != expected:
            raise AdapterDigestError(
                f"{adapter_name(line, version)}: the files at {local} have digest {found}, "
                f"not the registered {expected}; not served"
            )
        return local

    def flag_forgotten_data(self, dataset_hashes: Iterable[str], *, day: str) -> FlaggedModels:
        """Tag every training run and model version trained on one of ``dataset_hashes``
        with ``flywheel.forgotten_user_data = "true"`` and the ``day`` (never whose data):
        a forgotten user's examples went into them, so a data scientist retrains or retires
        them. Flagging twice changes nothing but the day."""
        hashes = sorted(set(dataset_hashes))
        flagged = FlaggedModels()
        if not hashes:
            return flagged
        experiments = [
            e.experiment_id
            for e in self.client.search_experiments(filter_string="name LIKE 'flywheel/%'")
        ]
        for digest in hashes:
            for version in self._versions(f"tags.dataset_hash = '{_safe(digest)}'"):
                for key, value in forgotten_tags(day).items():
                    self.client.set_model_version_tag(version.name, version.version, key, value)
                flagged.versions.append((version.name, int(version.version)))
            if not experiments:
                continue
            runs = self.client.search_runs(
                experiments, filter_string=f"tags.`{TAG_DATASET_HASH}` = '{_safe(digest)}'"
            )
            for run in runs:
                for key, value in forgotten_tags(day).items():
                    self.client.set_tag(run.info.run_id, key, value)
                flagged.runs.append(run.info.run_id)
        return flagged

    def recent_runs(self, line: str | None = None, limit: int = 20) -> list[RunSummary]:
        """The newest training runs, of one line or of all, newest first."""
        if line is not None:
            experiment = self.client.get_experiment_by_name(experiment_name(line))
            experiments = [experiment] if experiment is not None else []
        else:
            experiments = list(
                self.client.search_experiments(filter_string="name LIKE 'flywheel/%'")
            )
        if not experiments:
            return []
        names = {e.experiment_id: e.name for e in experiments}
        runs = self.client.search_runs(
            list(names), order_by=["attributes.start_time DESC"], max_results=limit * 4
        )
        # Evaluations (`flywheel eval`) and A/B experiments (`flywheel experiment`) share the
        # line's experiment; they trained nothing.
        untrained = ("evaluation", "ab_experiment")
        runs = [r for r in runs if r.data.tags.get("flywheel.run_kind") not in untrained][:limit]
        return [
            summarize_run(
                run.info.run_id,
                names[run.info.experiment_id],
                run.info.start_time,
                run.info.status,
                run.data.metrics,
                run.data.tags,
            )
            for run in runs
        ]


@contextmanager
def _global_tracking_uri(uri: str) -> Iterator[None]:
    import mlflow

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def _safe(value: str) -> str:
    """A value that can sit in an MLflow search filter between single quotes."""
    if "'" in value or "\\" in value:
        raise FlywheelError(f"{value!r} cannot be searched for (quote or backslash in it)")
    return value


def _download_artifacts(*, artifact_uri: str, dst_path: str, tracking_uri: str | None) -> str:
    """MLflow's download, without its progress bar amid a command's own output (unless
    MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR says otherwise)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow.artifacts import download_artifacts

    return str(
        download_artifacts(artifact_uri=artifact_uri, dst_path=dst_path, tracking_uri=tracking_uri)
    )
