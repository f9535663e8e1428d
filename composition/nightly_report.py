"""What a line's nightly run did: its report, stage by stage, and each stage in a line.

The nightly flow (``flows.nightly``) fills a :class:`LineReport` as its stages finish and
logs each one with the ``describe_*`` functions here, on its run's page in Prefect's UI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from composition.line_training import TrainingStatus, TrainResult


class LineStatus(StrEnum):
    """How a line's nightly run ended."""

    STARTED = "started"
    DEPLOYED = "deployed"  # a new version on its canary
    GATED_OUT = "gated_out"
    SKIPPED = "skipped"
    REUSED = "reused"  # nothing to deploy: the version already served or was judged
    CANARY_LIVE = "canary_live"
    FAILED = "failed"
    BUSY = "busy"


@dataclass(slots=True)
class LineReport:
    """What one line's nightly run did, stage by stage."""

    business_line: str
    status: LineStatus = LineStatus.STARTED
    reason: str = ""
    window_since: str | None = None
    window_until: str | None = None
    resumed: bool = False
    examples: dict[str, int] = field(default_factory=dict)
    version: int | None = None
    adapter: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    # Raw text past the recipe's retention.raw_days: rows scrubbed (or deleted) tonight.
    retention: dict[str, Any] = field(default_factory=dict)
    # The line's satisfaction model tonight: accepted or refused, and why.
    satisfaction_model: dict[str, Any] = field(default_factory=dict)


def describe_examples(examples: dict[str, int]) -> str:
    """E.g. "460 training examples (SFT 120, DPO 40, KTO 300)"."""
    kinds = ", ".join(f"{kind.upper()} {count:,}" for kind, count in examples.items())
    return f"{sum(examples.values()):,} training examples" + (f" ({kinds})" if kinds else "")


def describe_datasets(line: str, datasets: dict[str, Any], seconds: float) -> str:
    """The datasets stage in a line: the dataset, its training examples by kind and the
    records they came from."""
    pulled = sum(datasets.get("funnel", {}).get("steps", {}).get("pulled", {}).values())
    source = f" from {pulled:,} records" if pulled else ""
    if datasets["dataset"] is None:
        return f"{line}: no new dataset: {describe_examples({})}{source} ({seconds:.1f} s)"
    return (
        f"{line}: dataset {str(datasets['dataset'])[:12]}, "
        f"{describe_examples(datasets['train_examples'])}{source} ({seconds:.1f} s)"
    )


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def describe_training(line: str, trained: TrainResult, seconds: float) -> str:
    """The training stage in a line: trained (how long) or reused, and the gate's verdict
    with its reason; or why nothing was trained."""
    if trained.status is TrainingStatus.SKIPPED or trained.version is None:
        return f"{line}: training skipped: {trained.reason}"
    verdict = "passed" if trained.promote else "failed"
    if trained.status is TrainingStatus.REUSED:
        return f"{line}: reused v{trained.version}, gate {verdict}: {trained.reason}"
    return (
        f"{line}: trained v{trained.version} in {_duration(seconds)}; "
        f"gate {verdict}: {trained.reason}"
    )


def describe_retention(line: str, retention: dict[str, Any]) -> str:
    """What the retention stage did to the line's raw text older than its recipe allows."""
    counts = {
        name: int(retention.get(name, 0))
        for name in ("interactions", "feedback_events", "shadow_outputs")
    }
    if not any(counts.values()):
        return f"{line}: retention: no raw text older than {retention.get('cutoff', 'its limit')}"
    done = "deleted" if retention.get("action") == "delete" else "scrubbed"
    rows = ", ".join(f"{count:,} {name.replace('_', ' ')}" for name, count in counts.items())
    return f"{line}: retention: {done} {rows} older than {retention.get('cutoff')}"


def describe_line(report: LineReport) -> str:
    """How a line's night ended, in a line: status, version and adapter, why, how long."""
    what = [f"v{report.version}"] if report.version is not None else []
    what += [report.adapter] if report.adapter else []
    took = sum(seconds for stage, seconds in report.seconds.items() if "." not in stage)
    return (
        f"{report.business_line}: {report.status}"
        + (f" ({', '.join(what)})" if what else "")
        + (f": {report.reason}" if report.reason else "")
        + (f" [{_duration(took)}]" if took else "")
    )


DEPLOY_STATUS = {
    "canary": LineStatus.DEPLOYED,
    "shadow": LineStatus.DEPLOYED,
    "failed": LineStatus.FAILED,
    "refused": LineStatus.FAILED,
    "kept_canary": LineStatus.CANARY_LIVE,
    "kept_shadow": LineStatus.CANARY_LIVE,
    "none": LineStatus.REUSED,
}
