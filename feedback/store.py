"""The feedback store: engine set-up, migrations, batched idempotent ingest, counts.

The same code runs on PostgreSQL (production) and SQLite (embedded default).
Ingest validates a batch, looks up the interactions its feedback refers to,
then writes good records and quarantined ones in one transaction per batch:
a batch is stored whole or not at all, and replays store nothing twice.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from psycopg import sql
from sqlalchemy import (
    JSON,
    Connection,
    Engine,
    Table,
    create_engine,
    delete,
    event,
    func,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url

from feedback.events import (
    SIGNAL_TYPES,
    FeedbackEventIn,
    InteractionEvent,
    InvalidEventError,
    record_key_of,
    stored_identity,
    validate_event,
)
from feedback.examples import user_digest
from feedback.jsonl import JsonlRecord, MalformedLine
from feedback.schema import (
    feedback_table,
    forgotten_users_table,
    interactions_table,
    quarantine_table,
    require_declared,
    rollup_watermarks_table,
    rows_about_requests,
    shadow_outputs_table,
    signal_rollup_table,
    trained_records_table,
)
from flywheel.database import recounted_after_erasure
from flywheel.file_modes import open_private, private_dir, private_home, restrict
from flywheel.settings import Settings, StoreSettings
from flywheel.user_files import KEPT_BYTES

IngestItem = JsonlRecord | MalformedLine | dict[str, Any]
# Below this many rows a plain multi-row INSERT beats setting up a COPY.
COPY_THRESHOLD = 64
MIGRATIONS = "feedback:migrations"


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def private_sqlite_file(database: Path) -> None:
    """Create a SQLite database file 0600 in a 0700 folder before SQLite opens it (an
    existing one is made 0600): SQLite creates the ``-wal`` and ``-shm`` files with the
    database file's mode, umask or not, so the raw text in the WAL stays the owner's too."""
    private_dir(database.parent)
    os.close(open_private(database, os.O_RDWR | os.O_CREAT))
    for companion in ("-wal", "-shm", "-journal"):
        restrict(database.with_name(database.name + companion))


def create_store_engine(url: str, *, connect_timeout_s: int = 10) -> Engine:
    """An engine for the store URL, tuned per backend (SQLite: WAL, foreign keys on;
    PostgreSQL: a server that does not accept a connection within ``connect_timeout_s`` is
    an error, unless the URL sets its own ``connect_timeout``, instead of the minutes of the
    system's TCP retries)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            private_sqlite_file(Path(parsed.database))
        engine = create_engine(
            url,
            json_serializer=_json_dumps,
            json_deserializer=orjson.loads,
            connect_args={"check_same_thread": False, "timeout": 30},
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    libpq = parsed.get_driver_name() in {"psycopg", "psycopg2"}
    connect_args = (
        {"connect_timeout": connect_timeout_s}
        if libpq and "connect_timeout" not in parsed.query
        else {}
    )
    return create_engine(
        url,
        json_serializer=_json_dumps,
        json_deserializer=orjson.loads,
        pool_pre_ping=True,
        connect_args=connect_args,
    )


def _alembic_config(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", MIGRATIONS)
    config.attributes["connection"] = connection
    return config


@cache
def head_revision() -> str:
    """The newest migration revision shipped with this code."""
    config = Config()
    config.set_main_option("script_location", MIGRATIONS)
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (``None`` for an empty database)."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade_schema(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` (idempotent; serialised on PostgreSQL)."""
    with engine.begin() as connection:
        command.upgrade(_alembic_config(connection), revision)


def downgrade_schema(engine: Engine, revision: str) -> None:
    """Roll migrations back to ``revision`` (``base`` for an empty database)."""
    with engine.begin() as connection:
        command.downgrade(_alembic_config(connection), revision)


@dataclass(slots=True)
class Rejection:
    """A record refused by ingest, on its way to the quarantine table.

    ``raw`` may hold only the start of an over-long line: ``size`` is then the whole
    line's size and ``digest`` its SHA-256 (:class:`~feedback.jsonl.MalformedLine`).
    """

    reason: str
    raw: bytes
    line_number: int | None = None
    record_key: str | None = None
    field: str | None = None
    size: int | None = None
    digest: str | None = None

    def describe(self, source: str) -> str:
        """One line naming where the record came from, the field and the reason."""
        where = f"{source}:{self.line_number}" if self.line_number else source
        who = f" ({self.record_key})" if self.record_key else ""
        what = f" field '{self.field}':" if self.field else ""
        reason = self.reason if len(self.reason) <= 500 else self.reason[:500] + "..."
        return f"{where}{who}:{what} {reason}"


@dataclass(slots=True)
class IngestReport:
    """What one ingest did: counts, and the first few rejections in words."""

    source: str
    read: int = 0
    interactions_added: int = 0
    feedback_added: int = 0
    duplicates: int = 0
    quarantined: int = 0
    batches: int = 0
    # Records of users forgotten after the records were made (a late spool replay), dropped.
    forgotten: int = 0
    rejections: list[str] = field(default_factory=list)
    # Recent feedback whose interaction is not stored yet, handed back (``hold_orphans_since``).
    held: list[dict[str, Any]] = field(default_factory=list)
    # Edits that replaced an older edit of the same answer by the same user (one live edit).
    edits_replaced: int = 0

    MAX_MESSAGES = 20

    @property
    def added(self) -> int:
        """Records newly stored."""
        return self.interactions_added + self.feedback_added

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "source": self.source,
            "read": self.read,
            "interactions_added": self.interactions_added,
            "feedback_added": self.feedback_added,
            "duplicates": self.duplicates,
            "quarantined": self.quarantined,
            "forgotten": self.forgotten,
            "edits_replaced": self.edits_replaced,
            "batches": self.batches,
            "rejections": self.rejections,
        }


@dataclass(slots=True)
class BatchPlan:
    """One batch, validated: what to insert and what to quarantine."""

    interactions: list[InteractionEvent] = field(default_factory=list)
    feedback: list[tuple[FeedbackEventIn, IngestItem]] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)


def _raw_of(item: IngestItem) -> bytes:
    if isinstance(item, JsonlRecord | MalformedLine):
        return item.raw
    try:
        return orjson.dumps(item, default=str)
    except TypeError:
        return repr(item).encode("utf-8", "backslashreplace")


def plan_batch(items: Iterable[IngestItem], limits: StoreSettings) -> BatchPlan:
    """Validate a batch (pure, no I/O).

    Feedback keeps its input item in case its interaction turns out to be missing.
    """
    plan = BatchPlan()
    for item in items:
        line = item.line_number if isinstance(item, JsonlRecord | MalformedLine) else None
        if isinstance(item, MalformedLine):
            plan.rejected.append(
                Rejection(item.reason, item.raw, line, size=item.size, digest=item.digest)
            )
            continue
        data = item.data if isinstance(item, JsonlRecord) else item
        try:
            parsed = validate_event(
                data, max_text_chars=limits.max_text_chars, max_messages=limits.max_messages
            )
        except InvalidEventError as exc:
            plan.rejected.append(
                Rejection(exc.reason, _raw_of(item), line, exc.record_key, exc.field)
            )
            continue
        if isinstance(parsed, InteractionEvent):
            plan.interactions.append(parsed)
        else:
            plan.feedback.append((parsed, item))
    return plan


def without_forgotten(plan: BatchPlan, forgotten: dict[str, datetime]) -> tuple[BatchPlan, int]:
    """The plan less the records of forgotten users made before they were forgotten (pure),
    and how many went. ``forgotten`` maps a stored user id to when it was forgotten; a
    record made afterwards is new data of a returning user and stays."""

    def erased(user_id: str | None, created_at: datetime) -> bool:
        return user_id in forgotten and created_at <= forgotten[user_id]

    gone = {i.request_id for i in plan.interactions if erased(i.user_id, i.created_at)}
    interactions = [i for i in plan.interactions if i.request_id not in gone]
    feedback = [
        (event, item)
        for event, item in plan.feedback
        if event.request_id not in gone and not erased(event.user_id, event.created_at)
    ]
    dropped = len(plan.interactions) - len(interactions) + len(plan.feedback) - len(feedback)
    return BatchPlan(interactions, feedback, plan.rejected), dropped


def user_id_forms(user_id: str) -> tuple[str, ...]:
    """The forms a user id may be stored under: as given (imports, quarantined records)
    and as the gateway keeps it (hashed when it is no identifier); one when they agree."""
    stored = stored_identity(user_id)
    return (user_id,) if stored in (None, user_id) else (user_id, stored)


def user_key(stored_id: str) -> str:
    """The digest a forgotten user is recorded under (the one dataset manifests use)."""
    digest = user_digest(stored_id)
    assert digest is not None
    return digest


@dataclass(slots=True)
class UserErasure:
    """What forgetting a user deleted, per form of the id and per table."""

    user_key: str
    forgotten_at: datetime
    deleted: dict[str, dict[str, int]] = field(default_factory=dict)

    def total(self, table: str) -> int:
        """Rows deleted from ``table`` under every form."""
        return sum(counts.get(table, 0) for counts in self.deleted.values())

    def matched(self) -> list[str]:
        """The forms under which anything was found."""
        return [form for form, counts in self.deleted.items() if any(counts.values())]


def _missing_interaction(event: FeedbackEventIn, item: IngestItem) -> Rejection:
    data = item.data if isinstance(item, JsonlRecord) else item
    line = item.line_number if isinstance(item, JsonlRecord) else None
    return Rejection(
        f"interaction {event.request_id!r} does not exist",
        _raw_of(item),
        line,
        record_key_of(data),
        "request_id",
    )


def interaction_row(event: InteractionEvent) -> dict[str, Any]:
    """The table row for an interaction."""
    return {
        "request_id": event.request_id,
        "session_id": event.session_id,
        "user_id": event.user_id,
        "key_name": event.key_name,
        "business_line": event.business_line,
        "adapter_name": event.adapter_name,
        "adapter_version": event.adapter_version,
        "base_model": event.base_model,
        "arm": event.arm.value if event.arm else None,
        "messages": event.messages,
        "response": event.response,
        "prompt_hash": event.prompt_hash,
        "latency_ms": event.latency_ms,
        "ttft_ms": event.ttft_ms,
        "status": event.status.value,
        "source": event.source,
        "metadata": event.metadata,
        "created_at": event.created_at,
    }


def feedback_row(event: FeedbackEventIn, business_line: str) -> dict[str, Any]:
    """The table row for a feedback event, with its interaction's business line."""
    return {
        "idempotency_key": event.key(),
        "request_id": event.request_id,
        "type": event.type.value,
        "business_line": business_line,
        "user_id": event.user_id,
        "edited_text": event.edited_text,
        "outcome": event.outcome.value if event.outcome else None,
        "rank": event.rank,
        "replaced_by": event.replaced_by,
        "metadata": event.metadata,
        "created_at": event.created_at,
    }


EDIT = "edit"


def newest_edits(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest of the edit rows given for each (answer, user): a user has one live edit
    of an answer, the newer one replacing the older (pure). Ties keep the later row."""
    newest: dict[tuple[str, str | None], dict[str, Any]] = {}
    for row in rows:
        key = (row["request_id"], row["user_id"])
        held = newest.get(key)
        if held is None or row["created_at"] >= held["created_at"]:
            newest[key] = row
    return list(newest.values())


@dataclass(frozen=True, slots=True)
class ShadowWrite:
    """What storing a batch of shadow answers did."""

    added: int = 0
    duplicates: int = 0
    missing: int = 0  # their interaction is not stored (dropped)
    invalid: int = 0  # not a shadow answer record (dropped)


SHADOW_STATUSES = frozenset({"ok", "error"})


def shadow_output_row(record: dict[str, Any], limits: StoreSettings) -> dict[str, Any]:
    """The table row of a shadow answer record (``gateway.shadow.shadow_output_event``);
    ValueError when it is not one."""
    try:
        status = record["status"]
        if status not in SHADOW_STATUSES:
            raise ValueError(f"status {status!r}")
        tokens = record.get("output_tokens")
        return {
            "request_id": str(record["request_id"]),
            "business_line": str(record["business_line"]),
            "adapter_name": str(record["adapter_name"]),
            "adapter_version": record.get("adapter_version"),
            "response": str(record.get("response") or "")[: limits.max_text_chars],
            "latency_ms": record.get("latency_ms"),
            "ttft_ms": record.get("ttft_ms"),
            "output_tokens": int(tokens) if tokens is not None else None,
            "status": status,
            "metadata": record.get("metadata"),
            "created_at": datetime.fromisoformat(record["created_at"]),
        }
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a shadow answer record: {exc!r}") from None


def quarantine_row(rejection: Rejection, source: str) -> dict[str, Any]:
    """The quarantine row for a refused record (fingerprinted on the whole record, so
    replays store it once): at most :data:`~flywheel.user_files.KEPT_BYTES` of it are kept,
    the reason saying how large it was."""
    size = rejection.size if rejection.size is not None else len(rejection.raw)
    kept = rejection.raw[:KEPT_BYTES]
    reason = rejection.reason[:KEPT_BYTES]
    if size > len(kept):
        reason += f" (the record is {size:,} bytes; the first {len(kept):,} kept)"
    return {
        "fingerprint": rejection.digest or hashlib.sha256(rejection.raw).hexdigest(),
        "source": source[:512],
        "line_number": rejection.line_number,
        "record_key": rejection.record_key[:256] if rejection.record_key else None,
        "field": rejection.field[:256] if rejection.field else None,
        "reason": reason,
        "raw": kept,
    }


def _copy_insert_new(
    connection: Connection, table: Table, key: str, rows: list[dict[str, Any]]
) -> int:
    """PostgreSQL fast path: drop rows whose key exists, COPY the rest straight in.

    Parsing a multi-row INSERT with tens of thousands of parameters costs more
    than the insert itself; COPY streams the rows. If a concurrent writer adds
    one of the same keys in between, the COPY fails as a unit inside a
    savepoint and the batch goes through a staging table with ON CONFLICT.
    """
    columns = [table.c[name] for name in rows[0]]
    names = sql.SQL(", ").join(sql.Identifier(column.name) for column in columns)
    target = sql.Identifier(table.name)
    key_column = sql.Identifier(table.c[key].name)
    json_columns = {i for i, column in enumerate(columns) if column.type._type_affinity is JSON}
    driver = connection.connection.driver_connection
    assert driver is not None

    def copy_into(cursor: Any, destination: sql.Composable, batch: list[dict[str, Any]]) -> None:
        statement = sql.SQL("COPY {into} ({names}) FROM STDIN").format(
            into=destination, names=names
        )
        with cursor.copy(statement) as copy:
            for row in batch:
                values = list(row.values())
                for i in json_columns:
                    if values[i] is not None:
                        values[i] = _json_dumps(values[i])
                copy.write_row(values)

    with driver.cursor() as cursor:
        cursor.execute(
            sql.SQL("SELECT {key} FROM {target} WHERE {key} = ANY(%s)").format(
                key=key_column, target=target
            ),
            ([row[key] for row in rows],),
        )
        existing = {found for (found,) in cursor.fetchall()}
        fresh = [row for row in rows if row[key] not in existing]
        if not fresh:
            return 0
        try:
            with driver.transaction():
                copy_into(cursor, target, fresh)
            return len(fresh)
        except psycopg.errors.UniqueViolation:
            pass
        stage = sql.Identifier(f"flywheel_stage_{table.name}")
        cursor.execute(
            sql.SQL(
                "CREATE TEMP TABLE IF NOT EXISTS {stage} ON COMMIT DELETE ROWS AS "
                "SELECT {names} FROM {target} WITH NO DATA"
            ).format(stage=stage, names=names, target=target)
        )
        copy_into(cursor, stage, fresh)
        cursor.execute(
            sql.SQL(
                "INSERT INTO {target} ({names}) SELECT {names} FROM {stage} "
                "ON CONFLICT ({key}) DO NOTHING"
            ).format(target=target, names=names, stage=stage, key=key_column)
        )
        inserted = cursor.rowcount
        cursor.execute(sql.SQL("TRUNCATE {stage}").format(stage=stage))
    return inserted


def _names_user(raw: bytes, user_id: str) -> bool:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return user_id.encode() in raw
    return isinstance(data, dict) and data.get("user_id") == user_id


def _batched(items: Iterable[IngestItem], size: int) -> Iterator[list[IngestItem]]:
    batch: list[IngestItem] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


class FeedbackStore:
    """Reads and writes interactions, feedback events and quarantined records."""

    def __init__(self, engine: Engine, limits: StoreSettings | None = None) -> None:
        self.engine = engine
        self.limits = limits or StoreSettings()

    @classmethod
    def open(cls, settings: Settings, *, migrate: bool = True) -> FeedbackStore:
        """Open the configured store, bringing its schema to the newest revision."""
        private_home(settings.home)
        engine = create_store_engine(
            settings.resolved_database_url, connect_timeout_s=settings.store.connect_timeout_s
        )
        if migrate and current_revision(engine) != head_revision():
            upgrade_schema(engine)
        return cls(engine, settings.store)

    def close(self) -> None:
        """Release pooled connections."""
        self.engine.dispose()

    @property
    def dialect(self) -> str:
        """``postgresql`` or ``sqlite``."""
        return self.engine.dialect.name

    def _insert(self, table: Table) -> Any:
        if self.dialect == "postgresql":
            return postgresql.insert(table)
        return sqlite.insert(table)

    def ingest(
        self,
        items: Iterable[IngestItem],
        *,
        source: str,
        on_progress: Callable[[int], None] | None = None,
        hold_orphans_since: datetime | None = None,
    ) -> IngestReport:
        """Store records in batches, one transaction per batch; duplicates are skipped.

        Good records are stored, bad ones quarantined with their reason and raw
        payload; the report counts both and keeps the first reasons in words. With
        ``hold_orphans_since``, feedback created since then on an interaction that is not
        stored yet (another replica may still hold it in its spool) is handed back in
        ``report.held`` instead of quarantined.
        """
        report = IngestReport(source=source)
        # Validation (CPU, this thread) overlaps the previous batch's write (database,
        # writer thread). One write in flight keeps batches in order, so feedback can
        # name an interaction from the batch before.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="flywheel-ingest") as writer:
            in_flight: Future[None] | None = None
            for batch in _batched(items, self.limits.batch_size):
                plan = plan_batch(batch, self.limits)
                report.read += len(batch)
                if in_flight is not None:
                    in_flight.result()
                in_flight = writer.submit(
                    self._write_batch, plan, source, report, hold_orphans_since
                )
                report.batches += 1
                if on_progress is not None:
                    on_progress(len(batch))
            if in_flight is not None:
                in_flight.result()
        return report

    def _write_batch(
        self,
        plan: BatchPlan,
        source: str,
        report: IngestReport,
        hold_orphans_since: datetime | None = None,
    ) -> None:
        interaction_rows: dict[str, dict[str, Any]] = {}
        for interaction in plan.interactions:
            if interaction.request_id in interaction_rows:
                report.duplicates += 1
                continue
            interaction_rows[interaction.request_id] = interaction_row(interaction)
        with self.engine.begin() as connection:
            users = {e.user_id for e in plan.interactions} | {e.user_id for e, _ in plan.feedback}
            forgotten = self.forgotten_since(connection, {u for u in users if u})
            if forgotten:
                plan, dropped = without_forgotten(plan, forgotten)
                report.forgotten += dropped
                kept = {i.request_id for i in plan.interactions}
                interaction_rows = {r: row for r, row in interaction_rows.items() if r in kept}
            lines = {rid: row["business_line"] for rid, row in interaction_rows.items()}
            wanted = {f.request_id for f, _ in plan.feedback} - lines.keys()
            lines.update(self._business_lines_of(connection, wanted))
            feedback_rows: dict[str, dict[str, Any]] = {}
            for event_in, item in plan.feedback:
                line = lines.get(event_in.request_id)
                if line is None:
                    held = hold_orphans_since is not None and (
                        event_in.created_at >= hold_orphans_since
                    )
                    if held and isinstance(item, dict):
                        report.held.append(item)
                    else:
                        plan.rejected.append(_missing_interaction(event_in, item))
                    continue
                row = feedback_row(event_in, line)
                if row["idempotency_key"] in feedback_rows:
                    report.duplicates += 1
                    continue
                feedback_rows[row["idempotency_key"]] = row
            added_interactions = self._insert_new(
                connection, interactions_table, "request_id", list(interaction_rows.values())
            )
            others = [row for row in feedback_rows.values() if row["type"] != EDIT]
            edits = [row for row in feedback_rows.values() if row["type"] == EDIT]
            added_feedback = self._insert_new(connection, feedback_table, "idempotency_key", others)
            added_edits, replaced = self._write_edits(connection, edits)
            added_feedback += added_edits
            if plan.rejected:
                self._insert_new(
                    connection,
                    quarantine_table,
                    "fingerprint",
                    [quarantine_row(r, source) for r in plan.rejected],
                )
        report.interactions_added += added_interactions
        report.feedback_added += added_feedback
        report.edits_replaced += replaced
        report.duplicates += (len(interaction_rows) - added_interactions) + (
            len(feedback_rows) - added_feedback - replaced
        )
        report.quarantined += len(plan.rejected)
        for rejection in plan.rejected:
            if len(report.rejections) < IngestReport.MAX_MESSAGES:
                report.rejections.append(rejection.describe(source))

    def _write_edits(self, connection: Connection, rows: list[dict[str, Any]]) -> tuple[int, int]:
        """Store edits so that each (answer, user) keeps one live edit: an edit newer than
        the stored one replaces its text, key and time in place (the row keeps its id, so
        the rollup and the experiments' tallies count it once); an older one, or a replay,
        is a duplicate. Returns (added, replaced). Stores written before this rule may hold
        several edits of an answer by a user: the newest is kept and the others go."""
        live = newest_edits(rows)
        if not live:
            return 0, 0
        f = feedback_table.c
        taken: set[str] = set()
        stored: dict[tuple[str, str | None], list[Any]] = {}
        request_ids = sorted({row["request_id"] for row in live})
        keys = sorted(row["idempotency_key"] for row in live)
        for start in range(0, len(request_ids), 1_000):
            chunk = request_ids[start : start + 1_000]
            for found in connection.execute(
                select(f.id, f.request_id, f.user_id, f.created_at, f.idempotency_key)
                .where(f.type == EDIT, f.request_id.in_(chunk))
                .order_by(f.created_at, f.id)
            ):
                stored.setdefault((found.request_id, found.user_id), []).append(found)
        for start in range(0, len(keys), 1_000):
            chunk = keys[start : start + 1_000]
            taken.update(
                connection.execute(select(f.idempotency_key).where(f.idempotency_key.in_(chunk)))
                .scalars()
                .all()
            )
        fresh: list[dict[str, Any]] = []
        replaced = 0
        for row in live:
            held = stored.get((row["request_id"], row["user_id"]), [])
            if row["idempotency_key"] in taken:
                continue  # a replay of an edit already stored (live or replaced since)
            if not held:
                fresh.append(row)
                continue
            current = held[-1]
            if current.created_at > row["created_at"]:
                continue  # an older edit arriving late: the newer one stays
            connection.execute(
                update(feedback_table)
                .where(f.id == current.id)
                .values(
                    idempotency_key=row["idempotency_key"],
                    edited_text=row["edited_text"],
                    metadata=row["metadata"],
                    created_at=row["created_at"],
                )
            )
            if len(held) > 1:
                connection.execute(
                    delete(feedback_table).where(f.id.in_([old.id for old in held[:-1]]))
                )
            replaced += 1
        return self._insert_new(connection, feedback_table, "idempotency_key", fresh), replaced

    def add_shadow_outputs(self, records: Iterable[dict[str, Any]]) -> ShadowWrite:
        """Store shadow answers in one transaction, once per (request, adapter): a replay
        adds nothing twice. One whose interaction is not stored, or that is no shadow answer
        record, is dropped and counted (never quarantined: it is no user's data)."""
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        invalid = duplicates = 0
        for record in records:
            try:
                row = shadow_output_row(record, self.limits)
            except ValueError:
                invalid += 1
                continue
            key = (row["request_id"], row["adapter_name"])
            duplicates += key in rows
            rows[key] = row
        if not rows:
            return ShadowWrite(invalid=invalid, duplicates=duplicates)
        table = shadow_outputs_table
        with self.engine.begin() as connection:
            stored = self._business_lines_of(connection, {rid for rid, _ in rows})
            kept = [row for (rid, _), row in rows.items() if rid in stored]
            added = 0
            if kept:
                statement = (
                    self._insert(table)
                    .on_conflict_do_nothing(index_elements=["request_id", "adapter_name"])
                    .returning(table.c.id)
                )
                added = len(connection.execute(statement, kept).all())
        return ShadowWrite(
            added=added,
            duplicates=duplicates + len(kept) - added,
            missing=len(rows) - len(kept),
            invalid=invalid,
        )

    def _business_lines_of(self, connection: Connection, request_ids: set[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        ids = sorted(request_ids)
        for start in range(0, len(ids), 1_000):
            chunk = ids[start : start + 1_000]
            query = select(
                interactions_table.c.request_id, interactions_table.c.business_line
            ).where(interactions_table.c.request_id.in_(chunk))
            found.update({row[0]: row[1] for row in connection.execute(query)})
        return found

    def _insert_new(
        self, connection: Connection, table: Table, key: str, rows: list[dict[str, Any]]
    ) -> int:
        """Insert rows whose ``key`` is new; returns how many were inserted."""
        if not rows:
            return 0
        if self.dialect == "postgresql" and len(rows) >= COPY_THRESHOLD:
            return _copy_insert_new(connection, table, key, rows)
        statement = (
            self._insert(table).on_conflict_do_nothing(index_elements=[key]).returning(table.c.id)
        )
        return len(connection.execute(statement, rows).all())

    def stats(self) -> dict[str, Any]:
        """Counts of interactions and signals, overall and per business line."""
        lines: dict[str, dict[str, Any]] = {}

        def line_entry(name: str) -> dict[str, Any]:
            return lines.setdefault(
                name, {"interactions": 0, "events": dict.fromkeys(SIGNAL_TYPES, 0)}
            )

        totals: dict[str, int] = dict.fromkeys(SIGNAL_TYPES, 0)
        interactions = 0
        with self.engine.connect() as connection:
            per_line = select(interactions_table.c.business_line, func.count()).group_by(
                interactions_table.c.business_line
            )
            for name, count in connection.execute(per_line):
                line_entry(name)["interactions"] = count
                interactions += count
            per_type = select(
                feedback_table.c.business_line, feedback_table.c.type, func.count()
            ).group_by(feedback_table.c.business_line, feedback_table.c.type)
            for name, kind, count in connection.execute(per_type):
                entry = line_entry(name)["events"]
                entry[kind] = entry.get(kind, 0) + count
                totals[kind] = totals.get(kind, 0) + count
            quarantined = connection.execute(select(func.count()).select_from(quarantine_table))
            quarantine_count = quarantined.scalar_one()
        return {
            "interactions": interactions,
            "events": totals,
            "business_lines": dict(sorted(lines.items())),
            "quarantined": quarantine_count,
        }

    # -- the gateway's look-ups (one query each, off its event loop) ----------------------

    def request_owner(self, request_id: str) -> tuple[str, str | None, str | None] | None:
        """(business line, user, adapter) of a logged request, or None."""
        table = interactions_table
        query = select(table.c.business_line, table.c.user_id, table.c.adapter_name).where(
            table.c.request_id == request_id
        )
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
        return None if row is None else (row.business_line, row.user_id, row.adapter_name)

    def session_adapter(self, business_line: str, session_id: str) -> tuple[bool, str | None]:
        """(found, adapter) of the latest logged request of a line's session."""
        table = interactions_table
        query = (
            select(table.c.adapter_name)
            .where(table.c.business_line == business_line, table.c.session_id == session_id)
            .order_by(table.c.created_at.desc())
            .limit(1)
        )
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
        return (False, None) if row is None else (True, row.adapter_name)

    def feedback_claim(self, idempotency_key: str) -> tuple[str, str] | None:
        """(request id, type) of the stored feedback event under ``idempotency_key``."""
        table = feedback_table
        query = select(table.c.request_id, table.c.type).where(
            table.c.idempotency_key == idempotency_key
        )
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
        return None if row is None else (row.request_id, row.type)

    def signals_on(
        self, request_id: str, type_: str
    ) -> list[tuple[str | None, str | None, str | None]]:
        """(edited text, outcome, replaced by) of each stored ``type_`` event on a request."""
        table = feedback_table
        query = select(table.c.edited_text, table.c.outcome, table.c.replaced_by).where(
            table.c.request_id == request_id, table.c.type == type_
        )
        with self.engine.connect() as connection:
            return [(r.edited_text, r.outcome, r.replaced_by) for r in connection.execute(query)]

    def business_lines(self) -> list[str]:
        """Every business line with at least one interaction."""
        line = interactions_table.c.business_line
        with self.engine.connect() as connection:
            return list(connection.execute(select(line).distinct().order_by(line)).scalars())

    def requests_per_line(self, since: datetime) -> dict[str, int]:
        """Interactions logged per business line since ``since`` (lines without any absent)."""
        table = interactions_table
        query = (
            select(table.c.business_line, func.count())
            .where(table.c.created_at >= since)
            .group_by(table.c.business_line)
        )
        with self.engine.connect() as connection:
            return {line: int(count) for line, count in connection.execute(query)}

    def forget_user(self, user_id: str, *, now: datetime | None = None) -> UserErasure:
        """Delete every record of a user, in one transaction, under each form their id may
        be stored in (:func:`user_id_forms`: as given, and as the gateway keeps it), and
        record the user as forgotten (by digest) so a spool replayed later drops the
        user's older records.

        Interactions by the user go with all their feedback and shadow answers; feedback
        the user gave on other interactions goes too, and so do quarantined records naming
        them.
        """
        i, f, q = interactions_table.c, feedback_table.c, quarantine_table.c
        forms = user_id_forms(user_id)
        stored = stored_identity(user_id) or user_id
        erasure = UserErasure(user_key=user_key(stored), forgotten_at=now or datetime.now(UTC))
        with self.engine.begin() as connection:
            require_declared(connection)
            for form in forms:
                owned = select(i.request_id).where(i.user_id == form)
                # Shadow answers to the user's prompts (the foreign key cascades too; explicit,
                # so nothing depends on SQLite's foreign_keys pragma).
                shadows = connection.execute(
                    delete(shadow_outputs_table).where(shadow_outputs_table.c.request_id.in_(owned))
                )
                on_theirs = connection.execute(
                    delete(feedback_table).where(f.request_id.in_(owned))
                )
                # The training history holds hashes of their scrubbed text by request id.
                connection.execute(
                    delete(trained_records_table).where(
                        trained_records_table.c.request_id.in_(owned)
                    )
                )
                # Other packages' rows about their requests, such as which reviewer was
                # handed their answers (the foreign keys cascade too).
                for table in rows_about_requests():
                    connection.execute(delete(table).where(table.c.request_id.in_(owned)))
                given = connection.execute(delete(feedback_table).where(f.user_id == form))
                interactions = connection.execute(
                    delete(interactions_table).where(i.user_id == form)
                )
                erasure.deleted[form] = {
                    "interactions": interactions.rowcount,
                    "feedback_events": on_theirs.rowcount + given.rowcount,
                    "shadow_outputs": shadows.rowcount,
                    "quarantined": 0,
                }
            for row in connection.execute(select(q.id, q.raw)):
                form = next((u for u in forms if _names_user(row.raw, u)), None)
                if form is not None:
                    connection.execute(delete(quarantine_table).where(q.id == row.id))
                    erasure.deleted[form]["quarantined"] += 1
            if erasure.total("interactions") or erasure.total("feedback_events"):
                # The hourly rollup only ever adds; the next read recounts from scratch.
                connection.execute(delete(signal_rollup_table))
                connection.execute(delete(rollup_watermarks_table))
                # So do other packages' running counts, such as the experiments' tallies.
                for table in recounted_after_erasure():
                    connection.execute(delete(table))
            forgotten = forgotten_users_table
            connection.execute(delete(forgotten).where(forgotten.c.user_key == erasure.user_key))
            connection.execute(
                forgotten.insert().values(
                    user_key=erasure.user_key, forgotten_at=erasure.forgotten_at
                )
            )
        return erasure

    def forgotten_since(self, connection: Connection, user_ids: set[str]) -> dict[str, datetime]:
        """When each of ``user_ids`` (stored ids) was forgotten, for those that were."""
        keys = {user_key(u): u for u in user_ids}
        found: dict[str, datetime] = {}
        ordered = sorted(keys)
        table = forgotten_users_table
        for start in range(0, len(ordered), 1_000):
            chunk = ordered[start : start + 1_000]
            query = select(table.c.user_key, table.c.forgotten_at).where(
                table.c.user_key.in_(chunk)
            )
            found.update({keys[key]: when for key, when in connection.execute(query)})
        return found

    def quarantined(self, *, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
        """Quarantined records, newest first, raw payload included as bytes."""
        query = (
            select(quarantine_table)
            .order_by(quarantine_table.c.id.desc())
            .limit(limit)
            .offset(offset)
        )
        with self.engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(query)]
