"""Interaction logging off the request path: a writer thread, a disk spool, regenerate inference.

The request handler hands a finished request to :meth:`InteractionRecorder.record`
(a queue put, no I/O) and returns. A writer thread turns finished requests into
interaction events in batches, infers regenerates (the same prompt again in the
same session within a window) and ingests each batch in one transaction.

When the store cannot be reached, the batch goes to a spool file on local disk
(written whole, fsync'd, then renamed into place) and the spool is replayed, in
order and before anything newer, once the store answers again. Ingest is
idempotent (request ids and idempotency keys are unique), so a replay that
overlaps what was already stored adds nothing twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from feedback.answers import is_refusal, output_tokens, time_per_output_token_ms
from feedback.events import prompt_hash
from feedback.records import last_user_text
from feedback.schema import interactions_table
from feedback.store import FeedbackStore
from flywheel.file_modes import open_private, private_dir
from gateway.implicit import COMPLAINT, implicit_signal

logger = logging.getLogger(__name__)

SOURCE = "gateway"
# The record type of a shadow adapter's answer (``gateway.shadow``), stored apart from events.
SHADOW_OUTPUT = "shadow_output"
# Errors that mean "the store is not there right now", as opposed to a bug.
STORE_DOWN_ERRORS: tuple[type[BaseException], ...] = (SQLAlchemyError, OSError)


@dataclass(slots=True)
class FinishedRequest:
    """What the request path knows when a request ends; parsed later, off the hot path."""

    request_id: str
    business_line: str
    base_model: str
    messages: list[dict[str, Any]]
    created_at: datetime
    adapter_name: str | None = None
    adapter_version: int | None = None
    arm: str | None = None
    session_id: str | None = None
    user_id: str | None = None
    # The caller's API key by name (never the secret).
    key_name: str | None = None
    status: str = "ok"
    latency_ms: float | None = None
    ttft_ms: float | None = None
    body: bytes | None = None
    chunks: list[bytes] | None = None
    completion_api: bool = False
    error: str | None = None
    # upstream_unavailable, upstream_failed, upstream_error, adapter_missing, stream_broken
    # (the model side's), or rejected_by_model_server (the caller's request was refused).
    error_kind: str | None = None


@dataclass(frozen=True, slots=True)
class RecentRequest:
    """What the gateway remembers of a request it served lately."""

    business_line: str
    user_id: str | None
    adapter_name: str | None


def answer_text(finished: FinishedRequest) -> tuple[str, dict[str, Any] | None]:
    """The answer's text and token usage, from a JSON body or from SSE chunks."""
    field_name = "text" if finished.completion_api else "content"
    if finished.body is not None:
        try:
            document = orjson.loads(finished.body)
            choice = document["choices"][0]
            text = choice["text"] if finished.completion_api else choice["message"]["content"]
            return text or "", document.get("usage")
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            return "", None
    parts: list[str] = []
    usage = None
    for line in b"".join(finished.chunks or ()).split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            continue
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        usage = event.get("usage") or usage
        for choice in event.get("choices") or ():
            source = choice if finished.completion_api else choice.get("delta") or {}
            piece = source.get(field_name)
            if isinstance(piece, str):
                parts.append(piece)
    return "".join(parts), usage


def used_tokens(finished: FinishedRequest) -> int:
    """Prompt + completion tokens of a finished request: vLLM's usage when it reported one,
    else an estimate of four characters a token (a stream without usage, a failed answer)."""
    text, usage = answer_text(finished)
    if isinstance(usage, dict):
        total = usage.get("total_tokens")
        if isinstance(total, int) and total >= 0:
            return total
    prompt = sum(len(m.get("content") or "") for m in finished.messages)
    return (prompt + len(text)) // 4 + 1


