"""What flywheel writes to MLflow and reads back, as plain values (no MLflow import).

The :class:`registry.tracking.Registry` only moves these values in and out of
MLflow; everything that can be decided without a tracking store lives here so
unit tests check it directly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from eval.paired import PairedComparison, compare_paired
from eval.reports import EvalReport, GateDecision
from flywheel.errors import FlywheelError
from flywheel.intervals import DEFAULT_CONFIDENCE

if TYPE_CHECKING:
    from registry.canary import MetricCheck

# MLflow's limits (mlflow.utils.validation): run tag values, param values, dataset digests.
MAX_RUN_TAG_CHARS = 8_000
MAX_PARAM_CHARS = 6_000
MAX_DATASET_DIGEST_CHARS = 36
TRUNCATION_MARK = "\n... (truncated)"

LINEAGE_KEYS = ("base_model", "dataset_hash", "recipe_hash", "code_version")

# Run tags flywheel sets and reads back (``recent_runs``).
TAG_LINE = "flywheel.business_line"
TAG_DATASET_HASH = "flywheel.dataset_hash"
TAG_RECIPE_HASH = "flywheel.recipe_hash"
TAG_BASE_MODEL = "flywheel.base_model"
TAG_CODE_VERSION = "flywheel.code_version"
TAG_METHOD = "flywheel.method"
TAG_REGISTERED_VERSION = "flywheel.registered_version"
TAG_TRAINER = "flywheel.trainer"  # host:pid of the process that trains in the run
TAG_ENDED_BECAUSE = "flywheel.ended_because"
TAG_GATE_DECISION = "gate.decision"
# On runs and model versions trained on a dataset that held a user later forgotten.
TAG_FORGOTTEN_USER_DATA = "flywheel.forgotten_user_data"
TAG_FORGOTTEN_USER_DATA_AT = "flywheel.forgotten_user_data_at"
TAG_GATE_REASONS = "gate.reasons"
# "promote", "reject (...)" or "not judged: n=4 < 100": what the gate said, in a line.
TAG_GATE_SUMMARY = "gate.summary"

# Offline evaluation metrics: eval.candidate.<metric> beside eval.champion.<metric>, shares
# with their n and 95% interval (<metric>_n, _low, _high), the paired accuracy difference.
EVAL_PREFIX = "eval."
EVAL_SIDES = ("candidate", "champion")
INTERVAL_SUFFIXES = ("_n", "_low", "_high")
PREFERENCE_DIFFERENCE = "preference_accuracy_difference"

_METRIC_NAME_FORBIDDEN = re.compile(r"[^\w./\- :]")
_HISTORY_SKIP = frozenset({"step", "epoch"})


def forgotten_tags(day: str) -> dict[str, str]:
    """The tags that flag a run or model version trained on a forgotten user's data."""
    return {TAG_FORGOTTEN_USER_DATA: "true", TAG_FORGOTTEN_USER_DATA_AT: day}


@dataclass(slots=True)
class FlaggedModels:
    """Model versions (registered model, version) and runs flagged as trained on a
    forgotten user's data."""

    versions: list[tuple[str, int]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)


