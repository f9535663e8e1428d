"""A line's training stage: train, evaluate against the champion, gate and register.

It composes package calls over the line's recipe and the process's clients; the
nightly flow wraps it as a task (``flows.training``, on a work pool when configured)
and the CLI calls it directly, so both run the same code.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from composition.clients import Clients
from composition.recipes import (
    Recipe,
    recipe_for,
    recipe_hash,
    start_training_run,
)
from eval.reports import GOES_TO_CANARY, EvalReport, GateDecision
from feedback.datasets import DatasetBuild, train_counts, usable_signal
from flywheel.errors import FlywheelError, UsageError
from flywheel.settings import Settings
from training.config import training_method
from training.inverted import _inverted

if TYPE_CHECKING:
    from training.train import LossGuard
    from training.train import TrainResult as AdapterTraining

# High-precision PII types only count against a candidate: a place name in a correct answer
# must not block a release (every type found is still masked in the logged samples).
GENERATION_PII_TYPES = frozenset(
    {
        "EMAIL_ADDRESS",
        "PHONE_NUMBER",
        "CREDIT_CARD",
        "US_SSN",
        "IBAN_CODE",
        "CN_RESIDENT_ID",
        "IP_ADDRESS",
    }
)


def code_version(repo: Path | None = None) -> str:
    """The git commit of the running code, or the package version outside a checkout."""
    from flywheel import __version__

    root = repo or Path(__file__).resolve().parents[1]
    git = shutil.which("git")
    if git is None:
        return __version__
    try:
        done = subprocess.run(  # noqa: S603 (a fixed git command, no user input)
            [git, "rev-parse", "--short=12", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return __version__
    return done.stdout.strip() or __version__


class TrainingStatus(StrEnum):
    """What became of a line's training: a new version, one reused by its hash, or none."""

    TRAINED = "trained"
    REUSED = "reused"
    SKIPPED = "skipped"


