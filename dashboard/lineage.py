"""Which dataset builds a line has, their cleaning funnel, and where each record was used.

Read from the dataset manifests that :mod:`feedback.datasets` writes (the funnel
and per-example lineage with source request ids). Manifests are immutable once
written, so each is parsed once and kept, keyed by its path and mtime.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from feedback.datasets import ACCUMULATED, MANIFEST

FUNNEL_LABELS = {
    "pulled": "raw",
    "filtered": "scrubbed + filtered",
    "deduplicated": "deduplicated",
    "in_training": "in training data",
}
# Why records were dropped, grouped the way the page explains them.
DROP_GROUPS = {
    "exact": "duplicate cluster (exact)",
    "near": "duplicate cluster (near)",
    "pii_only": "PII only (nothing left once scrubbed)",
    "empty_prompt": "filter: empty prompt",
    "failed_request": "filter: failed request",
    "trained_in_earlier_window": "trained in an earlier window",
    "earlier_window_cluster_cap": "duplicate cluster (near) of an earlier window, over its cap",
}


@dataclass(frozen=True, slots=True)
class TrainingUse:
    """One training example a record went into."""

    dataset: str
    created_at: str
    kind: str
    split: str
    rule: str

    def as_dict(self) -> dict[str, str]:
        """JSON-ready."""
        return {
            "dataset": self.dataset,
            "created_at": self.created_at,
            "kind": self.kind,
            "split": self.split,
            "rule": self.rule,
        }


@dataclass(frozen=True, slots=True)
class DatasetBuild:
    """A line's dataset build as the page shows it (funnel, counts, window)."""

    name: str
    created_at: str
    funnel: dict[str, Any]
    counts: dict[str, dict[str, int]]
    source: dict[str, Any]
    uses: dict[str, tuple[TrainingUse, ...]]
    # An accumulated build (the training set of recent windows) has no cleaning of its
    # own: ``accumulated_from`` names the window builds it took examples from, and its
    # funnel is that of the newest of them, named by ``funnel_of``.
    accumulated_from: tuple[str, ...] = ()
    funnel_of: str | None = None


def funnel_steps(funnel: dict[str, Any]) -> list[tuple[str, int]]:
    """``(label, records)`` per cleaning step, in pipeline order (pure)."""
    steps = funnel.get("steps") or {}
    return [
        (FUNNEL_LABELS.get(step, step), sum(int(n) for n in counts.values()))
        for step, counts in steps.items()
    ]


def funnel_signals(funnel: dict[str, Any]) -> list[str]:
    """Every signal that appears in any step of the funnel, sorted (pure)."""
    return sorted({signal for counts in (funnel.get("steps") or {}).values() for signal in counts})


def drop_reasons(funnel: dict[str, Any]) -> list[tuple[str, int]]:
    """``(why, records)`` of dropped records, largest first, in the page's words (pure)."""
    reasons: dict[str, int] = {}
    for key, count in (funnel.get("dropped") or {}).items():
        if key.startswith("user_cap:"):
            label = f"per-user cap ({key.removeprefix('user_cap:')} examples)"
        elif key.startswith("key_cap:"):
            label = f"per-key cap ({key.removeprefix('key_cap:')} examples)"
        elif key.startswith("placeholder_target:"):
            kind = key.removeprefix("placeholder_target:")
            label = f"answer would teach a PII placeholder ({kind} examples)"
        else:
            label = DROP_GROUPS.get(key, key.replace("_", " "))
        reasons[label] = reasons.get(label, 0) + int(count)
    return sorted(reasons.items(), key=lambda item: (-item[1], item[0]))


def restored_examples(funnel: dict[str, Any]) -> list[tuple[str, int]]:
    """``(what, examples)`` whose answer invented a PII placeholder and got neutral words
    back instead of being dropped, per kind, in the page's words (pure)."""
    return [
        (f"{kind} examples: placeholder in the answer given a neutral word", int(count))
        for kind, count in sorted((funnel.get("restored") or {}).items())
        if int(count)
    ]


def _build_of(path: Path, manifest: dict[str, Any]) -> DatasetBuild:
    name = str(manifest.get("content_hash", path.parent.name))[:16]
    created = str(manifest.get("created_at", ""))
    uses: dict[str, list[TrainingUse]] = {}
    for example in manifest.get("examples") or []:
        use = TrainingUse(
            dataset=name,
            created_at=created,
            kind=str(example.get("kind", "")),
            split=str(example.get("split", "")),
            rule=str(example.get("rule", "")),
        )
        for request_id in example.get("source_request_ids") or []:
            uses.setdefault(str(request_id), []).append(use)
    return DatasetBuild(
        name=name,
        created_at=created,
        funnel=dict(manifest.get("funnel") or {}),
        counts=dict(manifest.get("counts") or {}),
        source=dict(manifest.get("source") or {}),
        uses={rid: tuple(found) for rid, found in uses.items()},
        accumulated_from=tuple(str(h)[:16] for h in manifest.get(ACCUMULATED) or ()),
    )


def with_window_funnels(builds: list[DatasetBuild]) -> list[DatasetBuild]:
    """Each accumulated build given the funnel of the newest window build it was made
    from (pure; ``builds`` newest first, as :meth:`DatasetIndex.builds` returns them)."""
    by_name = {b.name: b for b in builds}
    shown = []
    for build in builds:
        if build.accumulated_from and not build.funnel:
            sources = [by_name[n] for n in build.accumulated_from if n in by_name]
            window = max((b for b in sources if b.funnel), key=lambda b: b.created_at, default=None)
            if window is not None:
                shown.append(replace(build, funnel=window.funnel, funnel_of=window.name))
                continue
        shown.append(build)
    return shown


class DatasetIndex:
    """The dataset builds under a datasets folder, parsed once per manifest."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._parsed: dict[Path, tuple[float, DatasetBuild]] = {}
        self._lock = threading.Lock()

    def builds(self, business_line: str) -> list[DatasetBuild]:
        """The line's builds, newest first."""
        folder = self.root / business_line
        if not folder.is_dir():
            return []
        found: list[DatasetBuild] = []
        for path in folder.glob(f"*/{MANIFEST}"):
            if path.parent.name.startswith("."):
                continue
            stamp = path.stat().st_mtime
            with self._lock:
                cached = self._parsed.get(path)
            if cached is None or cached[0] != stamp:
                build = _build_of(path, orjson.loads(path.read_bytes()))
                with self._lock:
                    self._parsed[path] = (stamp, build)
            else:
                build = cached[1]
            found.append(build)
        return with_window_funnels(sorted(found, key=lambda b: b.created_at, reverse=True))

    def uses(self, business_line: str, request_id: str) -> list[TrainingUse]:
        """Every training example ``request_id`` went into, newest build first."""
        return [
            use for build in self.builds(business_line) for use in build.uses.get(request_id, ())
        ]
