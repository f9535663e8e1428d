"""Dedup over partitions: sign each partition apart, shuffle band keys, join the edges.

The one-batch path (:func:`feedback.dedup.assign_clusters`) holds every
record's signature in one process. Here no process holds all of them:

1. *sign* (one task per partition): each partition signs its records and
   writes them to a staging folder: scope, time and exact hash per record, the
   fingerprints (read back memory-mapped, a row at a time), and its bucket
   entries ``(band, scope, key, row)`` split into shards by a hash of
   ``(band, scope, key)``; the exact hash is band ``-1``;
2. *bucket* (one task per shard): a shard reads its entries from every
   partition, so it sees whole buckets; it joins each bucket member to the
   bucket's first record (unconditionally for the exact hash, for a band key
   when the estimated similarity reaches the threshold) and returns a spanning
   forest of what it joined, at most one edge per record it saw;
3. *join* (the driver): a union-find over the edges of all shards, then the
   same keep/drop decision as the one-batch path.

Records are numbered across partitions in partition order, so with partitions
that follow ingest order the clusters and decisions are exactly those of the
one-batch path: both join the same candidate pairs, and the one-batch path
only skips the similarity check of pairs already joined.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from feedback.dedup.clusters import ClusterForest, DedupDecision, decide_clusters
from feedback.dedup.records import DedupInputError, record_text, record_time, scope_hash
from feedback.dedup.signature import TextSignatures, estimated_similarity, mix_hash, sign_texts
from flywheel.settings.cleaning import DedupSettings

EXACT_BAND = -1
_META = "meta.npz"
_FINGERPRINTS = "fingerprints.npy"


def partition_dir(staging: Path, partition: int) -> Path:
    """Where one partition's signatures live."""
    return staging / f"part-{partition:05d}"


def _shard_file(staging: Path, partition: int, shard: int) -> Path:
    return partition_dir(staging, partition) / f"shard-{shard:05d}.npz"


@dataclass(frozen=True, slots=True)
class PartitionMeta:
    """Per-record columns of a partition that the final decision needs."""

    times: NDArray[np.float64]
    has_text: NDArray[np.bool_]
    exact_hash: NDArray[np.uint64]


def sign_partition(
    records: list[dict[str, Any]],
    *,
    field: str,
    settings: DedupSettings,
    staging: Path,
    partition: int,
    shards: int,
) -> int:
    """Sign one partition's records and write its metadata, fingerprints and shard entries.

    Returns the number of records. Records with a ``pair_id`` are refused:
    keeping the two answers of a pair apart needs them in one batch.
    """
    for index, record in enumerate(records):
        if record.get(settings.pair_id_field) is not None:
            raise DedupInputError(
                f"record {index}: field {settings.pair_id_field!r} is set; "
                "deduplicate preference pairs in one batch (assign_clusters)"
            )
    try:
        texts = [record_text(r, field) for r in records]
        times = np.array(
            [record_time(r, settings.created_at_field) for r in records], dtype=np.float64
        )
    except DedupInputError as exc:
        raise DedupInputError(f"partition {partition}: {exc}") from exc
    scopes = np.array([scope_hash(r, settings) for r in records], dtype=np.uint64)
    stage_signatures(
        staging,
        partition,
        shards,
        times=times,
        scopes=scopes,
        signatures=sign_texts(texts, settings),
        settings=settings,
    )
    return len(records)


def stage_signatures(
    staging: Path,
    partition: int,
    shards: int,
    *,
    times: NDArray[np.float64],
    scopes: NDArray[np.uint64],
    signatures: TextSignatures,
    settings: DedupSettings,
) -> None:
    """Write one partition's signed records: metadata, fingerprints and shard entries.

    Used by :func:`sign_partition` and for records signed elsewhere (an earlier
    night's, read from the store, see :mod:`feedback.dedup.history`).
    """
    folder = partition_dir(staging, partition)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(
        folder / _META,
        times=times,
        has_text=signatures.has_text,
        exact_hash=signatures.exact_hash,
        scope=scopes,
        has_shingles=signatures.has_shingles,
        band_keys=signatures.band_keys,
    )
    np.save(folder / _FINGERPRINTS, signatures.fingerprints)

    rows = np.arange(len(signatures), dtype=np.int64)
    with_text = rows[signatures.has_text]
    with_shingles = rows[signatures.has_shingles]
    band_count = signatures.band_keys.shape[1] if settings.near_duplicates else 0
    bands = np.concatenate(
        [np.full(with_text.size, EXACT_BAND, dtype=np.int16)]
        + [np.full(with_shingles.size, band, dtype=np.int16) for band in range(band_count)]
    )
    entry_rows = np.concatenate([with_text] + [with_shingles] * band_count)
    keys = np.concatenate(
        [signatures.exact_hash[with_text]]
        + [signatures.band_keys[with_shingles, band] for band in range(band_count)]
    )
    entry_scopes = scopes[entry_rows]
    shard_of = _shard_of(bands, entry_scopes, keys, shards)
    for shard in range(shards):
        mine = shard_of == shard
        np.savez(
            _shard_file(staging, partition, shard),
            band=bands[mine],
            scope=entry_scopes[mine],
            key=keys[mine],
            row=entry_rows[mine],
        )


