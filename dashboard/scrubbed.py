"""Samples as the page shows them: scrubbed with the project's scrubber, then cached.

The store keeps raw text; every text a page, the API or an export shows passes
through :class:`SampleScrubber` first: prompt messages, the answer and the edit
are scrubbed together as one record (so ``<PERSON_1>`` in the prompt and in the
edit name the same person), and the diff is taken between the scrubbed answer
and the scrubbed edit. Scrubbing runs at tens of thousands of characters a
second, so results are kept in an LRU cache keyed by the record's id and content.
"""

from __future__ import annotations

import gc
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from dashboard.diffs import DiffSegment, edit_diff, side_by_side, similarity
from dashboard.queries import RawSample

if TYPE_CHECKING:
    from feedback.pii import Scrubber

SCRUBBED_FIELDS = ("messages", "response", "edit")
SNIPPET_CHARS = 180


@dataclass(frozen=True, slots=True)
class SampleEvent:
    """A feedback event as shown: its signal and time (an edit's text is on the sample)."""

    type: str
    outcome: str | None
    created_at: datetime

    @property
    def label(self) -> str:
        """``thumbs_up``, ``task_success``, ..."""
        if self.type == "task_outcome":
            return f"task_{self.outcome or 'outcome'}"
        return self.type


@dataclass(frozen=True, slots=True)
class Sample:
    """A scrubbed sample: safe to render, return or export."""

    request_id: str
    business_line: str
    created_at: datetime
    adapter: str
    status: str
    latency_ms: float | None
    user: str | None
    messages: tuple[dict[str, str], ...]
    response: str
    edit: str | None
    events: tuple[SampleEvent, ...]
    pii: dict[str, int]

    @property
    def prompt(self) -> str:
        """The newest user message."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return message.get("content", "")
        return ""

    @property
    def signals(self) -> list[str]:
        """Distinct signals in the order they came."""
        return list(dict.fromkeys(event.label for event in self.events))

    def snippet(self, text: str) -> str:
        """``text`` cut for a table cell."""
        flat = " ".join(text.split())
        return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1] + "…"

    def diff(self) -> list[DiffSegment]:
        """The edit against the answer it replaced (empty without an edit)."""
        return edit_diff(self.response, self.edit) if self.edit is not None else []

    def diff_columns(self) -> tuple[list[DiffSegment], list[DiffSegment]]:
        """The answer with removals marked and the edit with additions marked, side by side."""
        return side_by_side(self.response, self.edit) if self.edit is not None else ([], [])

    def edit_similarity(self) -> float | None:
        """Share of the answer the edit kept."""
        return similarity(self.response, self.edit) if self.edit is not None else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (what the API and the JSONL export return)."""
        return {
            "request_id": self.request_id,
            "business_line": self.business_line,
            "created_at": self.created_at.isoformat(),
            "adapter": self.adapter,
            "status": self.status,
            "latency_ms": self.latency_ms,
            "user": self.user,
            "messages": list(self.messages),
            "response": self.response,
            "edit": self.edit,
            "signals": self.signals,
            "events": [
                {"signal": e.label, "created_at": e.created_at.isoformat()} for e in self.events
            ],
            "pii_replaced": self.pii,
        }


def _key(raw: RawSample) -> str:
    content = orjson.dumps([raw.messages, raw.response, raw.edit])
    return f"{raw.request_id}:{hashlib.sha256(content).hexdigest()[:16]}"


class SampleScrubber:
    """Scrubs raw samples into :class:`Sample` (batched, cached, one scrub at a time).

    ``factory`` builds the scrubber on first use (spaCy and jieba take a second or
    two to load), so opening the page's app costs nothing until a sample is shown.
    """

    def __init__(self, factory: Callable[[], Scrubber], cache_size: int = 20_000) -> None:
        self._factory = factory
        self._scrubber: Scrubber | None = None
        self._cache: OrderedDict[str, Sample] = OrderedDict()
        self._texts: OrderedDict[str, str] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._scrub_lock = threading.Lock()

    def _engine(self) -> Scrubber:
        if self._scrubber is None:
            self._scrubber = self._factory()
            # spaCy's model lives as long as the server: keep it out of full collections.
            gc.freeze()
        return self._scrubber

    def _remember(self, cache: OrderedDict[str, Any], key: str, value: Any) -> None:
        with self._lock:
            cache[key] = value
            cache.move_to_end(key)
            while len(cache) > self._cache_size:
                cache.popitem(last=False)

    def scrub(self, raws: Sequence[RawSample]) -> list[Sample]:
        """Scrubbed samples, in the order given."""
        keys = [_key(raw) for raw in raws]
        with self._lock:
            found = {key: self._cache[key] for key in keys if key in self._cache}
            for key in found:
                self._cache.move_to_end(key)
        missing = [(key, raw) for key, raw in zip(keys, raws, strict=True) if key not in found]
        if missing:
            records = [
                {
                    "messages": [dict(m) for m in raw.messages],
                    "response": raw.response,
                    "edit": raw.edit,
                }
                for _, raw in missing
            ]
            from feedback.pii import scrub_records

            with self._scrub_lock:
                scrubbed = scrub_records(records, SCRUBBED_FIELDS, self._engine())
            for (key, raw), clean in zip(missing, scrubbed, strict=True):
                sample = Sample(
                    request_id=raw.request_id,
                    business_line=raw.business_line,
                    created_at=raw.created_at,
                    adapter=raw.adapter,
                    status=raw.status,
                    latency_ms=raw.latency_ms,
                    user=raw.user,
                    messages=tuple(
                        {"role": str(m.get("role", "")), "content": str(m.get("content", ""))}
                        for m in clean["messages"]
                    ),
                    response=clean["response"],
                    edit=clean["edit"],
                    events=tuple(SampleEvent(e.type, e.outcome, e.created_at) for e in raw.events),
                    pii=dict(clean.get("pii") or {}),
                )
                found[key] = sample
                if self._cache_size:
                    self._remember(self._cache, key, sample)
        return [found[key] for key in keys]

    def scrub_texts(self, texts: Sequence[str | None]) -> list[str | None]:
        """Independent texts scrubbed (eval generations), cached by content."""
        keys = [hashlib.sha256(t.encode()).hexdigest() if t else "" for t in texts]
        with self._lock:
            known = {k: self._texts[k] for k in keys if k and k in self._texts}
        todo = sorted(
            {k: t for k, t in zip(keys, texts, strict=True) if t and k not in known}.items()
        )
        if todo:
            with self._scrub_lock:
                results = self._engine().scrub_texts([text for _, text in todo])
            for (key, _), result in zip(todo, results, strict=True):
                known[key] = result.text
                if self._cache_size:
                    self._remember(self._texts, key, result.text)
        return [known[k] if t else t for k, t in zip(keys, texts, strict=True)]
