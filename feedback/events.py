"""The event model: what an interaction and a feedback event look like on the way in.

These pydantic models are the documented JSONL format (see ``docs/events.md``)
and the gateway's request bodies. :func:`validate_event` turns one raw mapping
into a typed event or an :class:`InvalidEventError` that names the record and the
field, so bad input is refused with a reason instead of half-stored.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from typing_extensions import TypedDict

from flywheel import lines

IDENTIFIER = r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,127}$"
# What a business line may be called (the rule and its reasons: flywheel.lines).
BUSINESS_LINE = lines.BUSINESS_LINE
# An API key's name, as the key file gives it (gateway.keys.ApiKey.name).
KEY_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
INTERACTION_TYPE = "interaction"
IDENTIFIER_RE = re.compile(IDENTIFIER)


class FeedbackType(StrEnum):
    """The kinds of feedback a user (or a downstream system) gives about an answer."""

    THUMBS_UP = "thumbs_up"
    THUMBS_DOWN = "thumbs_down"
    REGENERATE = "regenerate"
    EDIT = "edit"
    ABANDON = "abandon"
    TASK_OUTCOME = "task_outcome"
    RANK = "rank"
    REVIEW = "review"


FEEDBACK_TYPES: tuple[str, ...] = tuple(t.value for t in FeedbackType)
EVENT_TYPES: tuple[str, ...] = (INTERACTION_TYPE, *FEEDBACK_TYPES)
# The six user signals every report shows; `rank` is a labeller preference (OASST) and
# `review` a reviewer's spot check on the feedback page (dashboard.review_queue).
SIGNAL_TYPES: tuple[str, ...] = tuple(
    t.value for t in FeedbackType if t not in (FeedbackType.RANK, FeedbackType.REVIEW)
)


class Arm(StrEnum):
    """Which side of the routing split served a request (the spec's ``user_group``)."""

    CHAMPION = "champion"
    CANARY = "canary"
    BASE = "base"
    # The two arms of an A/B experiment (registry.experiments).
    EXPERIMENT_A = "experiment_a"
    EXPERIMENT_B = "experiment_b"


class InteractionStatus(StrEnum):
    """How a request ended."""

    OK = "ok"
    ERROR = "error"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"


class TaskOutcome(StrEnum):
    """A late downstream result (ticket solved, code passed tests, ...)."""

    SUCCESS = "success"
    FAILURE = "failure"


class ReviewVerdict(StrEnum):
    """A reviewer's verdict on one answer (a ``review`` event's ``outcome``)."""

    PASS = "pass"  # noqa: S105 (a verdict, not a password)
    FAIL = "fail"


# What a review event carries in its metadata besides the verdict.
REVIEW_REASON = "reason"
REVIEWER = "reviewer"


class Signal(StrEnum):
    """The one vocabulary of what users said about an answer, strongest first (the order
    :data:`SIGNAL_PRIORITY` names a record's main signal by).

    Feedback event types map onto it one to one, except ``task_outcome``, which splits by
    its result (:class:`TaskOutcome`) into ``task_success`` and ``task_failure``; ``none``
    names a record without any. Every list of signals is a group derived below, never a
    list kept by hand.
    """

    EDIT = "edit"
    THUMBS_DOWN = "thumbs_down"
    THUMBS_UP = "thumbs_up"
    REGENERATE = "regenerate"
    ABANDON = "abandon"
    TASK_FAILURE = "task_failure"
    TASK_SUCCESS = "task_success"
    RANK = "rank"
    NONE = "none"

    @property
    def weight(self) -> float:
        """How much the signal says about what the user wanted (the seed's ranking: edits and
        task outcomes strong, thumbs strong, regenerate medium, abandon weak)."""
        return _WEIGHTS[self]

    @property
    def event_type(self) -> str:
        """The feedback event type that carries this signal."""
        return "task_outcome" if self.value.startswith("task_") else self.value

    @property
    def outcome(self) -> TaskOutcome | None:
        """The task outcome a ``task_*`` signal stands for; None for every other signal."""
        if not self.value.startswith("task_"):
            return None
        return TaskOutcome(self.value.removeprefix("task_"))


_WEIGHTS = {
    Signal.EDIT: 1.0,
    Signal.THUMBS_DOWN: 1.0,
    Signal.THUMBS_UP: 1.0,
    Signal.REGENERATE: 0.5,
    Signal.ABANDON: 0.25,
    Signal.TASK_FAILURE: 1.0,
    Signal.TASK_SUCCESS: 1.0,
    Signal.RANK: 1.0,
    Signal.NONE: 0.0,
}


def signals_of_type(kind: FeedbackType) -> tuple[Signal, ...]:
    """The signals one feedback event type carries (a task outcome's, success first)."""
    if kind is FeedbackType.TASK_OUTCOME:
        return tuple(Signal(f"task_{outcome.value}") for outcome in TaskOutcome)
    return (Signal(kind.value),)


SIGNAL_PRIORITY: tuple[Signal, ...] = tuple(Signal)
# The signals users give, in the order reports show them (their event types' order).
USER_SIGNALS: tuple[Signal, ...] = tuple(
    signal
    for kind in FeedbackType
    if kind.value in SIGNAL_TYPES
    for signal in signals_of_type(kind)
)
POSITIVE_SIGNALS: frozenset[Signal] = frozenset({Signal.THUMBS_UP, Signal.TASK_SUCCESS})
# Every other user signal says the answer fell short: what the canary counts per request on
# each arm (higher is worse), besides errors, and what a satisfied request has none of.
ONLINE_SIGNALS: tuple[Signal, ...] = tuple(s for s in USER_SIGNALS if s not in POSITIVE_SIGNALS)
# Those that label an answer bad on their own; an edit brings the better answer instead.
NEGATIVE_SIGNALS: frozenset[Signal] = frozenset(ONLINE_SIGNALS) - {Signal.EDIT}
# Feedback event types whose text is an edited answer: a user's edit, a reviewer's correction.
EDIT_TYPES: tuple[str, ...] = (FeedbackType.EDIT.value, FeedbackType.REVIEW.value)


def _utc(value: datetime) -> datetime:
    """Naive timestamps are taken as UTC; aware ones are converted to UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


class ChatMessage(TypedDict):
    """One message of the prompt, in the OpenAI chat format (kept as a plain dict)."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    role: Literal["system", "user", "assistant", "tool"]
    content: str


def stored_identity(value: object) -> str | None:
    """A user or session id as the store keeps it: as given when it is an identifier, else
    ``h-`` and 40 hex characters of its SHA-256 (ids with spaces or Chinese characters are
    hashed, never refused). The gateway stores ids so and ``flywheel forget`` finds them so."""
    if value is None or value == "":
        return None
    text = str(value)
    if IDENTIFIER_RE.fullmatch(text):
        return text
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:40]