def flatten_params(values: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested settings as MLflow params: dotted keys, lists joined by commas, ``None`` kept.

    ``{"lora": {"rank": 8, "target_modules": ["q_proj", "v_proj"]}}`` becomes
    ``{"lora.rank": "8", "lora.target_modules": "q_proj,v_proj"}``.
    """
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, prefix=f"{name}."))
        elif isinstance(value, list | tuple):
            flat[name] = truncate(",".join(str(item) for item in value), MAX_PARAM_CHARS)
        else:
            flat[name] = truncate(str(value), MAX_PARAM_CHARS)
    return flat


def trainer_is_gone(trainer: str, host: str, alive: Callable[[int], bool]) -> bool:
    """Whether a run's trainer (``host:pid``) is a process of this host that no longer runs.

    A trainer on another host, or a tag that cannot be read, is never judged gone.
    """
    name, _, pid = trainer.rpartition(":")
    if name != host or not pid.isdigit():
        return False
    return not alive(int(pid))


def truncate(text: str, limit: int = MAX_RUN_TAG_CHARS) -> str:
    """``text`` cut to ``limit`` characters, ending with a visible mark when it was cut."""
    if len(text) <= limit:
        return text
    return text[: limit - len(TRUNCATION_MARK)] + TRUNCATION_MARK


def dataset_digest(content_hash: str) -> str:
    """The dataset's content hash, shortened to what MLflow stores as a digest.

    The full hash goes in the ``flywheel.dataset_hash`` run tag and the version's
    ``dataset_hash`` tag; the digest is only MLflow's own dataset key.
    """
    return content_hash[:MAX_DATASET_DIGEST_CHARS]


def checked_lineage(lineage: Mapping[str, object]) -> dict[str, str]:
    """Lineage tags of a model version: every key of ``LINEAGE_KEYS`` must be set."""
    missing = [key for key in LINEAGE_KEYS if not str(lineage.get(key) or "").strip()]
    if missing:
        raise FlywheelError(f"lineage is missing {', '.join(missing)}; every version needs them")
    return {str(key): str(value) for key, value in lineage.items() if value is not None}


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One metric value at one training step."""

    key: str
    value: float
    step: int


def history_metrics(history: Iterable[Mapping[str, Any]]) -> list[MetricPoint]:
    """Metric points from a trainer's ``log_history`` (trl/transformers).

    Every numeric entry except ``step`` and ``epoch`` becomes a point at the
    entry's ``step``; entries without a step (none in practice) are skipped.
    Names keep trl's slashes (``rewards/accuracies``), which MLflow accepts.
    """
    points: list[MetricPoint] = []
    for entry in history:
        step = entry.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        for key, value in entry.items():
            if key in _HISTORY_SKIP or isinstance(value, bool):
                continue
            if isinstance(value, int | float) and math.isfinite(value):
                points.append(MetricPoint(_METRIC_NAME_FORBIDDEN.sub("_", key), float(value), step))
    return points


def eval_metrics(
    candidate: EvalReport, champion: EvalReport, confidence: float = DEFAULT_CONFIDENCE
) -> dict[str, float]:
    """An evaluation as MLflow metrics, the two models side by side.

    ``eval.candidate.<metric>`` and ``eval.champion.<metric>`` for every metric of the
    reports; for the shares of a count (preference accuracy over the held-out pairs,
    refusal rate over the generations) also ``<metric>_n``, ``<metric>_low`` and
    ``<metric>_high`` (Wilson, ``confidence``); with per-pair results on the same pairs,
    ``eval.preference_accuracy_difference`` (candidate minus champion) with its ``_n``,
    ``_low``, ``_high`` (Newcombe's paired interval) and ``eval.preference_accuracy_p_value``
    (exact one-sided McNemar).
    """
    metrics: dict[str, float] = {}
    for side, report in zip(EVAL_SIDES, (candidate, champion), strict=True):
        prefix = f"{EVAL_PREFIX}{side}."
        metrics |= report.metrics(prefix)
        for name, (n, low, high) in report.intervals(confidence).items():
            metrics |= {f"{prefix}{name}_n": n, f"{prefix}{name}_low": low}
            metrics[f"{prefix}{name}_high"] = high
    comparison = _paired(candidate, champion, confidence)
    if comparison is not None:
        name = f"{EVAL_PREFIX}{PREFERENCE_DIFFERENCE}"
        metrics |= {
            name: comparison.difference,
            f"{name}_n": comparison.n,
            f"{name}_low": comparison.low,
            f"{name}_high": comparison.high,
            f"{EVAL_PREFIX}preference_accuracy_p_value": comparison.p_value,
        }
    return {key: float(value) for key, value in metrics.items()}


def _paired(
    candidate: EvalReport, champion: EvalReport, confidence: float
) -> PairedComparison | None:
    wins = (candidate.pair_wins, champion.pair_wins)
    if not wins[0] or len(wins[0]) != len(wins[1]) or candidate.pairs != len(wins[0]):
        return None
    return compare_paired(wins[0], wins[1], confidence=confidence)


def metrics_table(candidate: EvalReport, champion: EvalReport) -> dict[str, list[Any]]:
    """The metric comparison, one row per metric: candidate, champion, the difference, and
    for shares of a count their n and 95% intervals (the difference's paired, when known)."""
    ours = candidate.metrics()
    theirs = champion.metrics()
    bounds = (candidate.intervals(), champion.intervals())
    comparison = _paired(candidate, champion, DEFAULT_CONFIDENCE)
    names = list(ours | theirs)
    columns = (
        *("metric", "n", "candidate", "candidate_low", "candidate_high", "champion"),
        *("champion_low", "champion_high", "delta", "delta_low", "delta_high"),
    )
    rows: dict[str, list[Any]] = {column: [] for column in columns}
    for name in names:
        a, b = ours.get(name), theirs.get(name)
        mine, old = bounds[0].get(name), bounds[1].get(name)
        paired = comparison if name == "preference_accuracy" else None
        rows["metric"].append(name)
        rows["n"].append(mine[0] if mine else old[0] if old else None)
        rows["candidate"].append(a)
        rows["candidate_low"].append(mine[1] if mine else None)
        rows["candidate_high"].append(mine[2] if mine else None)
        rows["champion"].append(b)
        rows["champion_low"].append(old[1] if old else None)
        rows["champion_high"].append(old[2] if old else None)
        rows["delta"].append(None if a is None or b is None else a - b)
        rows["delta_low"].append(paired.low if paired else None)
        rows["delta_high"].append(paired.high if paired else None)
    return rows


def samples_table(candidate: EvalReport, champion: EvalReport) -> dict[str, list[Any]]:
    """Sample generations side by side, matched on the prompt (candidate's order first)."""
    theirs = {sample.prompt: sample for sample in champion.samples}
    ours = {sample.prompt: sample for sample in candidate.samples}
    prompts = list(ours) + [prompt for prompt in theirs if prompt not in ours]
    rows: dict[str, list[Any]] = {
        "prompt": [],
        "champion_answer": [],
        "candidate_answer": [],
        "champion_refused": [],
        "candidate_refused": [],
        "candidate_flags": [],
    }
    for prompt in prompts:
        mine, old = ours.get(prompt), theirs.get(prompt)
        rows["prompt"].append(prompt)
        rows["champion_answer"].append(old.answer if old else None)
        rows["candidate_answer"].append(mine.answer if mine else None)
        rows["champion_refused"].append(old.refused if old else None)
        rows["candidate_refused"].append(mine.refused if mine else None)
        flags = [*mine.pii_found, *mine.canaries_found] if mine else []
        rows["candidate_flags"].append(",".join(flags))
    return rows


def gate_text(decision: GateDecision) -> str:
    """The gate decision as a short text artifact: the verdict, then one line per check."""
    return "\n".join([decision.summary, "", *decision.reasons]) + "\n"


def gate_tags(decision: GateDecision) -> dict[str, str]:
    """Run tags of a gate decision (``promote``, ``reject`` or ``not judged``, its one-line
    summary, every reason), cut to MLflow's tag limit."""
    return {
        TAG_GATE_DECISION: decision.verdict,
        TAG_GATE_SUMMARY: truncate(decision.summary),
        TAG_GATE_REASONS: truncate("\n".join(decision.reasons)),
    }


@dataclass(frozen=True, slots=True)
class CanaryRecord:
    """A canary's final decision (``action``) as the training run records it: tags, metrics,
    and where the decision's whole record (its windows and checks) goes as a JSON artifact."""

    action: str
    tags: dict[str, str]
    metrics: dict[str, float]
    artifact: str


def canary_record(
    action: str,
    reason: str,
    adapter: str,
    *,
    actor: str,
    decided_at: datetime,
    fraction: float,
    look: int,
    requests: tuple[int, int] | None = None,
    checks: Iterable[MetricCheck] = (),
    prefix: str = "canary",
    arms: tuple[str, str] = ("champion", "canary"),
) -> CanaryRecord:
    """What a canary's final look (promote or rollback) writes back to the run that trained
    the adapter.

    Tags ``canary.decision``, ``canary.reason``, ``canary.adapter``, ``canary.decided_by``,
    ``canary.decided_at``; metrics ``canary.look``, ``canary.fraction``, the arms' requests
    and, per check, ``canary.<metric>.canary`` / ``.champion`` with ``_n`` where it is counted
    over reviews, and its always-valid ``worse_p`` / ``non_inferior_p``
    (``canary.satisfaction.*`` when satisfaction decides). ``prefix`` is ``watch`` for the
    champion's watch after a promotion, whose ``arms`` are ``("previous", "champion")``
    rather than ``("champion", "canary")``. The JSON artifact is ``<prefix>/<action>.json``.
    """
    tags = {
        f"{prefix}.decision": action,
        f"{prefix}.reason": truncate(reason),
        f"{prefix}.adapter": adapter,
        f"{prefix}.decided_by": actor,
        f"{prefix}.decided_at": decided_at.isoformat(timespec="seconds"),
    }
    metrics: dict[str, float] = {f"{prefix}.look": look, f"{prefix}.fraction": fraction}
    old, new = arms
    if requests is not None:
        metrics[f"{prefix}.{old}_requests"] = requests[0]
        metrics[f"{prefix}.{new}_requests"] = requests[1]
    for check in checks:
        name = f"{prefix}.{_METRIC_NAME_FORBIDDEN.sub('_', check.metric)}"
        values: dict[str, float | None] = {
            f"{name}.{new}": check.canary,
            f"{name}.{old}": check.champion,
            f"{name}.worse_p": check.worse_p,
            f"{name}.non_inferior_p": check.non_inferior_p,
            f"{name}.margin": check.margin,
        }
        if check.counts is not None:
            values[f"{name}.{old}_n"], values[f"{name}.{new}_n"] = check.counts
        metrics |= {
            key: float(value)
            for key, value in values.items()
            if value is not None and math.isfinite(value)
        }
        tags[f"{name}.verdict"] = check.verdict
    return CanaryRecord(
        action,
        tags,
        {key: float(value) for key, value in metrics.items()},
        f"{prefix}/{action}.json",
    )


@dataclass(frozen=True, slots=True)
class Promotion:
    """What a promotion changed: the new champion and the one it replaced."""

    line: str
    champion: int
    previous: int | None


@dataclass(frozen=True, slots=True)
class Rollback:
    """What a rollback changed: the version taken out and the one serving again."""

    line: str
    rolled_back: int
    champion: int


RUN_COLUMNS = (
    "run",
    "line",
    "started",
    "status",
    "pairs",
    "candidate acc",
    "champion acc",
    "gate",
    "version",
)
NOT_JUDGED = "not judged"


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One training run as ``flywheel runs`` lists it."""

    run_id: str
    line: str
    started_at: datetime
    status: str
    candidate_preference_accuracy: float | None
    champion_preference_accuracy: float | None
    gate_decision: str | None
    registered_version: int | None
    pairs: int | None = None
    candidate_interval: tuple[float, float] | None = None
    champion_interval: tuple[float, float] | None = None
    gate_summary: str | None = None

    @property
    def judged(self) -> bool:
        """False when the gate had too few held-out pairs to compare the two models."""
        return self.gate_decision != NOT_JUDGED

    @property
    def gate(self) -> str:
        """The gate's verdict as a cell: ``promote``, ``reject``, ``not judged: n=4 < 100``."""
        if not self.judged:
            return self.gate_summary or NOT_JUDGED
        return self.gate_decision or "-"

    def cells(self) -> tuple[str, ...]:
        """The row's cells, in the order of ``RUN_COLUMNS``; a run the gate did not judge
        shows no accuracies (4 of 4 against 0 of 4 is not 100% against 0%)."""
        judged = self.judged
        return (
            self.run_id[:12],
            self.line,
            self.started_at.strftime("%Y-%m-%d %H:%M"),
            self.status.lower(),
            "-" if self.pairs is None else str(self.pairs),
            _accuracy(self.candidate_preference_accuracy, self.candidate_interval, judged),
            _accuracy(self.champion_preference_accuracy, self.champion_interval, judged),
            self.gate,
            f"v{self.registered_version}" if self.registered_version is not None else "-",
        )


def _accuracy(value: float | None, interval: tuple[float, float] | None, judged: bool) -> str:
    if value is None or not judged:
        return "-"
    if interval is None:
        return f"{value:.1%}"
    return f"{value:.1%} ({100 * interval[0]:.0f}–{interval[1]:.0%})"


def eval_metric(metrics: Mapping[str, float], side: str, name: str) -> float | None:
    """One side's metric of a run: ``eval.<side>.<name>``, or ``<side>.<name>`` as runs
    logged it before the ``eval.`` names."""
    value = metrics.get(f"{EVAL_PREFIX}{side}.{name}")
    return metrics.get(f"{side}.{name}") if value is None else value


def _interval(metrics: Mapping[str, float], side: str, name: str) -> tuple[float, float] | None:
    low = metrics.get(f"{EVAL_PREFIX}{side}.{name}_low")
    high = metrics.get(f"{EVAL_PREFIX}{side}.{name}_high")
    return None if low is None or high is None else (low, high)


def summarize_run(
    run_id: str,
    experiment: str,
    start_time_ms: int,
    status: str,
    metrics: Mapping[str, float],
    tags: Mapping[str, str],
) -> RunSummary:
    """A run summary from what MLflow returns for a run (its metrics and tags)."""
    line = tags.get(TAG_LINE) or experiment.removeprefix("flywheel/")
    version = tags.get(TAG_REGISTERED_VERSION)
    pairs = eval_metric(metrics, "candidate", "pairs")
    return RunSummary(
        run_id=run_id,
        line=line,
        started_at=datetime.fromtimestamp(start_time_ms / 1000, tz=UTC),
        status=status,
        candidate_preference_accuracy=eval_metric(metrics, "candidate", "preference_accuracy"),
        champion_preference_accuracy=eval_metric(metrics, "champion", "preference_accuracy"),
        gate_decision=tags.get(TAG_GATE_DECISION),
        registered_version=int(version) if version and version.isdigit() else None,
        pairs=None if pairs is None else int(pairs),
        candidate_interval=_interval(metrics, "candidate", "preference_accuracy"),
        champion_interval=_interval(metrics, "champion", "preference_accuracy"),
        gate_summary=tags.get(TAG_GATE_SUMMARY),
    )
