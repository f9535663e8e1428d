"""The feedback record: one answer joined with what its users said about it, typed.

A :class:`FeedbackRecord` is what the store returns for a line's window
(:func:`feedback.signals.pull_records`) and what cleaning, dedup and the
signal → example rules (:mod:`feedback.examples`) work on; scrubbing returns the
same record with its texts scrubbed and :attr:`FeedbackRecord.pii` set. Plain
dicts appear only at the edges that need them: the scrubber and dedup (which
read any mapping by field name) and the staging files of a partitioned run
(:meth:`FeedbackRecord.as_dict` and :meth:`FeedbackRecord.from_dict`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from feedback.events import Signal

Message = dict[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedbackNote:
    """One feedback event about an answer, as a record keeps it: ids, type and payload; an
    edit's text is lifted to :attr:`FeedbackRecord.edit`."""

    id: int
    type: str
    outcome: str | None = None
    rank: int | None = None
    replaced_by: str | None = None
    user_id: str | None = None
    created_at: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeedbackNote:
        """A note from its plain form (:meth:`as_dict`); missing payload fields are None."""
        return cls(
            id=int(data["id"]),
            type=str(data["type"]),
            outcome=data.get("outcome"),
            rank=data.get("rank"),
            replaced_by=data.get("replaced_by"),
            user_id=data.get("user_id"),
            created_at=data.get("created_at"),
        )

    def as_dict(self) -> dict[str, Any]:
        """The plain form, keys in the order the store's records always had."""
        return {
            "id": self.id,
            "type": self.type,
            "outcome": self.outcome,
            "rank": self.rank,
            "replaced_by": self.replaced_by,
            "user_id": self.user_id,
            "created_at": self.created_at,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedbackRecord:
    """One interaction and every feedback event about it (the unit of cleaning and datasets).

    ``created_at`` is ISO-8601 in UTC (``...Z``); ``edit`` is the newest edited text (a
    user's edit or, with ``edit_by_reviewer``, a reviewer's correction); ``signal`` the
    record's main signal (:func:`feedback.signals.primary_signal`). ``pii`` is None until the
    record is scrubbed, then the mentions scrubbing replaced, by entity type.
    """

    request_id: str
    business_line: str
    base_model: str
    messages: tuple[Message, ...]
    response: str
    prompt_hash: str
    created_at: str
    session_id: str | None = None
    user_id: str | None = None
    key_name: str | None = None
    adapter_name: str | None = None
    adapter_version: int | None = None
    status: str = "ok"
    source: str | None = None
    feedback: tuple[FeedbackNote, ...] = ()
    edit: str | None = None
    edit_by_reviewer: bool = False
    signal: Signal = Signal.NONE
    pii: Mapping[str, int] | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeedbackRecord:
        """A record from its plain form (:meth:`as_dict`, a staged line, a test's fixture);
        keys it does not know (an interaction event's ``type``, ``arm``, ...) are left out."""
        pii = data.get("pii")
        return cls(
            request_id=str(data["request_id"]),
            business_line=str(data["business_line"]),
            base_model=str(data.get("base_model") or ""),
            messages=tuple(dict(m) for m in data["messages"]),
            response=str(data["response"]),
            prompt_hash=str(data.get("prompt_hash") or ""),
            created_at=str(data["created_at"]),
            session_id=data.get("session_id"),
            user_id=data.get("user_id"),
            key_name=data.get("key_name"),
            adapter_name=data.get("adapter_name"),
            adapter_version=data.get("adapter_version"),
            status=str(data.get("status") or "ok"),
            source=data.get("source"),
            feedback=tuple(FeedbackNote.from_dict(e) for e in data.get("feedback") or ()),
            edit=data.get("edit"),
            edit_by_reviewer=bool(data.get("edit_by_reviewer")),
            signal=Signal(data.get("signal") or Signal.NONE),
            pii=None if pii is None else dict(pii),
        )

    def as_dict(self) -> dict[str, Any]:
        """The plain form the store's records always had (``pii`` only once scrubbed)."""
        plain: dict[str, Any] = {
            "request_id": self.request_id,
            "session_id": self.session_id,
            "user_id": self.user_id,
            "key_name": self.key_name,
            "business_line": self.business_line,
            "adapter_name": self.adapter_name,
            "adapter_version": self.adapter_version,
            "base_model": self.base_model,
            "messages": [dict(m) for m in self.messages],
            "response": self.response,
            "prompt_hash": self.prompt_hash,
            "status": self.status,
            "source": self.source,
            "created_at": self.created_at,
            "feedback": [note.as_dict() for note in self.feedback],
            "edit": self.edit,
            "signal": self.signal.value,
        }
        if self.edit_by_reviewer:
            plain["edit_by_reviewer"] = True
        if self.pii is not None:
            plain["pii"] = dict(self.pii)
        return plain

    def scrubbed(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        response: str,
        edit: str | None,
        pii: Mapping[str, int],
    ) -> FeedbackRecord:
        """The record with its texts as scrubbing left them and what it replaced."""
        return replace(
            self,
            messages=tuple({str(k): str(v) for k, v in m.items()} for m in messages),
            response=response,
            edit=edit,
            pii=dict(pii),
        )

    def with_response(self, response: str) -> FeedbackRecord:
        """The same prompt with another answer (a sampled candidate to score)."""
        return replace(self, response=response)

    @property
    def last_user_text(self) -> str:
        """The newest user message of the prompt."""
        return last_user_text(self.messages)


def message_text(content: Any) -> str:
    """A message's text: its string, or the text parts of an OpenAI content list joined by
    new lines ('' for anything else)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = (part.get("text") for part in content if isinstance(part, dict))
        return "\n".join(text for text in texts if isinstance(text, str))
    return ""


def last_user_text(messages: Any) -> str:
    """The text of a conversation's newest user message ('' without one, or for a value that
    is not a list of messages)."""
    for message in reversed(messages if isinstance(messages, list | tuple) else ()):
        if isinstance(message, Mapping) and message.get("role") == "user":
            return message_text(message.get("content"))
    return ""