def prompt_hash(messages: list[ChatMessage] | list[dict[str, Any]]) -> str:
    """A stable hash of a prompt (roles and contents), for logging and regenerate detection."""
    canonical = [(m["role"], m["content"]) for m in messages]
    return hashlib.sha256(orjson.dumps(canonical)).hexdigest()


class _EventBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_max_length=10_000_000)

    created_at: datetime
    metadata: dict[str, Any] | None = None

    @field_validator("created_at")
    @classmethod
    def _to_utc(cls, value: datetime) -> datetime:
        return _utc(value)


class InteractionEvent(_EventBase):
    """A request and its answer, as logged by the gateway or imported."""

    type: Literal["interaction"] = INTERACTION_TYPE
    request_id: str = Field(pattern=IDENTIFIER)
    session_id: str | None = Field(default=None, pattern=IDENTIFIER)
    user_id: str | None = Field(default=None, pattern=IDENTIFIER)
    # The API key's name (never its secret) a gateway request came with.
    key_name: str | None = Field(default=None, pattern=KEY_NAME)
    business_line: str = Field(pattern=BUSINESS_LINE)
    adapter_name: str | None = Field(default=None, pattern=IDENTIFIER)
    adapter_version: int | None = Field(default=None, ge=0)
    base_model: str = Field(min_length=1, max_length=256)
    arm: Arm | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    response: str
    prompt_hash: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    latency_ms: float | None = Field(default=None, ge=0)
    ttft_ms: float | None = Field(default=None, ge=0)
    status: InteractionStatus = InteractionStatus.OK
    source: str | None = Field(default=None, max_length=32)

    @model_validator(mode="after")
    def _fill_prompt_hash(self) -> InteractionEvent:
        expected = prompt_hash(self.messages)
        if self.prompt_hash is None:
            object.__setattr__(self, "prompt_hash", expected)
        elif self.prompt_hash != expected:
            raise ValueError("prompt_hash does not match the messages")
        return self


