"""Clustering of signed records and the keep/drop decision for each.

Clusters are the connected components of a graph over the records of a
batch. Records are put in buckets by ``(scope, key)``, once with the exact
hash as key and once per LSH band with that band's key; every record is
joined to the first record of each of its buckets, unconditionally for the
exact hash and, for a band key, when their estimated similarity reaches the
threshold. Buckets never mix scopes, so a distributed run can shuffle records
by ``(scope, band, key)``, emit edges bucket by bucket, and join all edges
with the same union-find; nothing here needs a global in-memory index.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from feedback.dedup.signature import TextSignatures, estimated_similarity, mix_hash
from flywheel.settings.cleaning import DedupSettings

Indices = NDArray[np.intp]


class DecisionKind(StrEnum):
    """Why a record was kept or dropped."""

    UNIQUE = "unique"
    """Kept: the only record of its cluster."""
    FIRST_OF_CLUSTER = "first_of_cluster"
    """Kept: the earliest record of a cluster of two or more."""
    WITHIN_FLOOD_CAP = "within_flood_cap"
    """Kept: a later record of a cluster that has not reached its cap yet."""
    NO_TEXT = "no_text"
    """Kept: the record has no text to compare (field missing or null)."""
    EXACT_DUPLICATE = "exact_duplicate_of"
    """Dropped: same normalised text as a kept record (``ref``)."""
    NEAR_DUPLICATE = "near_duplicate_of"
    """Dropped: near duplicate of the cluster's first record (``ref``)."""
    FLOOD_CAP = "flood_cap"
    """Dropped: its cluster already keeps ``max_kept_per_cluster`` records."""


@dataclass(frozen=True, slots=True)
class DedupDecision:
    """The verdict on one record.

    ``cluster`` is the batch index of the cluster's first record (the earliest,
    ties broken by input order), so a record alone in its cluster has its own
    index. ``ref`` names the record this one duplicates, or the first record of
    its cluster for ``within_flood_cap`` and ``flood_cap``.
    """

    cluster: int
    keep: bool
    kind: DecisionKind
    ref: int | None = None

    @property
    def reason(self) -> str:
        """``kind`` or ``kind:ref``, e.g. ``"near_duplicate_of:12"``."""
        return self.kind.value if self.ref is None else f"{self.kind.value}:{self.ref}"


def bucket_edges(
    scopes: NDArray[np.int64], keys: NDArray[np.uint64], members: Indices
) -> tuple[Indices, Indices]:
    """Edges joining each member of a ``(scope, key)`` bucket to the bucket's first member.

    ``members`` are the record indices taking part, in increasing order; the
    result is two aligned arrays ``(record, first record of its bucket)``.
    """
    if members.size < 2:
        empty = np.zeros(0, dtype=np.intp)
        return empty, empty
    member_scopes = scopes[members]
    member_keys = keys[members]
    # One sort on a mixed 64-bit key; buckets are then cut where scope or key
    # changes, so a collision of mixed keys can only split a bucket, never
    # join two scopes.
    mixed = member_keys ^ mix_hash(member_scopes.astype(np.uint64))
    order = np.argsort(mixed, kind="stable")
    sorted_scopes = member_scopes[order]
    sorted_keys = member_keys[order]
    new_bucket = np.ones(order.size, dtype=np.bool_)
    new_bucket[1:] = (sorted_scopes[1:] != sorted_scopes[:-1]) | (
        sorted_keys[1:] != sorted_keys[:-1]
    )
    records = members[order]
    bucket_first = records[np.flatnonzero(new_bucket)[np.cumsum(new_bucket) - 1]]
    joined = ~new_bucket
    return records[joined], bucket_first[joined]


class ClusterForest:
    """Union-find over record indices, joined a batch of edges at a time.

    Every record's parent is kept pointing straight at its root, and a root is
    always the smallest index of its component, so the result does not depend
    on the order edges arrive in.
    """

    def __init__(self, count: int) -> None:
        self.parent: Indices = np.arange(count, dtype=np.intp)

    def roots(self, records: Indices) -> Indices:
        """The root of each record."""
        return self.parent[records]

    def join(self, left: Indices, right: Indices) -> None:
        """Merge the components of each pair ``(left[i], right[i])``."""
        while left.size:
            left_roots = self.parent[left]
            right_roots = self.parent[right]
            apart = left_roots != right_roots
            if not apart.any():
                return
            left, right = left[apart], right[apart]
            low = np.minimum(left_roots[apart], right_roots[apart])
            high = np.maximum(left_roots[apart], right_roots[apart])
            # Hooking a root onto a smaller index never makes a cycle.
            np.minimum.at(self.parent, high, low)
            self._compress()

    def _compress(self) -> None:
        while True:
            grandparent = self.parent[self.parent]
            if np.array_equal(grandparent, self.parent):
                return
            self.parent = grandparent


