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
from typing import Any

from eval.reports import EvalReport, GateDecision
from flywheel.errors import FlywheelError

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


def metrics_table(candidate: EvalReport, champion: EvalReport) -> dict[str, list[Any]]:
    """The metric comparison, one row per metric: candidate, champion, and the difference."""
    ours = candidate.metrics()
    theirs = champion.metrics()
    names = list(ours | theirs)
    rows: dict[str, list[Any]] = {"metric": [], "candidate": [], "champion": [], "delta": []}
    for name in names:
        a, b = ours.get(name), theirs.get(name)
        rows["metric"].append(name)
        rows["candidate"].append(a)
        rows["champion"].append(b)
        rows["delta"].append(None if a is None or b is None else a - b)
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
    """Run tags of a gate decision, cut to MLflow's tag limit."""
    return {
        TAG_GATE_DECISION: "promote" if decision.promote else "reject",
        TAG_GATE_REASONS: truncate("\n".join(decision.reasons)),
    }


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
    "candidate acc",
    "champion acc",
    "gate",
    "version",
)


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

    def cells(self) -> tuple[str, ...]:
        """The row's cells, in the order of ``RUN_COLUMNS``."""
        return (
            self.run_id[:12],
            self.line,
            self.started_at.strftime("%Y-%m-%d %H:%M"),
            self.status.lower(),
            _percent(self.candidate_preference_accuracy),
            _percent(self.champion_preference_accuracy),
            self.gate_decision or "-",
            f"v{self.registered_version}" if self.registered_version is not None else "-",
        )


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


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
    return RunSummary(
        run_id=run_id,
        line=line,
        started_at=datetime.fromtimestamp(start_time_ms / 1000, tz=UTC),
        status=status,
        candidate_preference_accuracy=metrics.get("candidate.preference_accuracy"),
        champion_preference_accuracy=metrics.get("champion.preference_accuracy"),
        gate_decision=tags.get(TAG_GATE_DECISION),
        registered_version=int(version) if version and version.isdigit() else None,
    )