class FeedbackEventIn(_EventBase):
    """A feedback signal about one interaction, named by its request id."""

    type: FeedbackType
    request_id: str = Field(pattern=IDENTIFIER)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    user_id: str | None = Field(default=None, pattern=IDENTIFIER)
    edited_text: str | None = None
    outcome: TaskOutcome | ReviewVerdict | None = None
    rank: int | None = Field(default=None, ge=0, le=1_000)
    replaced_by: str | None = Field(default=None, pattern=IDENTIFIER)

    @model_validator(mode="after")
    def _payload_matches_type(self) -> FeedbackEventIn:
        if self.type is FeedbackType.REVIEW:
            return self._review_payload()
        if self.type is FeedbackType.EDIT and not self.edited_text:
            raise ValueError("an edit needs 'edited_text'")
        if self.type is not FeedbackType.EDIT and self.edited_text is not None:
            raise ValueError(
                f"'edited_text' is only for edit events (and reviews), not {self.type.value}"
            )
        if isinstance(self.outcome, ReviewVerdict):
            raise ValueError(f"outcome {self.outcome.value!r} is a review verdict")
        if self.type is FeedbackType.TASK_OUTCOME and self.outcome is None:
            raise ValueError("a task_outcome needs 'outcome' (success or failure)")
        if self.type is FeedbackType.RANK and self.rank is None:
            raise ValueError("a rank event needs 'rank' (0 is best)")
        return self

    def _review_payload(self) -> FeedbackEventIn:
        """A review: a verdict, the rubric reason and the reviewer's key name in the
        metadata, and optionally the answer as the reviewer corrected it (``edited_text``)."""
        meta = self.metadata or {}
        if not isinstance(self.outcome, ReviewVerdict):
            raise ValueError(
                "a review needs 'outcome' pass or fail, and 'metadata' with its 'reason' and "
                "'reviewer' (reviews come from the feedback page's review queue)"
            )
        for name in (REVIEW_REASON, REVIEWER):
            value = meta.get(name)
            if not isinstance(value, str) or not value.strip() or len(value) > 200:
                raise ValueError(
                    f"a review needs metadata.{name}: text of 1-200 characters (reviews "
                    "come from the feedback page's review queue)"
                )
        if self.edited_text is not None and not self.edited_text.strip():
            raise ValueError("a review's corrected answer ('edited_text') is empty")
        return self

    @property
    def review_reason(self) -> str | None:
        """A review's rubric reason (None for any other event)."""
        if self.type is not FeedbackType.REVIEW or self.metadata is None:
            return None
        return str(self.metadata[REVIEW_REASON])

    def key(self) -> str:
        """The idempotency key: the given one, or a hash of the event's content."""
        if self.idempotency_key:
            return self.idempotency_key
        body = self.model_dump(mode="json", exclude={"idempotency_key"})
        digest = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
        return f"sha256:{digest}"


Event = InteractionEvent | FeedbackEventIn

_interaction_adapter = TypeAdapter(InteractionEvent)
_feedback_adapter = TypeAdapter(FeedbackEventIn)