def _shard_of(
    bands: NDArray[np.int16], scopes: NDArray[np.uint64], keys: NDArray[np.uint64], shards: int
) -> NDArray[np.int64]:
    mixed = mix_hash(keys ^ mix_hash(scopes ^ bands.astype(np.int64).astype(np.uint64)))
    return (mixed % np.uint64(shards)).astype(np.int64)


def bucket_shard(
    staging: Path, shard: int, offsets: list[int], settings: DedupSettings
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Join the buckets of one shard; returns a spanning forest as ``(record, root)`` pairs.

    ``offsets`` gives the global number of each partition's first record (and
    the total as its last element). Numbers in the result are global.
    """
    parts = [np.load(_shard_file(staging, p, shard)) for p in range(len(offsets) - 1)]
    band = np.concatenate([part["band"] for part in parts])
    scope = np.concatenate([part["scope"] for part in parts])
    key = np.concatenate([part["key"] for part in parts])
    record = np.concatenate([part["row"] + offsets[p] for p, part in enumerate(parts)]).astype(
        np.int64
    )
    if record.size < 2:
        return _no_edges()
    order = np.lexsort((record, key, scope, band))
    band, scope, key, record = band[order], scope[order], key[order], record[order]
    new_bucket = np.ones(record.size, dtype=np.bool_)
    new_bucket[1:] = (band[1:] != band[:-1]) | (scope[1:] != scope[:-1]) | (key[1:] != key[:-1])
    first = record[np.flatnonzero(new_bucket)[np.cumsum(new_bucket) - 1]]
    joined = ~new_bucket
    left, right, exact = record[joined], first[joined], band[joined] == EXACT_BAND

    candidates = np.unique(np.stack([left[~exact], right[~exact]], axis=1), axis=0)
    similar = (
        estimated_similarity(
            _fingerprints(staging, candidates[:, 0], offsets, settings.num_perm),
            _fingerprints(staging, candidates[:, 1], offsets, settings.num_perm),
        )
        >= settings.threshold
        if candidates.size
        else np.zeros(0, dtype=np.bool_)
    )
    left = np.concatenate([left[exact], candidates[similar, 0]])
    right = np.concatenate([right[exact], candidates[similar, 1]])
    return _spanning_forest(left, right)


def _fingerprints(
    staging: Path, records: NDArray[np.int64], offsets: list[int], width: int
) -> NDArray[np.uint8]:
    """Fingerprint rows of global records, read from each partition's memory-mapped file."""
    partition = np.searchsorted(np.asarray(offsets), records, side="right") - 1
    result = np.empty((records.size, width), dtype=np.uint8)
    for p in np.unique(partition).tolist():
        mapped = np.load(partition_dir(staging, p) / _FINGERPRINTS, mmap_mode="r")
        mine = partition == p
        result[mine] = mapped[records[mine] - offsets[p]]
    return result


def _spanning_forest(
    left: NDArray[np.int64], right: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    if left.size == 0:
        return _no_edges()
    nodes, local = np.unique(np.concatenate([left, right]), return_inverse=True)
    forest = ClusterForest(nodes.size)
    forest.join(local[: left.size], local[left.size :])
    roots = forest.roots(np.arange(nodes.size, dtype=np.intp))
    attached = roots != np.arange(nodes.size)
    return nodes[attached], nodes[roots[attached]]


def _no_edges() -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    empty = np.zeros(0, dtype=np.int64)
    return empty, empty


def read_meta(staging: Path, partitions: int) -> PartitionMeta:
    """The per-record columns of every partition, in global order."""
    metas = [np.load(partition_dir(staging, p) / _META) for p in range(partitions)]
    if not metas:
        return PartitionMeta(
            np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.bool_), np.zeros(0, dtype=np.uint64)
        )
    return PartitionMeta(
        times=np.concatenate([m["times"] for m in metas]),
        has_text=np.concatenate([m["has_text"] for m in metas]),
        exact_hash=np.concatenate([m["exact_hash"] for m in metas]),
    )


def read_signatures(
    staging: Path, partitions: int, rows: NDArray[np.intp]
) -> tuple[NDArray[np.uint64], TextSignatures]:
    """The scopes and signatures of the given global rows, in that order."""
    metas = [np.load(partition_dir(staging, p) / _META) for p in range(partitions)]
    fingerprints = [
        np.load(partition_dir(staging, p) / _FINGERPRINTS, mmap_mode="r") for p in range(partitions)
    ]

    def column(name: str) -> Any:
        return np.concatenate([m[name] for m in metas])[rows]

    return column("scope"), TextSignatures(
        exact_hash=column("exact_hash"),
        has_text=column("has_text"),
        has_shingles=column("has_shingles"),
        band_keys=column("band_keys"),
        fingerprints=np.concatenate(fingerprints)[rows],
    )


def join_shards(
    meta: PartitionMeta,
    edges: list[tuple[NDArray[np.int64], NDArray[np.int64]]],
    settings: DedupSettings,
) -> list[DedupDecision]:
    """Union the edges of every shard and decide, per record, whether to keep it."""
    forest = ClusterForest(int(meta.times.size))
    for left, right in edges:
        forest.join(left.astype(np.intp), right.astype(np.intp))
    return decide_clusters(meta.has_text, meta.exact_hash, forest.parent, meta.times, settings)
