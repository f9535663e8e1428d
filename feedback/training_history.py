"""The training history in the store: what a line's earlier nights trained on.

Why a table in the store rather than a file beside the datasets: the nightly
run of a line may run on any worker, and its window and lease already live in
the store (``feedback.watermarks``), so the history is read and replaced in
the same database, in one transaction, whichever process runs the line.

Only consumed windows count. A run records its window's rows under the
window's end (``window_until``); later runs read rows whose window ended at or
before their own start (the watermark), so the rows of a window that was
released (too few examples) or is being rerun after a crash never count; the
next run of the line replaces them. Rows older than the horizon are pruned.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
from sqlalchemy import Engine, delete, insert, select

from feedback.dedup.history import (
    EDIT_SIGNAL,
    SignedRecords,
    TrainingHistory,
    signature_key,
)
from feedback.dedup.signature import TextSignatures
from feedback.schema import trained_records_table
from flywheel.settings.cleaning import DedupSettings


def load_training_history(
    engine: Engine,
    business_line: str,
    *,
    before: datetime | None,
    horizon_days: float,
    settings: DedupSettings,
) -> TrainingHistory:
    """The line's records trained in windows that ended by ``before`` (the window's
    start), within ``horizon_days`` of it; empty for a line's first window."""
    if before is None or horizon_days <= 0:
        return TrainingHistory.empty(settings)
    t = trained_records_table.c
    with engine.connect() as connection:
        rows = connection.execute(
            select(trained_records_table)
            .where(
                t.business_line == business_line,
                t.window_until <= before,
                t.window_until > before - timedelta(days=horizon_days),
            )
            .order_by(t.window_until, t.id)
        ).all()
    signals: dict[str, str] = {}
    key = signature_key(settings)
    comparable = [row for row in rows if row.signature_key == key]
    for row in rows:
        if row.signal == EDIT_SIGNAL or row.request_id not in signals:
            signals[row.request_id] = row.signal
    if not comparable:
        return TrainingHistory(signals, SignedRecords.empty(settings))
    band_width = settings.bands * 8
    no_bands = bytes(band_width)
    signed = SignedRecords(
        request_ids=tuple(row.request_id for row in comparable),
        signals=tuple(row.signal for row in comparable),
        scopes=np.array([row.scope_hash for row in comparable], dtype=np.int64).view(np.uint64),
        times=np.array([row.created_at.timestamp() for row in comparable], dtype=np.float64),
        signatures=TextSignatures(
            exact_hash=np.array([row.exact_hash or 0 for row in comparable], dtype=np.int64).view(
                np.uint64
            ),
            has_text=np.array([row.exact_hash is not None for row in comparable], dtype=np.bool_),
            has_shingles=np.array(
                [row.band_keys is not None for row in comparable], dtype=np.bool_
            ),
            band_keys=np.frombuffer(
                b"".join(row.band_keys or no_bands for row in comparable), dtype=np.uint64
            ).reshape(len(comparable), settings.bands),
            fingerprints=np.frombuffer(
                b"".join(row.fingerprint for row in comparable), dtype=np.uint8
            ).reshape(len(comparable), settings.num_perm),
        ),
    )
    return TrainingHistory(signals, signed)


def record_training(
    engine: Engine,
    business_line: str,
    *,
    since: datetime | None,
    until: datetime,
    trained: SignedRecords | None,
    settings: DedupSettings,
    horizon_days: float,
) -> int:
    """Replace the line's rows of unconsumed windows (after ``since``) by the records this
    window ``[since, until)`` trained on, and prune rows past the horizon; returns how many
    rows were written (one transaction)."""
    t = trained_records_table.c
    rows = _rows(business_line, until, trained, settings) if trained is not None else []
    with engine.begin() as connection:
        unconsumed = t.business_line == business_line
        if since is not None:
            unconsumed = unconsumed & (t.window_until > since)
        connection.execute(delete(trained_records_table).where(unconsumed))
        connection.execute(
            delete(trained_records_table).where(
                t.business_line == business_line,
                t.window_until <= until - timedelta(days=horizon_days),
            )
        )
        if rows:
            connection.execute(insert(trained_records_table), rows)
    return len(rows)


def _rows(
    business_line: str, until: datetime, trained: SignedRecords, settings: DedupSettings
) -> list[dict[str, object]]:
    s = trained.signatures
    key = signature_key(settings)
    scopes = trained.scopes.view(np.int64).tolist()
    exact = s.exact_hash.view(np.int64).tolist()
    return [
        {
            "business_line": business_line,
            "window_until": until,
            "request_id": trained.request_ids[row],
            "signal": trained.signals[row][:16],
            "signature_key": key,
            "scope_hash": scopes[row],
            "exact_hash": exact[row] if s.has_text[row] else None,
            "band_keys": s.band_keys[row].tobytes() if s.has_shingles[row] else None,
            "fingerprint": s.fingerprints[row].tobytes(),
            "created_at": _moment(float(trained.times[row])),
        }
        for row in range(len(trained))
    ]


def _moment(seconds: float) -> datetime:
    # A record without a creation time sorts last (inf); store the epoch's far end instead.
    if not np.isfinite(seconds):
        return datetime.max.replace(tzinfo=UTC) - timedelta(days=1)
    return datetime.fromtimestamp(seconds, UTC)
