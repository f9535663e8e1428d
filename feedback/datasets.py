"""Training datasets on disk: per-user caps, a time split, parquet files and a manifest.

A dataset folder holds ``{kind}_{split}.parquet`` files (Hugging Face
``datasets`` parquet, trl's conversational columns plus lineage columns) and a
``manifest.json`` with the content hash, counts, the cleaning funnel and, per
example, its source ids, model versions, business line, time and hashed users.
Folders are written to a temporary name and renamed when complete, so a crash
never leaves a half-written dataset.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from feedback.contributions import keep_per_key, user_cap
from feedback.examples import (
    CORRECTION_RULE,
    MODEL_RULE_PREFIX,
    ExampleKind,
    TrainingExample,
    user_digest,
)
from feedback.label_precision import REVIEW_RULE_PREFIX
from flywheel.file_modes import private_dir, restrict, write_private_bytes
from flywheel.settings.cleaning import DatasetSettings

MANIFEST = "manifest.json"
# Manifest key of a training set accumulated from several window datasets (their hashes).
ACCUMULATED = "accumulated_from"
SPLITS = ("train", "eval")


def cap_per_user(
    examples: list[TrainingExample], share: float
) -> tuple[list[TrainingExample], int]:
    """Keep each owner's newest examples up to the cap; returns the kept list and how many
    went. An owner is a user or, for examples without one, the API key they came with (a
    key's anonymous examples are one owner, :attr:`Lineage.owner`). Examples with neither
    (an operator's import without user ids) are not capped: no caller chose them."""
    per_user: dict[str | None, list[TrainingExample]] = defaultdict(list)
    for example in examples:
        per_user[example.lineage.owner].append(example)
    counts = [len(items) for owner, items in per_user.items() if owner is not None]
    cap = user_cap(counts, share)
    kept: list[TrainingExample] = []
    for owner, items in per_user.items():
        if owner is None:
            kept.extend(items)
            continue
        kept.extend(sorted(items, key=lambda e: e.lineage.time)[-cap:])
    kept.sort(key=lambda e: (e.lineage.time, e.example_id))
    return kept, len(examples) - len(kept)


def cap_per_key(examples: list[TrainingExample], share: float) -> tuple[list[TrainingExample], int]:
    """Keep each API key's examples up to the cap (:func:`user_cap` over the keys, at a
    share of at least ``1 / keys``: a key alone on a line holds what it holds); returns
    the kept list and how many went. A key that posts as many invented users is bounded
    like one that posts as one. What a key keeps is spread over its owners, each owner's
    newest first, so its real users are not crowded out by its busiest one. Examples
    without a key (imports, traffic logged before keys were recorded) are not capped."""
    kept = keep_per_key(examples, lambda e: e.lineage.key, share, _spread_over_owners)
    kept.sort(key=lambda e: (e.lineage.time, e.example_id))
    return kept, len(examples) - len(kept)


def _spread_over_owners(examples: list[TrainingExample]) -> list[TrainingExample]:
    """Every owner's newest example first, then every owner's second newest, and so on."""
    per_owner: dict[str | None, list[TrainingExample]] = defaultdict(list)
    for example in sorted(examples, key=lambda e: (e.lineage.time, e.example_id), reverse=True):
        per_owner[example.lineage.owner].append(example)
    ranked = [(rank, example) for items in per_owner.values() for rank, example in enumerate(items)]
    ranked.sort(key=lambda item: (item[1].lineage.time, item[1].example_id), reverse=True)
    ranked.sort(key=lambda item: item[0])  # stable: newest first within each rank
    return [example for _, example in ranked]


def cap_contributions(
    examples: list[TrainingExample], *, user_share: float, key_share: float
) -> tuple[list[TrainingExample], int, int]:
    """The examples within both caps: per owner (:func:`cap_per_user`), then per API key
    (:func:`cap_per_key`); returns them and how many each cap took."""
    by_user, user_removed = cap_per_user(examples, user_share)
    by_key, key_removed = cap_per_key(by_user, key_share)
    return by_key, user_removed, key_removed


def split_by_time(
    examples: list[TrainingExample], eval_fraction: float
) -> dict[str, list[TrainingExample]]:
    """The newest ``eval_fraction`` of examples (at least one when there are two) is eval."""
    ordered = sorted(examples, key=lambda e: (e.lineage.time, e.example_id))
    n_eval = round(len(ordered) * eval_fraction)
    if eval_fraction > 0 and n_eval == 0 and len(ordered) >= 2:
        n_eval = 1
    cut = len(ordered) - n_eval
    return {"train": ordered[:cut], "eval": ordered[cut:]}


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestExample:
    """One example's entry in a dataset manifest: what it is, which rule made it, where it
    came from (requests, feedback events, model versions, hashed users, API keys) and what
    it weighs. A deletion request finds every dataset an example of its user went into by
    ``users``."""

    example_id: str
    kind: str
    split: str
    rule: str
    source_request_ids: tuple[str, ...]
    source_event_ids: tuple[int, ...]
    model_versions: tuple[str, ...]
    business_line: str
    time: str
    users: tuple[str, ...]
    keys: tuple[str, ...] = ()
    weight: float = 1.0

    @classmethod
    def of(cls, example: TrainingExample, split: str) -> ManifestExample:
        """The entry of an example written to ``split``."""
        lineage = example.lineage
        return cls(
            example_id=example.example_id,
            kind=example.kind,
            split=split,
            rule=example.rule,
            source_request_ids=lineage.request_ids,
            source_event_ids=lineage.event_ids,
            model_versions=lineage.model_versions,
            business_line=lineage.business_line,
            time=lineage.time,
            users=lineage.users,
            keys=lineage.keys,
            weight=example.weight,
        )

    @classmethod
    def from_dict(cls, item: Mapping[str, Any]) -> ManifestExample:
        """An entry as a manifest holds it; entries written before 2026-12-04 have no
        ``keys`` (none recorded) and no ``weight`` (each counted 1)."""
        return cls(
            example_id=str(item["example_id"]),
            kind=str(item["kind"]),
            split=str(item["split"]),
            rule=str(item["rule"]),
            source_request_ids=tuple(item["source_request_ids"]),
            source_event_ids=tuple(item["source_event_ids"]),
            model_versions=tuple(item["model_versions"]),
            business_line=str(item["business_line"]),
            time=str(item["time"]),
            users=tuple(item["users"]),
            keys=tuple(item.get("keys") or ()),
            weight=float(item.get("weight", 1.0)),
        )

    def as_dict(self) -> dict[str, Any]:
        """The entry as the manifest (JSON) holds it."""
        return {
            "example_id": self.example_id,
            "kind": self.kind,
            "split": self.split,
            "rule": self.rule,
            "source_request_ids": list(self.source_request_ids),
            "source_event_ids": list(self.source_event_ids),
            "model_versions": list(self.model_versions),
            "business_line": self.business_line,
            "time": self.time,
            "users": list(self.users),
            "keys": list(self.keys),
            "weight": self.weight,
        }


@dataclass(frozen=True, slots=True)
class DatasetBuild:
    """A dataset written to disk: its folder and its manifest, as the JSON file holds it
    (read through the properties; the dict is for display and the manifest's own edits)."""

    path: Path
    manifest: dict[str, Any]

    @property
    def content_hash(self) -> str:
        """Hash of every example id with its kind and split."""
        return str(self.manifest["content_hash"])

    @property
    def created_at(self) -> str:
        """When the dataset was written (ISO-8601, UTC): builds of a line sort by it."""
        return str(self.manifest["created_at"])

    @property
    def counts(self) -> dict[str, dict[str, int]]:
        """Examples per kind and split."""
        return {
            kind: {split: int(n) for split, n in by_split.items()}
            for kind, by_split in self.manifest["counts"].items()
        }

    @property
    def examples(self) -> list[ManifestExample]:
        """Every example's manifest entry, in the manifest's order."""
        return [ManifestExample.from_dict(item) for item in self.manifest["examples"]]


def content_hash(splits: dict[ExampleKind, dict[str, list[TrainingExample]]]) -> str:
    """A hash of the dataset's content: kinds, splits and example ids, in order."""
    digest = hashlib.sha256()
    for kind in sorted(splits):
        for split in SPLITS:
            for example in splits[kind][split]:
                digest.update(f"{kind}/{split}/{example.example_id}\n".encode())
    return digest.hexdigest()


def write_dataset(
    root: Path,
    business_line: str,
    splits: dict[ExampleKind, dict[str, list[TrainingExample]]],
    *,
    funnel: dict[str, Any],
    source: dict[str, Any],
    settings: DatasetSettings,
) -> DatasetBuild:
    """Write parquet files and the manifest under ``root/<line>/<hash>/`` (atomically).

    The same content written twice lands in the same folder, which is reused.
    """
    import datasets  # type: ignore[import-untyped]
    from datasets import Dataset

    datasets.disable_progress_bars()
    digest = content_hash(splits)
    final = root / business_line / digest[:16]
    if (final / MANIFEST).exists():
        return DatasetBuild(final, orjson.loads((final / MANIFEST).read_bytes()))
    staging = root / business_line / f".tmp-{digest[:16]}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    private_dir(staging)
    files: dict[str, Any] = {}
    entries: list[ManifestExample] = []
    counts: dict[str, dict[str, int]] = {}
    for kind, by_split in sorted(splits.items()):
        counts[kind] = {}
        for split in SPLITS:
            examples = by_split[split]
            counts[kind][split] = len(examples)
            if not examples:
                continue
            name = f"{kind}_{split}.parquet"
            Dataset.from_list([e.as_row() for e in examples]).to_parquet(str(staging / name))
            restrict(staging / name)
            files[name] = _sha256(staging / name)
            entries.extend(ManifestExample.of(e, split) for e in examples)
    manifest = {
        "business_line": business_line,
        "content_hash": digest,
        "created_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "counts": counts,
        "rules": dict(Counter(f"{e.kind}:{e.rule}" for e in entries)),
        "files": files,
        "funnel": funnel,
        "source": source,
        "settings": settings.model_dump(mode="json"),
        "examples": [e.as_dict() for e in entries],
    }
    return _publish(staging, final, manifest)


def _publish(staging: Path, final: Path, manifest: dict[str, Any]) -> DatasetBuild:
    """Write the manifest last, then move the complete folder into place (atomically)."""
    write_private_bytes(staging / MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    try:
        staging.rename(final)
    except OSError:
        # Another writer finished the same content first; theirs is identical.
        shutil.rmtree(staging, ignore_errors=True)
    return DatasetBuild(final, orjson.loads((final / MANIFEST).read_bytes()))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def iter_manifests(root: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every complete dataset manifest under ``root``."""
    if not root.exists():
        return
    for path in sorted(root.glob(f"*/*/{MANIFEST}")):
        if not path.parent.name.startswith("."):
            yield path, orjson.loads(path.read_bytes())


def line_builds(root: Path, business_line: str) -> list[DatasetBuild]:
    """The line's datasets built from store windows (not accumulated sets), oldest first."""
    builds = [
        DatasetBuild(path.parent, manifest)
        for path, manifest in iter_manifests(root)
        if manifest["business_line"] == business_line and ACCUMULATED not in manifest
    ]
    return sorted(builds, key=lambda b: b.created_at)


def latest_dataset(root: Path, business_line: str) -> DatasetBuild | None:
    """The newest dataset of a line built from a store window, if any."""
    builds = line_builds(root, business_line)
    return builds[-1] if builds else None


def dataset_by_hash(root: Path, business_line: str, digest: str) -> DatasetBuild | None:
    """The line's dataset with this content hash (window-built or accumulated)."""
    folder = root / business_line / digest[:16]
    if not (folder / MANIFEST).exists():
        return None
    return DatasetBuild(folder, orjson.loads((folder / MANIFEST).read_bytes()))


def recency_weight(age_days: float, half_life_days: float) -> float:
    """An example's weight for its age: halves every ``half_life_days``."""
    return float(0.5 ** (max(0.0, age_days) / half_life_days))


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True, slots=True)
class StoredRow:
    """One example as a dataset's parquet file holds it: trl's columns of its kind, then its
    rule, weight and lineage columns (:meth:`TrainingExample.as_row`). An accumulated set
    reads its id, time and weight and writes the columns back as they were, re-weighted."""

    columns: dict[str, Any]

    @property
    def example_id(self) -> str:
        """The example's content hash."""
        return str(self.columns["example_id"])

    @property
    def time(self) -> str:
        """The newest source time of the example (ISO-8601, UTC)."""
        return str(self.columns["time"])

    def reweighted(self, factor: float) -> StoredRow:
        """The row with its weight (1 where none is stored) times ``factor``."""
        weight = float(self.columns.get("weight") or 1.0)
        return StoredRow({**self.columns, "weight": round(weight * factor, 6)})

    def hash_line(self, kind: str, split: str) -> bytes:
        """The row's line in an accumulated set's content hash: its id and stored weight."""
        return f"{kind}/{split}/{self.example_id}/{self.columns['weight']}\n".encode()


# Rows by kind, split and example id.
RowsByKind = dict[str, dict[str, dict[str, StoredRow]]]


def _read_splits(
    builds: Sequence[DatasetBuild],
) -> tuple[RowsByKind, dict[str, dict[str, Any]], dict[str, str]]:
    """Rows by kind, split and example id (newer builds win), manifest entries by example id
    (as each manifest holds them), and the build each example was last seen in."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    rows: RowsByKind = defaultdict(lambda: defaultdict(dict))
    lineage: dict[str, dict[str, Any]] = {}
    origin: dict[str, str] = {}
    for build in sorted(builds, key=lambda b: b.created_at):
        for item in build.manifest["examples"]:
            lineage[item["example_id"]] = item
            origin[item["example_id"]] = build.content_hash
        for kind in ("sft", "dpo", "kto"):
            for split in SPLITS:
                path = build.path / f"{kind}_{split}.parquet"
                if path.exists():
                    for columns in pq.read_table(path).to_pylist():
                        row = StoredRow(columns)
                        rows[kind][split][row.example_id] = row
    return rows, lineage, origin


def accumulate(
    root: Path,
    business_line: str,
    builds: Sequence[DatasetBuild],
    *,
    horizon_days: float,
    half_life_days: float,
) -> DatasetBuild:
    """One training set from the line's examples of the last ``horizon_days``.

    Examples are deduplicated by id (the newest copy wins); a training example
    that is also held out anywhere is dropped from training, so evaluation
    never scores what was trained on. Ages count back from the newest example;
    each example's weight is its signal weight times :func:`recency_weight` of
    its age. The set
    is written like any dataset (parquet files and a manifest with lineage),
    marked with the hashes it was built from, under the line's folder.
    """
    from datasets import Dataset

    if not builds:
        raise ValueError("accumulate needs at least one dataset")
    rows, lineage, origin = _read_splits(builds)
    times = [_parse_time(r.time) for k in rows.values() for v in k.values() for r in v.values()]
    newest = max(times, default=datetime.now(UTC))

    def age_days(row: StoredRow) -> float:
        return (newest - _parse_time(row.time)).total_seconds() / 86_400

    splits: dict[str, dict[str, list[StoredRow]]] = {}
    used: set[str] = set()
    for kind, by_split in rows.items():
        held_out = set(by_split.get("eval", {}))
        recent = {
            split: {i: r for i, r in items.items() if age_days(r) <= horizon_days}
            for split, items in by_split.items()
        }
        splits[kind] = {
            "train": [
                r.reweighted(recency_weight(age_days(r), half_life_days))
                for i, r in recent.get("train", {}).items()
                if i not in held_out
            ],
            "eval": list(recent.get("eval", {}).values()),
        }
        used.update(origin[r.example_id] for items in splits[kind].values() for r in items)
    chosen = [b for b in builds if b.content_hash in used]
    digest = hashlib.sha256()
    for kind in sorted(splits):
        for split in SPLITS:
            for row in sorted(splits[kind][split], key=lambda r: r.example_id):
                digest.update(row.hash_line(kind, split))
    content = digest.hexdigest()
    final = root / business_line / content[:16]
    if (final / MANIFEST).exists():
        return DatasetBuild(final, orjson.loads((final / MANIFEST).read_bytes()))
    staging = root / business_line / f".tmp-{content[:16]}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    private_dir(staging)
    counts: dict[str, dict[str, int]] = {}
    files: dict[str, str] = {}
    kept: list[dict[str, Any]] = []
    for kind in sorted(splits):
        counts[kind] = {}
        for split in SPLITS:
            items = sorted(splits[kind][split], key=lambda r: (r.time, r.example_id))
            counts[kind][split] = len(items)
            if not items:
                continue
            name = f"{kind}_{split}.parquet"
            Dataset.from_list([r.columns for r in items]).to_parquet(str(staging / name))
            restrict(staging / name)
            files[name] = _sha256(staging / name)
            kept += [lineage[r.example_id] for r in items if r.example_id in lineage]
    manifest = {
        "business_line": business_line,
        "content_hash": content,
        "created_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        ACCUMULATED: [b.content_hash for b in chosen],
        "horizon_days": horizon_days,
        "half_life_days": half_life_days,
        "counts": counts,
        "rules": dict(Counter(f"{item['kind']}:{item['rule']}" for item in kept)),
        "files": files,
        "funnel": {},
        "examples": kept,
    }
    return _publish(staging, final, manifest)


def manifests_with_user(root: Path, user_id: str) -> list[Path]:
    """Manifests of datasets with at least one example from ``user_id``."""
    digest = user_digest(user_id)
    return [
        path
        for path, manifest in iter_manifests(root)
        if any(digest in e.users for e in DatasetBuild(path.parent, manifest).examples)
    ]


# Manifest key listing the rewrites that took forgotten users' examples out of a dataset.
FORGOTTEN_REWRITES = "forgotten_rewrites"


@dataclass(frozen=True, slots=True)
class DatasetRewrite:
    """A dataset written again without a forgotten user's examples.

    ``new`` is ``None`` when nothing was left (the folder is gone); the old folder is
    removed either way, so the content hash ``old_hash`` no longer resolves on disk.
    """

    business_line: str
    old_hash: str
    removed: int
    new: DatasetBuild | None
    # Every hash this dataset had: the old one and those before earlier rewrites (models
    # trained on any of them learnt from the user).
    former_hashes: tuple[str, ...] = ()

    @property
    def new_hash(self) -> str | None:
        """The rewritten dataset's content hash, if any example was left."""
        return self.new.content_hash if self.new is not None else None


def _rewritten_hash(kept: dict[str, dict[str, list[StoredRow]]], accumulated: bool) -> str:
    """The content hash the builder gives these rows: :func:`content_hash` for a window's
    dataset (file order), the weighted form of :func:`accumulate` for an accumulated one."""
    digest = hashlib.sha256()
    for kind in sorted(kept):
        for split in SPLITS:
            rows = kept[kind].get(split, [])
            if accumulated:
                for row in sorted(rows, key=lambda r: r.example_id):
                    digest.update(row.hash_line(kind, split))
            else:
                for row in rows:
                    digest.update(f"{kind}/{split}/{row.example_id}\n".encode())
    return digest.hexdigest()


def rewrite_without(
    build: DatasetBuild,
    doomed: set[str],
    *,
    renamed: dict[str, str | None] | None = None,
    now: datetime | None = None,
) -> DatasetRewrite:
    """Write ``build`` again without the examples whose ids are in ``doomed``, in a new
    folder named by its new content hash, then remove the old folder.

    The manifest keeps everything else (creation time, funnel, window, settings) and
    gains an entry under ``forgotten_rewrites`` (the old hash, when, how many examples
    went, never whose); counts, rules, file hashes and lineage describe what is left.
    ``renamed`` maps the hashes of window datasets already rewritten to their new ones,
    so an accumulated set names what it was built from as it now is.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    manifest = build.manifest
    line = str(manifest["business_line"])
    accumulated = ACCUMULATED in manifest
    root = build.path.parent.parent
    kept: dict[str, dict[str, list[StoredRow]]] = {}
    tables: dict[str, pa.Table] = {}
    for name in sorted(manifest.get("files", {})):
        kind, split = name.removesuffix(".parquet").split("_", 1)
        table = pq.read_table(build.path / name)
        mask = pa.array([i not in doomed for i in table.column("example_id").to_pylist()])
        table = table.filter(mask)
        columns = table.select(["example_id", "weight"]).to_pylist()
        kept.setdefault(kind, {})[split] = [StoredRow(c) for c in columns]
        if table.num_rows:
            tables[name] = table
    examples = [e for e in manifest["examples"] if e["example_id"] not in doomed]
    removed = len(manifest["examples"]) - len(examples)
    digest = _rewritten_hash(kept, accumulated)
    earlier = [str(r["from"]) for r in manifest.get(FORGOTTEN_REWRITES, [])]
    former = (build.content_hash, *earlier)
    if not tables:
        shutil.rmtree(build.path, ignore_errors=True)
        return DatasetRewrite(line, build.content_hash, removed, None, former)
    final = root / line / digest[:16]
    staging = root / line / f".tmp-{digest[:16]}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    private_dir(staging)
    files: dict[str, str] = {}
    for name, table in tables.items():
        pq.write_table(table, staging / name)
        restrict(staging / name)
        files[name] = _sha256(staging / name)
    counts = {
        kind: {split: len(kept.get(kind, {}).get(split, [])) for split in SPLITS}
        for kind in manifest.get("counts", {})
    }
    rewrites = [*manifest.get(FORGOTTEN_REWRITES, [])]
    rewrites.append(
        {
            "from": build.content_hash,
            "at": (now or datetime.now(UTC)).isoformat().replace("+00:00", "Z"),
            "removed_examples": removed,
        }
    )
    rewritten = {
        **manifest,
        "content_hash": digest,
        "counts": counts,
        "rules": dict(Counter(f"{item['kind']}:{item['rule']}" for item in examples)),
        "files": files,
        "examples": examples,
        FORGOTTEN_REWRITES: rewrites,
    }
    if accumulated and renamed:
        sources = [renamed.get(h, h) for h in manifest[ACCUMULATED]]
        rewritten[ACCUMULATED] = [h for h in sources if h is not None]
    if final == build.path:
        shutil.rmtree(staging, ignore_errors=True)
        return DatasetRewrite(line, build.content_hash, removed, build, former)
    new = _publish(staging, final, rewritten)
    shutil.rmtree(build.path, ignore_errors=True)
    return DatasetRewrite(line, build.content_hash, removed, new, former)


def forget_in_datasets(
    root: Path, stored_ids: Sequence[str], *, now: datetime | None = None
) -> list[DatasetRewrite]:
    """Rewrite every dataset under ``root`` that holds an example of any of
    ``stored_ids`` without those examples: the windows' datasets first, then the
    accumulated sets (which then name the rewritten windows). Examples shared with
    other users (a pair across two users' answers) go too: they hold the user's text."""
    digests = {d for d in (user_digest(u) for u in stored_ids) if d is not None}
    builds = (DatasetBuild(path.parent, manifest) for path, manifest in iter_manifests(root))
    holding = [b for b in builds if any(digests & set(e.users) for e in b.examples)]
    holding.sort(key=lambda b: (ACCUMULATED in b.manifest, b.created_at))
    renamed: dict[str, str | None] = {}
    rewrites = []
    for build in holding:
        doomed = {e.example_id for e in build.examples if digests & set(e.users)}
        rewrite = rewrite_without(build, doomed, renamed=renamed, now=now)
        renamed[rewrite.old_hash] = rewrite.new_hash
        rewrites.append(rewrite)
    return rewrites


def count_train_examples(manifest: Mapping[str, Any], method: str) -> int:
    """Training examples of a method in a dataset manifest."""
    return int(manifest["counts"].get(method, {}).get("train", 0))


def model_labelled_count(manifest: Mapping[str, Any], method: str) -> int:
    """Training examples of a method that a satisfaction model labelled (by their rule)."""
    return usable_signal(manifest, method).model_examples


@dataclass(frozen=True, slots=True)
class UsableSignal:
    """A dataset's training examples of one method: how many and what they weigh, from users'
    signals, from reviewers (their verdicts and corrections) and from the satisfaction model (a
    model label weighs its confidence times the recipe's model_weight; a regenerate half an
    edit)."""

    user_examples: int
    user_weight: float
    model_examples: int
    model_weight: float
    review_examples: int = 0
    review_weight: float = 0.0

    @property
    def weight(self) -> float:
        """The usable signal: every example's weight."""
        return self.user_weight + self.review_weight + self.model_weight

    def describe(self, method: str) -> str:
        """E.g. "18 new SFT training examples weighing 14.5 (10 from users' signals, 9.0;
        2 from reviewers, 2.0; 6 labelled by the satisfaction model, 3.5)"."""
        total = self.user_examples + self.review_examples + self.model_examples
        return (
            f"{total} new {method.upper()} training examples weighing {self.weight:.1f} "
            f"({self.user_examples} from users' signals, {self.user_weight:.1f}; "
            f"{self.review_examples} from reviewers, {self.review_weight:.1f}; "
            f"{self.model_examples} labelled by the satisfaction model, {self.model_weight:.1f})"
        )


def _source(rule: str) -> int:
    """0: users' signals, 1: reviewers, 2: the satisfaction model."""
    if rule.startswith(MODEL_RULE_PREFIX):
        return 2
    if rule.startswith((REVIEW_RULE_PREFIX, CORRECTION_RULE)):
        return 1
    return 0


def usable_signal(manifest: Mapping[str, Any], method: str) -> UsableSignal:
    """What a dataset's training split of ``method`` holds (manifests written before weights
    were recorded count each example as 1)."""
    if "examples" not in manifest:
        total = count_train_examples(manifest, method)
        return UsableSignal(total, float(total), 0, 0.0)
    counts, weights = [0, 0, 0], [0.0, 0.0, 0.0]
    for item in manifest["examples"]:
        if item["kind"] != method or item["split"] != "train":
            continue
        source = _source(str(item.get("rule", "")))
        counts[source] += 1
        weights[source] += float(item.get("weight", 1.0))
    return UsableSignal(
        user_examples=counts[0],
        user_weight=weights[0],
        model_examples=counts[2],
        model_weight=weights[2],
        review_examples=counts[1],
        review_weight=weights[1],
    )


def train_counts(manifest: Mapping[str, Any]) -> dict[str, int]:
    """Training examples per method in a dataset manifest."""
    return {method: count_train_examples(manifest, method) for method in ("sft", "dpo", "kto")}