def interaction_event(finished: FinishedRequest) -> dict[str, Any]:
    """The store's interaction record of a finished request."""
    text, usage = answer_text(finished)
    metadata: dict[str, Any] = {}
    if usage:
        metadata["usage"] = usage
    if finished.status == "ok":
        # What the canary judges besides the users: length, speed per token, refusals.
        tokens = output_tokens(usage, text)
        metadata["output_tokens"] = tokens
        tpot = time_per_output_token_ms(finished.latency_ms, finished.ttft_ms, tokens)
        if tpot is not None:
            metadata["tpot_ms"] = round(tpot, 3)
        if is_refusal(text):
            metadata["refusal"] = True
    if finished.error:
        metadata["error"] = finished.error[:500]
    if finished.error_kind:
        metadata["error_kind"] = finished.error_kind
    return {
        "type": "interaction",
        "request_id": finished.request_id,
        "session_id": finished.session_id,
        "user_id": finished.user_id,
        "key_name": finished.key_name,
        "business_line": finished.business_line,
        "adapter_name": finished.adapter_name,
        "adapter_version": finished.adapter_version,
        "base_model": finished.base_model,
        "arm": finished.arm,
        "messages": finished.messages,
        "response": text,
        "prompt_hash": prompt_hash(finished.messages),
        "latency_ms": finished.latency_ms,
        "ttft_ms": finished.ttft_ms,
        "status": finished.status,
        "source": SOURCE,
        "metadata": metadata or None,
        "created_at": finished.created_at.isoformat(),
    }


def _prompt_key(interaction: dict[str, Any]) -> tuple[str, str, str]:
    """A repeat is the same prompt in the same session of the same line (session ids are the
    caller's: another line reusing one must not plant a regenerate here)."""
    return (interaction["business_line"], interaction["session_id"], interaction["prompt_hash"])


def regenerate_event(earlier_id: str, interaction: dict[str, Any]) -> dict[str, Any]:
    """The inferred regenerate of ``earlier_id``, replaced by ``interaction``."""
    return _inferred("regenerate", earlier_id, interaction, key="regenerate", how=True)


def implicit_event(earlier_id: str, interaction: dict[str, Any], kind: str) -> dict[str, Any]:
    """What ``interaction`` says of the answer ``earlier_id`` before it in its session: a
    rephrased question is a regenerate of it, a complaining follow-up a thumbs-down; both
    marked inferred, with how (``gateway.implicit``)."""
    signal = "thumbs_down" if kind == COMPLAINT else "regenerate"
    return _inferred(signal, earlier_id, interaction, key=kind, how=kind)


def _inferred(
    signal: str, earlier_id: str, interaction: dict[str, Any], *, key: str, how: object
) -> dict[str, Any]:
    """A feedback event the gateway inferred on ``earlier_id`` from ``interaction``."""
    event = {
        "type": signal,
        "request_id": earlier_id,
        "user_id": interaction["user_id"],
        "idempotency_key": f"{key}:{interaction['request_id']}",
        "metadata": {"inferred": how},
        "created_at": interaction["created_at"],
    }
    if signal == "regenerate":
        event["replaced_by"] = interaction["request_id"]
    return event