@dataclass(slots=True)
class TrainingOutcome:
    """What ``train_line`` did for one line."""

    business_line: str
    status: TrainingStatus
    reason: str = ""
    version: int | None = None
    run_id: str | None = None
    decision: GateDecision | None = None
    candidate: EvalReport | None = None
    champion: EvalReport | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TrainResult:
    """What a line's training produced, as the nightly needs it (and as crosses processes)."""

    business_line: str
    status: TrainingStatus
    reason: str
    version: int | None
    promote: bool

    @classmethod
    def from_outcome(cls, outcome: TrainingOutcome) -> TrainResult:
        """Summarise ``train_line``'s outcome; a reused version keeps its earlier verdicts."""
        if outcome.decision is not None:
            promote = outcome.decision.promote
        else:
            # A version reused from an earlier (maybe crashed) run keeps that run's verdicts:
            # one the gate refused, or one rolled back online, is never put on a canary again.
            promote = outcome.metrics.get("gate") in GOES_TO_CANARY and not outcome.metrics.get(
                "rolled_back"
            )
        return cls(outcome.business_line, outcome.status, outcome.reason, outcome.version, promote)

    @classmethod
    def skipped(cls, line: str, reason: str) -> TrainResult:
        """No training: why."""
        return cls(line, TrainingStatus.SKIPPED, reason, None, False)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON values (the flow's persisted result)."""
        return {
            "business_line": self.business_line,
            "status": self.status.value,
            "reason": self.reason,
            "version": self.version,
            "promote": self.promote,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainResult:
        """Back from :meth:`as_dict`."""
        return cls(
            str(data["business_line"]),
            TrainingStatus(data["status"]),
            str(data["reason"]),
            None if data["version"] is None else int(data["version"]),
            bool(data["promote"]),
        )


def _with_method(recipe: Recipe, build: DatasetBuild) -> tuple[Recipe, str | None]:
    """``recipe`` with the method its training set calls for, and why when it changed."""
    method, reason = training_method(recipe, train_counts(build.manifest))
    return (recipe.model_copy(update={"method": method}) if reason else recipe), reason


def _evaluate_and_gate(
    clients: Clients,
    recipe: Recipe,
    base_dir: Path,
    dataset_dir: Path,
    champion_adapter: Path | None,
    candidate_adapter: Path,
    *,
    names: dict[str, str],
    mixed_precision: bool,
    canaries: Sequence[str],
    log_base_loss: Callable[[float], None],
) -> tuple[dict[str, EvalReport], GateDecision]:
    """Both models' offline reports on the line's held-out data, each under its name in
    ``names`` (by role: ``candidate``, ``champion``), and the gate's decision; with a drift
    bound in the gate, the base model's general-set loss too (the champion's report when the
    champion is the base model, else one more scoring pass)."""
    from eval.gate import decide_promotion
    from eval.offline import (
        evaluate_model,
        general_set_loss,
        load_eval_data,
        load_for_eval,
        pii_detector_for,
        training_answers_hold,
    )

    data = load_eval_data(dataset_dir, max_samples=recipe.eval_generations)
    detector = pii_detector_for(clients.scrubber)
    # Both models' values are told apart on the same answers: the candidate's training set.
    trained_on = training_answers_hold(dataset_dir)
    reports: dict[str, EvalReport] = {}
    for name, adapter in (("champion", champion_adapter), ("candidate", candidate_adapter)):
        model, tokenizer = load_for_eval(base_dir, adapter, precision=recipe.precision)
        reports[name] = evaluate_model(
            model,
            tokenizer,
            data,
            name=names[name],
            canaries=canaries,
            pii_detector=detector,
            counted_pii=GENERATION_PII_TYPES,
            trained_on=trained_on,
            max_length=recipe.max_length,
            mixed_precision=mixed_precision,
        )
        del model
    base_loss = None
    if recipe.gate.max_general_loss_drift is not None:
        if champion_adapter is None:
            base_loss = reports["champion"].general_loss
        else:
            model, tokenizer = load_for_eval(base_dir, None, precision=recipe.precision)
            base_loss = general_set_loss(
                model,
                tokenizer,
                name="base",
                max_length=recipe.max_length,
                mixed_precision=mixed_precision,
            )
            del model
        log_base_loss(base_loss)
    decision = decide_promotion(
        reports["candidate"], reports["champion"], recipe.gate, base_general_loss=base_loss
    )
    from eval.gate import left_to_canary

    decision = _with_predicted_satisfaction(clients, recipe, base_dir, reports, decision)
    judged_online = recipe.canary.satisfaction is not None
    return reports, left_to_canary(decision, recipe.gate, canary_judges_satisfaction=judged_online)


def _with_predicted_satisfaction(
    clients: Clients,
    recipe: Recipe,
    base_dir: Path,
    reports: dict[str, EvalReport],
    decision: GateDecision,
) -> GateDecision:
    """The gate's decision with the line's accepted satisfaction model's view of both models'
    answers to the same held-out prompts (see :func:`eval.gate.with_predicted_satisfaction`)."""

    from eval.satisfaction import predicted_satisfaction
    from eval.satisfaction_model import SatisfactionModel
    from eval.satisfaction_training import reader_for

    if not recipe.satisfaction_model.enabled:
        return decision
    found = clients.registry.satisfaction_model_path(recipe.business_line)
    if found is None:
        return decision
    version, path = found
    champion = {s.prompt: s.answer for s in reports["champion"].samples}
    shared = [s for s in reports["candidate"].samples if s.prompt in champion]
    if len(shared) < 2:
        return decision
    model = SatisfactionModel.load(path)
    reader = reader_for(base_dir)

    def scores(answers: list[str]) -> list[float]:
        items = [
            ([{"role": "user", "content": s.prompt}], a)
            for s, a in zip(shared, answers, strict=True)
        ]
        return model.predict(reader.features(items)).tolist()

    compared = predicted_satisfaction(
        scores([s.answer for s in shared]), scores([champion[s.prompt] for s in shared])
    )
    if compared is None:
        return decision
    name = f"{recipe.business_line}-satisfaction-v{version}"
    from eval.gate import with_predicted_satisfaction

    return with_predicted_satisfaction(decision, compared, name, recipe.gate)


def _tag_how_trained(registry: Any, run_id: str, inverted: bool, method_reason: str | None) -> None:
    if inverted:
        registry.tag_run(run_id, "flywheel.inverted_preferences", "true")
    if method_reason:
        registry.tag_run(run_id, "flywheel.method_reason", method_reason)


def _training_set(
    settings: Settings, line: str, recipe: Recipe, dataset_hash: str | None
) -> DatasetBuild | TrainingOutcome:
    """The dataset to train on (accumulated over the recipe's history), or why not."""
    from feedback.datasets import accumulate, dataset_by_hash, latest_dataset, line_builds

    if dataset_hash is not None:
        build = dataset_by_hash(settings.datasets_dir, line, dataset_hash)
        if build is None:
            raise FlywheelError(f"{line} has no dataset {dataset_hash[:16]}")
    else:
        build = latest_dataset(settings.datasets_dir, line)
    if build is None:
        return TrainingOutcome(
            line, TrainingStatus.SKIPPED, "no dataset yet: run flywheel datasets build"
        )
    method, _ = training_method(recipe, train_counts(build.manifest))
    signal = usable_signal(build.manifest, method)
    if signal.weight < recipe.min_new_examples:
        return TrainingOutcome(
            line,
            TrainingStatus.SKIPPED,
            f"{signal.describe(method)}, the recipe needs a weight of at least "
            f"{recipe.min_new_examples}",
        )
    if recipe.history_days > 0:
        earlier = [
            b for b in line_builds(settings.datasets_dir, line) if b.created_at <= build.created_at
        ]
        build = accumulate(
            settings.datasets_dir,
            line,
            earlier or [build],
            horizon_days=recipe.history_days,
            half_life_days=recipe.half_life_days,
        )
    return build


def _check_servable_rank(settings: Settings, clients: Clients, line: str, rank: int) -> None:
    """Refuse, before training, a LoRA rank above the ``--max-lora-rank`` of a replica the
    line is placed on (as the replicas recorded it at their start, else the setting)."""
    from registry.replicas import serving_lora_limits

    # vLLM's metrics report no rank: they are not asked.
    limits = serving_lora_limits(
        settings, clients.replicas, clients.routes.table(line), metrics=lambda _: None
    )
    if rank > limits.max_lora_rank:
        raise FlywheelError(
            f"the {line} recipe's LoRA rank {rank} is above the serving vLLM's "
            f"--max-lora-rank {limits.max_lora_rank} ({limits.max_lora_rank_source}): "
            "the adapter could never be loaded; lower lora.rank or serve a higher rank"
        )


def train_line(
    settings: Settings,
    clients: Clients,
    line: str,
    *,
    force: bool = False,
    canaries: tuple[str, ...] = (),
    on_log: Callable[[dict[str, Any]], None] | None = None,
    dataset_hash: str | None = None,
    invert_preferences: bool = False,
) -> TrainingOutcome:
    """Train, evaluate against the champion, gate and register one line's adapter (in the
    registry of ``clients``; its scrubber finds PII in the generations).

    Uses the dataset with ``dataset_hash`` (the night's window), else the line's
    newest. Skips (with the reason) when that dataset has fewer new examples
    than the recipe's minimum. With the recipe's ``history_days``, training and
    evaluation use every dataset of the line in that horizon (accumulated,
    recency-weighted). Reuses the registered version when the same training
    set, recipe and base model were already trained.

    ``invert_preferences`` trains on every pair the wrong way round (a really
    worse adapter, for rehearsing a rollback: ``flywheel loop --bad-canary``);
    it always trains anew and its run is tagged so.
    """
    from flywheel.hardware import detect_accelerator, quantization_refusal
    from registry.records import TAG_ENDED_BECAUSE, truncate
    from training.base_model import ensure_base_model

    recipe = recipe_for(settings, line)
    # A recipe this machine cannot train (4-bit without a GPU) is refused before a run opens.
    refusal = quantization_refusal(recipe.quantization, detect_accelerator())
    if refusal is not None:
        raise UsageError(f"{line}: {refusal}")
    build = _training_set(settings, line, recipe, dataset_hash)
    if isinstance(build, TrainingOutcome):
        return build
    recipe, method_reason = _with_method(recipe, build)
    base_dir = ensure_base_model(settings.models_dir, settings.base_model)
    registry = clients.registry
    registry.close_orphan_runs(line)
    version_of_code = code_version()
    existing = registry.find_version(line, build.content_hash, recipe_hash(recipe), base_dir.name)
    if existing is not None and not force and not invert_preferences:
        return _reused(registry, line, build, existing)
    manifest = build.path / "manifest.json"
    run_id = start_training_run(
        registry, recipe, build.content_hash, manifest, base_dir.name, version_of_code
    )
    run = _TrainingRun(line, recipe, build, base_dir, run_id, version_of_code)
    try:
        _check_servable_rank(settings, clients, line, recipe.lora.rank)
        champion_version = registry.alias_version(line, "champion")
        result = _train(settings, registry, run, champion_version, invert_preferences, on_log)
        _tag_how_trained(registry, run_id, invert_preferences, method_reason)
        _log_training(registry, run_id, result)
        gated = _gate_and_register(clients, run, result, champion_version, canaries)
    except BaseException as exc:
        with contextlib.suppress(Exception):  # the original error matters more
            registry.tag_run(run_id, TAG_ENDED_BECAUSE, truncate(f"{type(exc).__name__}: {exc}"))
        registry.finish_run(run_id, "FAILED")
        raise
    registry.finish_run(run_id, "FINISHED")
    return gated.outcome(line, run_id, result)


@dataclass(frozen=True, slots=True)
class _TrainingRun:
    """One training run of a line: its recipe (with the method its data calls for), its
    training set, the base model, its MLflow run and the code that runs it."""

    line: str
    recipe: Recipe
    build: DatasetBuild
    base_dir: Path
    run_id: str
    code_version: str


@dataclass(frozen=True, slots=True)
class _GatedVersion:
    """A trained adapter evaluated against the champion, gated and registered."""

    reports: dict[str, EvalReport]
    decision: GateDecision
    version: int

    def outcome(self, line: str, run_id: str, result: AdapterTraining) -> TrainingOutcome:
        """What ``train_line`` did, with the training's numbers."""
        return TrainingOutcome(
            line,
            TrainingStatus.TRAINED,
            self.decision.summary,
            version=self.version,
            run_id=run_id,
            decision=self.decision,
            candidate=self.reports["candidate"],
            champion=self.reports["champion"],
            metrics={
                "train_seconds": result.seconds,
                "steps": result.steps,
                **({"kept_step": result.kept_step} if result.kept_step is not None else {}),
                "tokens_per_second": result.tokens_per_second,
                "peak_rss_mb": result.peak_rss_mb,
            },
        )


def _reused(registry: Any, line: str, build: DatasetBuild, existing: int) -> TrainingOutcome:
    """The version already trained on this training set, recipe and base model, with its
    earlier verdicts (the gate's, and a rollback's)."""
    gate, rolled_back = registry.version_verdict(line, existing)
    return TrainingOutcome(
        line,
        TrainingStatus.REUSED,
        f"dataset {build.content_hash[:12]} with this recipe is already version {existing}"
        + (f" (gate: {gate})" if gate else "")
        + (f" (rolled back: {rolled_back})" if rolled_back else ""),
        version=existing,
        metrics={"gate": gate, "rolled_back": rolled_back},
    )


def _train(
    settings: Settings,
    registry: Any,
    run: _TrainingRun,
    champion_version: int | None,
    invert_preferences: bool,
    on_log: Callable[[dict[str, Any]], None] | None,
) -> AdapterTraining:
    """The adapter trained on the run's training set: from the champion when the recipe
    says so, from the base model for an inverted one."""
    from training.train import train_adapter

    # An inverted adapter starts from the base model: continuing the champion, it kept
    # much of what the champion had learnt (0.17 satisfied against v1's 0.31, customer
    # service: docs/results/2026-12-03-bad-canary.md), a canary hardly worse than the one
    # it replaces.
    continues = run.recipe.start_from == "champion" and not invert_preferences
    return train_adapter(
        run.recipe,
        loss_guard=general_loss_guard(
            run.recipe, continues=continues, has_champion=champion_version is not None
        ),
        init_adapter=(
            registry.adapter_path(run.line, champion_version)
            if continues and champion_version is not None
            else None
        ),
        base_model_dir=run.base_dir,
        dataset_dir=run.build.path,
        rows=_inverted(run.build.path, run.recipe.method) if invert_preferences else None,
        output_dir=settings.runs_dir / run.line / run.run_id,
        on_log=on_log,
    )


def general_loss_guard(recipe: Recipe, *, continues: bool, has_champion: bool) -> LossGuard | None:
    """The guard that keeps a training of ``recipe`` inside its gate's general-set loss
    bounds (``loss_checks`` times along the schedule), or ``None`` when the recipe asks for
    no checks or its gate bounds nothing. The drift bound is over the base model; the
    increase bound over the champion, which is the base model when there is none and the
    starting point when the champion is continued (a fresh adapter beside a champion leaves
    that bound to the gate)."""
    from functools import partial

    from eval.offline import general_set_loss
    from flywheel.hardware import detect_accelerator
    from training.train import LossGuard

    gate = recipe.gate
    over_base = [
        bound
        for bound in (
            gate.max_general_loss_drift,
            None if has_champion else gate.max_general_loss_increase,
        )
        if bound is not None
    ]
    over_start = gate.max_general_loss_increase if continues and has_champion else None
    if recipe.loss_checks == 0 or (not over_base and over_start is None):
        return None
    return LossGuard(
        measure=partial(
            general_set_loss,
            name="the adapter in training",
            max_length=recipe.max_length,
            mixed_precision=_scores_in_bf16(recipe, detect_accelerator().device),
        ),
        checks=recipe.loss_checks,
        max_over_base=min(over_base) if over_base else None,
        max_over_start=over_start,
    )


def _scores_in_bf16(recipe: Recipe, device: str) -> bool:
    """Whether the gate and the training's loss guard score under bfloat16 autocast: on the
    CPU where the recipe trains in it (a GPU's models are loaded in their dtype)."""
    from training.train import trains_in_bf16

    return device == "cpu" and trains_in_bf16(recipe.precision, on_gpu=False)


def _log_training(registry: Any, run_id: str, result: AdapterTraining) -> None:
    """The training's loss curve, numbers and adapter on its MLflow run."""
    registry.log_loss_curve(run_id, result.history)
    registry.log_metrics(
        run_id,
        {
            "train.seconds": result.seconds,
            "train.steps": result.steps,
            "train.examples": result.examples,
            "train.tokens_per_second": result.tokens_per_second,
            "train.peak_rss_mb": result.peak_rss_mb,
            **({"train.loss_limit": result.loss_limit} if result.loss_limit is not None else {}),
            **({"train.kept_step": result.kept_step} if result.kept_step is not None else {}),
        },
    )
    registry.log_loss_curve(
        run_id, [{"step": step, "guard/general_loss": loss} for step, loss in result.loss_checks]
    )
    registry.log_adapter(run_id, result.adapter_dir)


def _gate_and_register(
    clients: Clients,
    run: _TrainingRun,
    result: AdapterTraining,
    champion_version: int | None,
    canaries: Sequence[str],
) -> _GatedVersion:
    """The adapter against the champion (or the base model) on the held-out data, the gate's
    decision logged, the version registered with its lineage (the candidate when it
    passed)."""
    from registry.names import adapter_name, training_run_name

    registry, line, recipe = clients.registry, run.line, run.recipe
    champion_adapter = (
        registry.adapter_path(line, champion_version) if champion_version is not None else None
    )
    names = {
        "candidate": training_run_name(line, recipe.method, run.build.content_hash),
        "champion": (
            adapter_name(line, champion_version)
            if champion_version is not None
            else f"base model {run.base_dir.name}"
        ),
    }
    reports, decision = _evaluate_and_gate(
        clients,
        recipe,
        run.base_dir,
        run.build.path,
        champion_adapter,
        result.adapter_dir,
        names=names,
        mixed_precision=_scores_in_bf16(recipe, result.device),
        canaries=canaries,
        log_base_loss=lambda loss: registry.log_metrics(run.run_id, {"base.general_loss": loss}),
    )
    registry.log_evaluation(run.run_id, reports["candidate"], reports["champion"], decision)
    lineage = {
        "base_model": run.base_dir.name,
        "dataset_hash": run.build.content_hash,
        "recipe_hash": recipe_hash(recipe),
        "code_version": run.code_version,
    }
    version = registry.register_adapter(run.run_id, line, lineage)
    if decision.promote:
        registry.set_candidate(line, version)
    return _GatedVersion(reports, decision, version)
