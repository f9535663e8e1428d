"""Dedup across windows: what earlier nights trained on, and the verdict on a new window.

Each night's dataset is built from one window of the store, but a window also
pulls back older interactions that got feedback late (a task outcome days
after the answer). Without a memory of earlier nights, such an interaction
would be trained on again, and a template flood spread over many nights would
get ``max_kept_per_cluster`` records into every night's dataset.

The memory is a per-line index of the records that went into a consumed
window's dataset: request id, signal, scope, exact hash, LSH band keys and
fingerprint (never the text). A new window's records are judged against it in
two steps, the same in the one-process and the partitioned path:

1. :func:`trained_reason`: a record whose interaction (request id), or whose
   exact text in the same scope, was already trained on is dropped as
   ``trained_in_earlier_window``. One exception: a record that now carries an
   edit, when the interaction was trained without one, is kept; the edit is
   new text a user wrote, not the same example again.
2. The remaining records are clustered together with the index's signatures,
   the index's records placed before every new record
   (:data:`HISTORY_TIME`), so they hold the first places of their clusters:
   ``max_kept_per_cluster`` then caps a cluster over every night in the
   horizon, not per night. A new record dropped from a cluster whose first
   record is an earlier night's is counted as ``earlier_window_cluster_cap``
   (:func:`window_verdicts`).

Scopes still apply across nights: a negative is never dropped for being the
twin of an earlier positive.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from feedback.dedup.clusters import DedupDecision, cluster_signatures
from feedback.dedup.records import record_text, record_time, scope_hash
from feedback.dedup.signature import TextSignatures, sign_texts
from flywheel.settings.cleaning import DedupSettings

TRAINED_EARLIER = "trained_in_earlier_window"
EARLIER_CLUSTER = "earlier_window_cluster_cap"
EDIT_SIGNAL = "edit"
# Earlier nights' records sort before any new record, whatever their creation times.
HISTORY_TIME = -np.inf
_SIGNATURE_SETTINGS = (
    "num_perm",
    "bands",
    "rows",
    "shingle_sizes",
    "mask_digits",
    "near_duplicates",
    "seed",
    "business_line_field",
    "signal_fields",
)


def signature_key(settings: DedupSettings) -> str:
    """A short digest of the settings a stored signature depends on.

    Signatures stored under another key cannot be compared (other hash
    functions or bands); only their request ids still count.
    """
    values = {name: getattr(settings, name) for name in _SIGNATURE_SETTINGS}
    return hashlib.sha256(orjson.dumps(values, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class SignedRecords:
    """Records reduced to what dedup across windows needs, one row per record."""

    request_ids: tuple[str, ...]
    signals: tuple[str, ...]
    scopes: NDArray[np.uint64]
    times: NDArray[np.float64]
    signatures: TextSignatures

    def __len__(self) -> int:
        return len(self.request_ids)

    def take(self, rows: Sequence[int] | NDArray[np.intp]) -> SignedRecords:
        """The given rows, in the given order."""
        index = np.asarray(rows, dtype=np.intp)
        s = self.signatures
        return SignedRecords(
            request_ids=tuple(self.request_ids[i] for i in index.tolist()),
            signals=tuple(self.signals[i] for i in index.tolist()),
            scopes=self.scopes[index],
            times=self.times[index],
            signatures=TextSignatures(
                exact_hash=s.exact_hash[index],
                has_text=s.has_text[index],
                has_shingles=s.has_shingles[index],
                band_keys=s.band_keys[index],
                fingerprints=s.fingerprints[index],
            ),
        )

    @classmethod
    def empty(cls, settings: DedupSettings) -> SignedRecords:
        """No records."""
        return cls(
            (), (), np.zeros(0, np.uint64), np.zeros(0, np.float64), sign_texts([], settings)
        )

    @classmethod
    def concatenate(cls, parts: Sequence[SignedRecords], settings: DedupSettings) -> SignedRecords:
        """Join parts signed with the same settings, in order."""
        if not parts:
            return cls.empty(settings)
        return cls(
            request_ids=tuple(r for part in parts for r in part.request_ids),
            signals=tuple(s for part in parts for s in part.signals),
            scopes=np.concatenate([part.scopes for part in parts]),
            times=np.concatenate([part.times for part in parts]),
            signatures=TextSignatures.concatenate([part.signatures for part in parts], settings),
        )


def sign_records(
    records: Sequence[Mapping[str, Any]],
    *,
    field: str,
    settings: DedupSettings,
    request_id_field: str = "request_id",
    signal_field: str = "signal",
) -> SignedRecords:
    """Sign ``field`` of each record and keep its request id, signal, scope and time."""
    return SignedRecords(
        request_ids=tuple(str(r[request_id_field]) for r in records),
        signals=tuple(str(r.get(signal_field)) for r in records),
        scopes=np.array([scope_hash(r, settings) for r in records], dtype=np.uint64),
        times=np.array(
            [record_time(r, settings.created_at_field) for r in records], dtype=np.float64
        ),
        signatures=sign_texts([record_text(r, field) for r in records], settings),
    )


@dataclass(frozen=True, slots=True)
class TrainingHistory:
    """What a line's earlier nights trained on, inside the horizon.

    ``signals`` maps every trained request id to the signal it was trained
    with (an edit wins over any other); ``signed`` holds the records whose
    signatures can be compared with tonight's (same :func:`signature_key`).
    """

    signals: Mapping[str, str]
    signed: SignedRecords

    @classmethod
    def empty(cls, settings: DedupSettings) -> TrainingHistory:
        """No earlier night."""
        return cls({}, SignedRecords.empty(settings))

    def keys(self) -> TrainedKeys:
        """The small part of the history that the per-record check needs."""
        s = self.signed.signatures
        with_text = np.flatnonzero(s.has_text)
        exact = frozenset(
            zip(
                self.signed.scopes[with_text].tolist(),
                s.exact_hash[with_text].tolist(),
                strict=True,
            )
        )
        return TrainedKeys(dict(self.signals), exact)


@dataclass(frozen=True, slots=True)
class TrainedKeys:
    """Trained request ids with their signal, and trained ``(scope, exact hash)`` pairs."""

    signals: Mapping[str, str]
    exact: frozenset[tuple[int, int]]


def trained_reason(
    request_id: str, signal: str, scope: int, exact_hash: int | None, keys: TrainedKeys
) -> str | None:
    """Why a record was already trained on in an earlier window, or ``None`` (pure).

    ``exact_hash`` is ``None`` for a record without text.
    """
    earlier = keys.signals.get(request_id)
    if earlier is not None and not (signal == EDIT_SIGNAL and earlier != EDIT_SIGNAL):
        return TRAINED_EARLIER
    if exact_hash is not None and (scope, exact_hash) in keys.exact:
        return TRAINED_EARLIER
    return None


def drop_trained(signed: SignedRecords, keys: TrainedKeys) -> tuple[NDArray[np.intp], Counter[str]]:
    """The rows not trained on in an earlier window, and the dropped ones by reason (pure)."""
    kept: list[int] = []
    dropped: Counter[str] = Counter()
    s = signed.signatures
    for row, (request_id, signal, scope, exact, has_text) in enumerate(
        zip(
            signed.request_ids,
            signed.signals,
            signed.scopes.tolist(),
            s.exact_hash.tolist(),
            s.has_text.tolist(),
            strict=True,
        )
    ):
        reason = trained_reason(request_id, signal, scope, exact if has_text else None, keys)
        if reason is None:
            kept.append(row)
        else:
            dropped[reason] += 1
    return np.array(kept, dtype=np.intp), dropped


def window_verdicts(
    decisions: Sequence[DedupDecision], new_count: int
) -> tuple[list[bool], Counter[str]]:
    """Keep flags of the new records and drop reasons, from decisions over the new
    records followed by the history's (pure).

    A new record dropped from a cluster led by an earlier night's record is
    counted as ``earlier_window_cluster_cap``; other drops by their dedup kind.
    """
    keep: list[bool] = []
    dropped: Counter[str] = Counter()
    for decision in decisions[:new_count]:
        keep.append(decision.keep)
        if decision.keep:
            continue
        if decision.cluster >= new_count:
            dropped[EARLIER_CLUSTER] += 1
        else:
            dropped[decision.kind.value.removesuffix("_of")] += 1
    return keep, dropped


def history_times(count: int) -> NDArray[np.float64]:
    """Times that put ``count`` earlier-night records before every new record."""
    return np.full(count, HISTORY_TIME, dtype=np.float64)


def cluster_with_history(
    new: SignedRecords, history: SignedRecords, settings: DedupSettings
) -> list[DedupDecision]:
    """Cluster the new records together with the history's, the history's first.

    Decisions come for the new records, then the history's, in that order.
    """
    joined = SignedRecords.concatenate([new, history], settings)
    times = np.concatenate([new.times, history_times(len(history))])
    _, scopes = np.unique(joined.scopes, return_inverse=True)
    return cluster_signatures(joined.signatures, scopes.astype(np.int64), times, settings)
