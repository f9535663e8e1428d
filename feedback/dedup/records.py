"""From feedback records to dedup decisions: text, time and scope of each record.

The scope of a record is its business line plus the values of its signal
fields (``signal``, ``role``, ``label`` by default). Records are compared only
inside one scope, so:

* dedup never crosses business lines (a record without one is in ``"default"``);
* a negative survives as a negative: a ``thumbs_down`` record is deduplicated
  only against other ``thumbs_down`` records, a ``rejected`` answer only against
  ``rejected`` answers, never collapsed into a positive twin; no signal is
  preferred, and the earliest record of a cluster is kept whatever its signal;
* the two answers of one preference pair (same ``pair_id``, roles ``chosen`` and
  ``rejected``) are in different scopes and are never merged. Should two
  records of one pair share a scope anyway (no role, or the same one), the
  later one is moved to a scope of its own kind (second members of pairs), so
  the guarantee holds whatever the caller sends.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
import xxhash

from feedback.dedup.clusters import DedupDecision, cluster_signatures
from feedback.dedup.signature import TextSignatures, sign_texts
from flywheel.settings.cleaning import DedupSettings

DEFAULT_BUSINESS_LINE = "default"
_SLICE_RECORDS = 4096


class DedupInputError(ValueError):
    """A record cannot be deduplicated as it is; the message says which field and why."""


def record_text(record: Mapping[str, Any], field: str) -> str | None:
    """The text to compare, or ``None`` when the field is missing or null."""
    value = record.get(field)
    if value is None or isinstance(value, str):
        return value
    raise DedupInputError(f"field {field!r} is {_json_type(value)}, expected a string")


def record_time(record: Mapping[str, Any], field: str) -> float:
    """The record's creation time as a sortable number; ``inf`` when it has none.

    ISO-8601 strings become POSIX seconds (a time without a zone counts as
    UTC); numbers are taken as they are, so they should be POSIX seconds too
    when a batch mixes both.
    """
    value = record.get(field)
    if value is None:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise DedupInputError(
            f"field {field!r} is {_json_type(value)}, expected an ISO-8601 time or a number"
        )
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise DedupInputError(f"field {field!r} is {value!r}, not an ISO-8601 time") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    if not math.isfinite(value):
        raise DedupInputError(f"field {field!r} is {value}, expected a finite number")
    return float(value)


def record_scope(record: Mapping[str, Any], settings: DedupSettings) -> tuple[Any, ...]:
    """The scope key of a record: its business line and the values of its signal fields.

    Records are compared only with records of the same scope key; a partitioned
    run shuffles by ``(scope key, band index, band key)``.
    """
    business_line = record.get(settings.business_line_field)
    if business_line is None or business_line == "":
        business_line = DEFAULT_BUSINESS_LINE
    return (
        _scope_value(business_line),
        *(_scope_value(record.get(name)) for name in settings.signal_fields),
    )


def scope_hash(record: Mapping[str, Any], settings: DedupSettings) -> int:
    """A stable 64-bit id of a record's scope, the same in every process and on every night."""
    return xxhash.xxh3_64_intdigest(orjson.dumps(record_scope(record, settings)))


class ScopeTable:
    """Numbers the scopes of records as they arrive (see the module docstring)."""

    def __init__(self, settings: DedupSettings) -> None:
        self._settings = settings
        self._ids: dict[tuple[Any, ...], int] = {}
        self._pair_members: dict[tuple[Any, ...], int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def scope_of(self, record: Mapping[str, Any]) -> int:
        """The scope id of a record; records of one pair never share one."""
        base = record_scope(record, self._settings)
        slot = 0
        pair_id = record.get(self._settings.pair_id_field)
        if pair_id is not None:
            pair_key = (_scope_value(pair_id), base)
            slot = self._pair_members.get(pair_key, 0)
            self._pair_members[pair_key] = slot + 1
        return self._ids.setdefault((base, slot), len(self._ids))


class DedupBatch:
    """Records added one by one, of which only signatures, scopes and times are kept.

    The payload of a record is not held: callers that stream a file add each
    record and later stream the file again to write the decisions.
    """

    def __init__(self, *, field: str, settings: DedupSettings) -> None:
        self.field = field
        self.settings = settings
        self._scopes = ScopeTable(settings)
        self._scope_ids = array("q")
        self._times = array("d")
        self._pending: list[str | None] = []
        self._signed: list[TextSignatures] = []

    def __len__(self) -> int:
        return len(self._scope_ids)

    def add(self, record: Mapping[str, Any]) -> None:
        """Add one record; on :class:`DedupInputError` the batch is left unchanged."""
        text = record_text(record, self.field)
        created = record_time(record, self.settings.created_at_field)
        self._scope_ids.append(self._scopes.scope_of(record))
        self._times.append(created)
        self._pending.append(text)
        if len(self._pending) >= _SLICE_RECORDS:
            self._sign_pending()

    def decide(self) -> list[DedupDecision]:
        """Cluster every record added so far; one decision per record, in order."""
        self._sign_pending()
        signatures = TextSignatures.concatenate(self._signed, self.settings)
        self._signed = [signatures]
        return cluster_signatures(
            signatures,
            np.array(self._scope_ids, dtype=np.int64),
            np.array(self._times, dtype=np.float64),
            self.settings,
        )

    def _sign_pending(self) -> None:
        if self._pending:
            self._signed.append(sign_texts(self._pending, self.settings))
            self._pending = []


def assign_clusters(
    records: Sequence[Mapping[str, Any]], *, field: str, settings: DedupSettings
) -> list[DedupDecision]:
    """Decide for each record whether it is kept, and which cluster it belongs to.

    Exact duplicates (same normalised ``field``) and near duplicates (MinHash
    LSH) are clustered inside each scope; the ``max_kept_per_cluster`` earliest
    records of a cluster are kept. Raises :class:`DedupInputError` naming the
    first record that cannot be read.
    """
    batch = DedupBatch(field=field, settings=settings)
    for index, record in enumerate(records):
        try:
            batch.add(record)
        except DedupInputError as exc:
            raise DedupInputError(f"record {index}: {exc}") from exc
    return batch.decide()


def _scope_value(value: Any) -> tuple[str, Any]:
    # Typed, so that label true, label 1 and label "true" stay three scopes.
    if value is None:
        return ("missing", None)
    if isinstance(value, str | bool | int | float):
        return (type(value).__name__, value)
    return ("json", orjson.dumps(value, option=orjson.OPT_SORT_KEYS))


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names.update({dict: "an object", list: "an array"})
    return names.get(type(value), type(value).__name__)