class Spool:
    """Batches waiting on local disk for the store; each file is one whole batch."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._sequence = 0

    def append(self, events: list[dict[str, Any]]) -> Path:
        """Write one batch durably (a crash leaves either the whole file or none)."""
        private_dir(self.directory)
        self._sequence += 1
        name = f"batch-{time.time_ns():020d}-{os.getpid()}-{self._sequence:06d}.jsonl"
        final = self.directory / name
        partial = final.with_suffix(".partial")
        with os.fdopen(open_private(partial), "wb") as out:
            for event in events:
                out.write(orjson.dumps(event) + b"\n")
            out.flush()
            os.fsync(out.fileno())
        partial.replace(final)
        return final

    def files(self) -> list[Path]:
        """Spooled batches, oldest first (every replica's, so none is stranded)."""
        if not self.directory.exists():
            return []
        return sorted(self.directory.glob("batch-*.jsonl"))

    def records(self) -> int:
        """How many events wait in the spool."""
        total = 0
        for path in self.files():
            with contextlib.suppress(OSError):
                total += sum(1 for line in path.read_bytes().splitlines() if line.strip())
        return total

    def replay(self, ingest: Callable[[list[dict[str, Any]]], None]) -> int:
        """Ingest spooled batches oldest first, deleting each once stored; stop at the
        first failure (it propagates). Returns the number of events replayed."""
        replayed = 0
        for path in self.files():
            try:
                handle = path.open("rb")
            except FileNotFoundError:  # another replica replayed it just now
                continue
            with handle:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                if not path.exists():
                    continue
                events = [orjson.loads(line) for line in handle.read().splitlines() if line]
                ingest(events)
                path.unlink()
                replayed += len(events)
        return replayed


@dataclass(slots=True)
class RecorderStats:
    """Counters for /metrics and tests."""

    written: int = 0
    spooled: int = 0
    replayed: int = 0
    regenerates: int = 0
    # Rephrased questions and complaining follow-ups read as signals (gateway.implicit).
    implicit: int = 0
    shadows: int = 0  # shadow answers stored
    shadows_dropped: int = 0  # shadow answers whose interaction is not in the store
    held: int = 0  # feedback held for its interaction (each retry counts again)
    forgotten: int = 0  # records of users forgotten since they were made (spool replays)
    store_failures: int = 0
    store_up: bool = True
    last_error: str | None = None


@dataclass(slots=True)
class _Flush:
    done: threading.Event = field(default_factory=threading.Event)


class InteractionRecorder:
    """The background writer of the gateway's interactions and feedback."""

    def __init__(
        self,
        store: FeedbackStore,
        spool_dir: Path,
        *,
        batch_size: int = 500,
        flush_s: float = 0.2,
        retry_s: float = 2.0,
        regenerate_window_s: float = 600.0,
        remember: int = 200_000,
        orphan_grace_s: float = 600.0,
    ) -> None:
        self.store = store
        self.spool = Spool(spool_dir)
        # Feedback whose interaction another replica has not written yet (its spool may
        # hold it through an outage): retried every retry_s, quarantined after the grace.
        self.waiting = Spool(spool_dir / "waiting")
        self.orphan_grace = timedelta(seconds=orphan_grace_s)
        self._last_waiting_retry = 0.0
        self.batch_size = batch_size
        self.flush_s = flush_s
        self.retry_s = retry_s
        self.regenerate_window = timedelta(seconds=regenerate_window_s)
        self.remember = remember
        self.stats = RecorderStats()
        self._queue: queue.SimpleQueue[FinishedRequest | dict[str, Any] | _Flush | None] = (
            queue.SimpleQueue()
        )
        self._recent: OrderedDict[str, RecentRequest] = OrderedDict()
        self._prompts: OrderedDict[tuple[str, str, str], tuple[str, datetime]] = OrderedDict()
        # Each session's last request: (request id, time, its question), for implicit signals.
        self._last_turn: OrderedDict[tuple[str, str], tuple[str, datetime, str]] = OrderedDict()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last_retry = 0.0

    # -- request path (no I/O) ------------------------------------------------------------

    def record(self, finished: FinishedRequest) -> None:
        """Queue a finished request for logging and remember who it belongs to."""
        self._remember(
            finished.request_id,
            RecentRequest(finished.business_line, finished.user_id, finished.adapter_name),
        )
        self._queue.put(finished)

    def record_feedback(self, event: dict[str, Any]) -> None:
        """Queue a validated feedback event."""
        self._queue.put(event)

    def record_shadow(self, output: dict[str, Any]) -> None:
        """Queue a shadow adapter's answer (``gateway.shadow``); it is written after the
        interaction it shadowed, which was queued first."""
        self._queue.put(output)

    def recent(self, request_id: str) -> RecentRequest | None:
        """A request served lately by this replica, if it is remembered."""
        with self._lock:
            return self._recent.get(request_id)

    def _remember(self, request_id: str, entry: RecentRequest) -> None:
        with self._lock:
            self._recent[request_id] = entry
            if len(self._recent) > self.remember:
                self._recent.popitem(last=False)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread (and replay what an earlier run left in the spool)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="flywheel-gateway-recorder", daemon=True
            )
            self._thread.start()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued so far was written or spooled."""
        marker = _Flush()
        self._queue.put(marker)
        return marker.done.wait(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write or spool everything queued, then stop the thread."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._thread = None

    # -- writer thread --------------------------------------------------------------------

    def _run(self) -> None:
        self._try_replay(wait_backoff=False)
        stopping = False
        while not stopping:
            batch, markers, stopping = self._drain()
            if batch:
                self._write(self._events(batch))
            else:
                self._try_replay()
            self._retry_waiting()
            for marker in markers:
                marker.done.set()
        # One last try on the way out; what still fails stays in the spool for the next start.
        self._try_replay(wait_backoff=False)

    def _drain(self) -> tuple[list[FinishedRequest | dict[str, Any]], list[_Flush], bool]:
        """Up to a batch: from the first item, whatever arrives within ``flush_s`` (one
        transaction per batch instead of one per request keeps the writer cheap under load)."""
        batch: list[FinishedRequest | dict[str, Any]] = []
        markers: list[_Flush] = []
        timeout: float | None = self.flush_s
        deadline = None
        while len(batch) < self.batch_size:
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                break
            if item is None:
                return batch, markers, True
            if isinstance(item, _Flush):
                markers.append(item)
                break
            batch.append(item)
            if deadline is None:
                deadline = time.monotonic() + self.flush_s
            timeout = max(deadline - time.monotonic(), 0.0)
        return batch, markers, False

    def _events(self, batch: Iterable[FinishedRequest | dict[str, Any]]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        interactions: list[dict[str, Any]] = []
        for item in batch:
            if isinstance(item, FinishedRequest):
                interaction = interaction_event(item)
                interactions.append(interaction)
                events.append(interaction)
            else:
                events.append(item)
        regenerates = self._regenerates(interactions)
        events.extend(regenerates)
        events.extend(self._implicit(interactions, {e["replaced_by"] for e in regenerates}))
        return events

    def _implicit(
        self, interactions: list[dict[str, Any]], regenerating: set[str]
    ) -> list[dict[str, Any]]:
        """Implicit signals on each session's previous answer (``gateway.implicit``): this
        replica's memory of the session's last turn (another replica's turns are not seen)."""
        found: list[dict[str, Any]] = []
        for interaction in interactions:
            session = interaction["session_id"]
            if not session:
                continue
            key = (interaction["business_line"], session)
            created = datetime.fromisoformat(interaction["created_at"])
            question = last_user_text(interaction["messages"])
            earlier = self._last_turn.get(key)
            if (
                earlier is not None
                and interaction["request_id"] not in regenerating
                and earlier[0] != interaction["request_id"]
                and timedelta(0) <= created - earlier[1] <= self.regenerate_window
            ):
                kind = implicit_signal(interaction["messages"], earlier[2])
                if kind is not None:
                    found.append(implicit_event(earlier[0], interaction, kind))
            self._last_turn[key] = (interaction["request_id"], created, question)
            self._last_turn.move_to_end(key)
            if len(self._last_turn) > self.remember:
                self._last_turn.popitem(last=False)
        self.stats.implicit += len(found)
        return found

    def _regenerates(self, interactions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Regenerate events for interactions that repeat an earlier prompt of their session."""
        found: list[dict[str, Any]] = []
        unseen = [
            i for i in interactions if i["session_id"] and _prompt_key(i) not in self._prompts
        ]
        stored = self._stored_prompts(unseen) if unseen else {}
        for interaction in interactions:
            session = interaction["session_id"]
            if not session:
                continue
            key = _prompt_key(interaction)
            created = datetime.fromisoformat(interaction["created_at"])
            earlier = self._prompts.get(key) or stored.get(key)
            if (
                earlier is not None
                and earlier[0] != interaction["request_id"]
                and timedelta(0) <= created - earlier[1] <= self.regenerate_window
            ):
                found.append(regenerate_event(earlier[0], interaction))
            self._prompts[key] = (interaction["request_id"], created)
            self._prompts.move_to_end(key)
            if len(self._prompts) > self.remember:
                self._prompts.popitem(last=False)
        self.stats.regenerates += len(found)
        return found

    def _stored_prompts(
        self, interactions: list[dict[str, Any]]
    ) -> dict[tuple[str, str, str], tuple[str, datetime]]:
        """The latest stored request per (line, session, prompt) among ``interactions``'
        sessions (another replica may have served the first ask)."""
        if not self.stats.store_up:
            return {}
        sessions = {i["session_id"] for i in interactions}
        lines = {i["business_line"] for i in interactions}
        since = min(datetime.fromisoformat(i["created_at"]) for i in interactions)
        table = interactions_table
        query = select(
            table.c.request_id,
            table.c.business_line,
            table.c.session_id,
            table.c.prompt_hash,
            table.c.created_at,
        )
        query = query.where(
            table.c.business_line.in_(lines),
            table.c.session_id.in_(sessions),
            table.c.created_at >= since - self.regenerate_window,
        ).order_by(table.c.created_at)
        try:
            with self.store.engine.connect() as connection:
                rows = connection.execute(query).all()
        except STORE_DOWN_ERRORS:
            return {}
        return {
            (r.business_line, r.session_id, r.prompt_hash): (r.request_id, r.created_at)
            for r in rows
        }

    def _ingest(self, events: list[dict[str, Any]]) -> None:
        since = datetime.now(UTC) - self.orphan_grace
        shadows = [e for e in events if e.get("type") == SHADOW_OUTPUT]
        if shadows:
            events = [e for e in events if e.get("type") != SHADOW_OUTPUT]
        report = self.store.ingest(events, source=SOURCE, hold_orphans_since=since)
        if shadows:
            # After their interactions (same or an earlier batch). One whose interaction is
            # not stored is dropped and counted: the user's data is never held up for it.
            written = self.store.add_shadow_outputs(shadows)
            self.stats.shadows += written.added
            self.stats.shadows_dropped += written.missing + written.invalid
        self.stats.forgotten += report.forgotten
        if report.held:
            self.waiting.append(report.held)
            self.stats.held += len(report.held)
        if report.quarantined:
            logger.warning(
                "gateway: %d records quarantined: %s", report.quarantined, report.rejections[:3]
            )

    def _write(self, events: list[dict[str, Any]]) -> None:
        if not self._try_replay():
            self._spool(events)
            return
        try:
            self._ingest(events)
        except STORE_DOWN_ERRORS as exc:
            self._store_down(exc)
            self._spool(events)
            return
        self.stats.written += len(events)
        self.stats.store_up = True

    def _spool(self, events: list[dict[str, Any]]) -> None:
        self.spool.append(events)
        self.stats.spooled += len(events)

    def _store_down(self, exc: BaseException) -> None:
        if self.stats.store_up:
            logger.warning(
                "gateway: the store is unreachable; spooling to %s", self.spool.directory
            )
        self.stats.store_up = False
        self.stats.store_failures += 1
        self.stats.last_error = type(exc).__name__
        self._last_retry = time.monotonic()

    def _retry_waiting(self) -> None:
        """Feedback held for its interaction, again (every ``retry_s``, while the store is
        up): stored once the interaction is, quarantined once past the grace."""
        if not self.stats.store_up or time.monotonic() - self._last_waiting_retry < self.retry_s:
            return
        self._last_waiting_retry = time.monotonic()
        try:
            self.waiting.replay(self._ingest)
        except STORE_DOWN_ERRORS as exc:
            self._store_down(exc)

    def _try_replay(self, *, wait_backoff: bool = True) -> bool:
        """Replay the spool (after ``retry_s`` since the last failure, unless told not to
        wait); True when the spool is empty afterwards."""
        if not self.spool.files():
            return True
        waited = time.monotonic() - self._last_retry
        if wait_backoff and not self.stats.store_up and waited < self.retry_s:
            return False
        try:
            replayed = self.spool.replay(self._ingest)
        except STORE_DOWN_ERRORS as exc:
            self._store_down(exc)
            return False
        if replayed:
            logger.info("gateway: replayed %d spooled records into the store", replayed)
        self.stats.replayed += replayed
        self.stats.store_up = True
        return not self.spool.files()