def cluster_signatures(
    signatures: TextSignatures,
    scopes: NDArray[np.int64],
    times: NDArray[np.float64],
    settings: DedupSettings,
) -> list[DedupDecision]:
    """Cluster a signed batch and decide, for every record, whether to keep it.

    ``scopes`` gives each record's scope id (records of different scopes are
    never joined) and ``times`` its creation time as a number (earlier kept
    first; ties go to input order).
    """
    count = len(signatures)
    forest = ClusterForest(count)
    for left, right in _edges(signatures, scopes, forest, settings):
        forest.join(left, right)
    return decide_clusters(
        signatures.has_text, signatures.exact_hash, forest.parent, times, settings
    )


def _edges(
    signatures: TextSignatures,
    scopes: NDArray[np.int64],
    forest: ClusterForest,
    settings: DedupSettings,
) -> Iterator[tuple[Indices, Indices]]:
    with_text = np.flatnonzero(signatures.has_text)
    yield bucket_edges(scopes, signatures.exact_hash, with_text)
    if not settings.near_duplicates:
        return
    with_shingles = np.flatnonzero(signatures.has_shingles)
    for band in range(settings.bands):
        left, right = bucket_edges(scopes, signatures.band_keys[:, band], with_shingles)
        # Pairs already joined need no similarity check; this keeps the work
        # near-linear even for floods, whose members share most bands.
        apart = forest.roots(left) != forest.roots(right)
        left, right = left[apart], right[apart]
        similar = (
            estimated_similarity(signatures.fingerprints[left], signatures.fingerprints[right])
            >= settings.threshold
        )
        yield left[similar], right[similar]


def decide_clusters(
    has_text: NDArray[np.bool_],
    exact_hash: NDArray[np.uint64],
    roots: Indices,
    times: NDArray[np.float64],
    settings: DedupSettings,
) -> list[DedupDecision]:
    """Keep the ``max_kept_per_cluster`` earliest records of each cluster; say why for each.

    ``roots`` gives each record's cluster (any id shared by its members).
    """
    count = int(has_text.size)
    index = np.arange(count, dtype=np.intp)
    order = np.lexsort((index, times, roots))
    sorted_roots = roots[order]
    starts_cluster = np.ones(count, dtype=np.bool_)
    starts_cluster[1:] = sorted_roots[1:] != sorted_roots[:-1]
    cluster_start = np.flatnonzero(starts_cluster)
    position_of_start = cluster_start[np.cumsum(starts_cluster) - 1]
    rank = np.empty(count, dtype=np.intp)
    rank[order] = np.arange(count) - position_of_start
    first = np.empty(count, dtype=np.intp)
    first[order] = order[position_of_start]
    size = np.empty(count, dtype=np.intp)
    size[order] = np.diff(np.append(cluster_start, count))[np.cumsum(starts_cluster) - 1]
    keep = rank < settings.max_kept_per_cluster

    # The earliest record with the same exact hash inside each cluster.
    exact_order = np.lexsort((index, times, exact_hash, roots))
    exact_roots = roots[exact_order]
    exact_hashes = exact_hash[exact_order]
    starts_twins = np.ones(count, dtype=np.bool_)
    starts_twins[1:] = (exact_roots[1:] != exact_roots[:-1]) | (
        exact_hashes[1:] != exact_hashes[:-1]
    )
    earliest_twin = np.empty(count, dtype=np.intp)
    earliest_twin[exact_order] = exact_order[
        np.flatnonzero(starts_twins)[np.cumsum(starts_twins) - 1]
    ]

    kept = keep.tolist()
    capped = settings.max_kept_per_cluster > 1
    decisions: list[DedupDecision] = []
    for record, record_has_text, record_rank, record_first, record_size, twin in zip(
        range(count),
        has_text.tolist(),
        rank.tolist(),
        first.tolist(),
        size.tolist(),
        earliest_twin.tolist(),
        strict=True,
    ):
        if not record_has_text:
            decisions.append(DedupDecision(record, True, DecisionKind.NO_TEXT))
        elif record_size == 1:
            decisions.append(DedupDecision(record, True, DecisionKind.UNIQUE))
        elif record_rank == 0:
            decisions.append(DedupDecision(record, True, DecisionKind.FIRST_OF_CLUSTER))
        elif record_rank < settings.max_kept_per_cluster:
            decisions.append(
                DedupDecision(record_first, True, DecisionKind.WITHIN_FLOOD_CAP, record_first)
            )
        elif twin != record and kept[twin]:
            decisions.append(DedupDecision(record_first, False, DecisionKind.EXACT_DUPLICATE, twin))
        elif capped:
            decisions.append(
                DedupDecision(record_first, False, DecisionKind.FLOOD_CAP, record_first)
            )
        else:
            decisions.append(
                DedupDecision(record_first, False, DecisionKind.NEAR_DUPLICATE, record_first)
            )
    return decisions