class InvalidEventError(ValueError):
    """A record that cannot be stored, naming the record, the field and the reason."""

    def __init__(self, reason: str, *, field: str | None = None, record_key: str | None = None):
        self.reason = reason
        self.field = field
        self.record_key = record_key
        where = f"field '{field}': " if field else ""
        who = f"record {record_key}: " if record_key else ""
        super().__init__(f"{who}{where}{reason}")


def record_key_of(data: Any) -> str | None:
    """A human handle on a raw record: its request id and type when it has them."""
    if not isinstance(data, dict):
        return None
    parts = []
    for name in ("type", "request_id", "idempotency_key"):
        value = data.get(name)
        if isinstance(value, str | int):
            parts.append(f"{name}={str(value)[:80]}")
    return " ".join(parts) or None


def _describe_errors(exc: ValidationError) -> tuple[str, str]:
    """The first failing field, and a reason that also names up to three more."""
    errors = exc.errors(include_url=False)

    def loc(error: Any) -> str:
        return ".".join(str(p) for p in error["loc"]) or "(record)"

    def msg(error: Any) -> str:
        return str(error["msg"]).removeprefix("Value error, ")

    reason = msg(errors[0])
    others = [f"{loc(e)} ({msg(e)})" for e in errors[1:4]]
    if others:
        more = f" and {len(errors) - 4} more" if len(errors) > 4 else ""
        reason += f"; also {', '.join(others)}{more}"
    return loc(errors[0]), reason


def validate_event(data: Any, *, max_text_chars: int = 200_000, max_messages: int = 512) -> Event:
    """Validate one raw mapping into an event, or raise :class:`InvalidEventError`."""
    key = record_key_of(data)
    if not isinstance(data, dict):
        raise InvalidEventError(
            f"expected a JSON object, got {type(data).__name__}", record_key=key
        )
    kind = data.get("type")
    if kind is None:
        raise InvalidEventError("missing event type", field="type", record_key=key)
    if kind not in EVENT_TYPES:
        raise InvalidEventError(
            f"unknown event type {kind!r} (expected one of: {', '.join(EVENT_TYPES)})",
            field="type",
            record_key=key,
        )
    _check_texts(data, key, max_text_chars=max_text_chars, max_messages=max_messages)
    adapter = _interaction_adapter if kind == INTERACTION_TYPE else _feedback_adapter
    try:
        return adapter.validate_python(data)  # type: ignore[no-any-return]
    except ValidationError as exc:
        field, reason = _describe_errors(exc)
        raise InvalidEventError(reason, field=field, record_key=key) from None


def _check_texts(
    data: dict[str, Any], key: str | None, *, max_text_chars: int, max_messages: int
) -> None:
    """Size limits and NUL characters, checked on the raw record before parsing."""
    for name in ("response", "edited_text"):
        value = data.get(name)
        if isinstance(value, str):
            _check_text(value, name, key, max_text_chars)
    messages = data.get("messages")
    if isinstance(messages, list):
        if len(messages) > max_messages:
            raise InvalidEventError(
                f"{len(messages)} messages, over the {max_messages} limit",
                field="messages",
                record_key=key,
            )
        total = 0
        for index, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                total += len(content)
                _check_text(
                    content, f"messages.{index}.content", key, max_text_chars - total + len(content)
                )


def check_prompt(messages: list[dict[str, str]], *, max_text_chars: int, max_messages: int) -> None:
    """The store's limits on a prompt (message count, length, NUL characters), for a caller
    that must refuse up front what the store would quarantine; InvalidEventError names the
    field."""
    _check_texts(
        {"messages": messages}, None, max_text_chars=max_text_chars, max_messages=max_messages
    )


def _check_text(value: str, field: str, key: str | None, limit: int) -> None:
    if len(value) > limit:
        what = (
            "the prompt is" if field.startswith("messages") else f"text is {len(value)} characters,"
        )
        raise InvalidEventError(
            f"{what} over the {limit} character limit", field=field, record_key=key
        )
    if "\x00" in value:
        raise InvalidEventError("contains a NUL character", field=field, record_key=key)
