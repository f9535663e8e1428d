"""Exact and near-duplicate removal for feedback records.

The per-record step, :func:`sign_text` / :func:`sign_texts`, normalises a text
and returns its exact hash and MinHash LSH band keys; it depends on nothing
but the text and the settings. :func:`assign_clusters` signs a batch, joins
records of one scope that share an exact hash or a band key (and are similar
enough) with union-find, and keeps the earliest records of each cluster.
The scoping rules (business lines, signals, preference pairs) are described
in :mod:`feedback.dedup.records`.
"""

from feedback.dedup.clusters import (
    ClusterForest,
    DecisionKind,
    DedupDecision,
    bucket_edges,
    cluster_signatures,
    decide_clusters,
)
from feedback.dedup.records import (
    DEFAULT_BUSINESS_LINE,
    DedupBatch,
    DedupInputError,
    ScopeTable,
    assign_clusters,
    record_scope,
    record_text,
    record_time,
)
from feedback.dedup.signature import (
    TextSignature,
    TextSignatures,
    estimated_similarity,
    sign_text,
    sign_texts,
)
from feedback.dedup.text import message_forms, normalise_text

__all__ = [
    "DEFAULT_BUSINESS_LINE",
    "ClusterForest",
    "DecisionKind",
    "DedupBatch",
    "DedupDecision",
    "DedupInputError",
    "ScopeTable",
    "TextSignature",
    "TextSignatures",
    "assign_clusters",
    "bucket_edges",
    "cluster_signatures",
    "decide_clusters",
    "estimated_similarity",
    "message_forms",
    "normalise_text",
    "record_scope",
    "record_text",
    "record_time",
    "sign_text",
    "sign_texts",
]
