"""The event model: what is accepted, what is refused, and how the refusal reads."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from feedback.events import (
    FeedbackEventIn,
    InteractionEvent,
    InvalidEventError,
    prompt_hash,
    validate_event,
)


def interaction(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "type": "interaction",
        "request_id": "req-1",
        "session_id": "sess-1",
        "user_id": "user-1",
        "business_line": "customer_service",
        "base_model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "user", "content": "Where is my parcel?"}],
        "response": "It ships tomorrow.",
        "created_at": "2026-11-01T10:00:00+02:00",
    }
    base.update(overrides)
    return base


def test_interaction_is_normalised_to_utc_and_hashed() -> None:
    event = validate_event(interaction())
    assert isinstance(event, InteractionEvent)
    assert event.created_at == datetime(2026, 11, 1, 8, tzinfo=UTC)
    assert event.prompt_hash == prompt_hash([{"role": "user", "content": "Where is my parcel?"}])


def test_naive_time_is_taken_as_utc() -> None:
    event = validate_event(interaction(created_at="2026-11-01T10:00:00"))
    assert event.created_at == datetime(2026, 11, 1, 10, tzinfo=UTC)


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        ({"type": "like"}, "type", "unknown event type 'like'"),
        ({"type": None}, "type", "missing event type"),
        ({"business_line": "Customer Service"}, "business_line", "should match pattern"),
        ({"messages": []}, "messages", "at least 1 item"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", "Input should be"),
        ({"response": "a\x00b"}, "response", "NUL"),
        ({"response": "bad \ud800 text"}, "response", "unicode string"),
        ({"latency_ms": -1}, "latency_ms", "greater than or equal to 0"),
        ({"prompt_hash": "0" * 64}, "(record)", "prompt_hash does not match"),
        ({"surprise": 1}, "surprise", "Extra inputs are not permitted"),
        ({"created_at": "yesterday"}, "created_at", "datetime"),
    ],
)
def test_bad_interactions_name_the_field(
    overrides: dict[str, object], field: str, reason: str
) -> None:
    with pytest.raises(InvalidEventError) as caught:
        validate_event(interaction(**overrides))
    assert caught.value.field == field
    assert reason in caught.value.reason
    assert "req-1" in str(caught.value) or overrides.get("type") is None


def test_oversized_text_is_refused_before_parsing() -> None:
    with pytest.raises(InvalidEventError) as caught:
        validate_event(interaction(response="x" * 2_001), max_text_chars=2_000)
    assert caught.value.field == "response"
    assert "over the 2000 character limit" in caught.value.reason


def test_oversized_prompt_names_the_message() -> None:
    messages = [{"role": "user", "content": "y" * 1_500}, {"role": "user", "content": "z" * 600}]
    with pytest.raises(InvalidEventError) as caught:
        validate_event(interaction(messages=messages), max_text_chars=2_000)
    assert caught.value.field == "messages.1.content"


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"type": "edit"}, "an edit needs 'edited_text'"),
        ({"type": "task_outcome"}, "needs 'outcome'"),
        ({"type": "task_outcome", "outcome": "maybe"}, "Input should be 'success' or 'failure'"),
        ({"type": "thumbs_up", "edited_text": "x"}, "only for edit events"),
        ({"type": "rank"}, "needs 'rank'"),
    ],
)
def test_feedback_payload_must_match_its_type(record: dict[str, object], reason: str) -> None:
    data = {"request_id": "req-1", "created_at": "2026-11-02T00:00:00Z", **record}
    with pytest.raises(InvalidEventError) as caught:
        validate_event(data)
    assert reason in caught.value.reason


def test_feedback_key_is_given_or_derived_from_content() -> None:
    data = {"type": "thumbs_up", "request_id": "req-1", "created_at": "2026-11-02T00:00:00Z"}
    first = validate_event(data)
    again = validate_event(dict(data))
    later = validate_event({**data, "created_at": "2026-11-02T00:00:01Z"})
    assert isinstance(first, FeedbackEventIn)
    assert isinstance(again, FeedbackEventIn)
    assert isinstance(later, FeedbackEventIn)
    assert first.key() == again.key() != later.key()
    keyed = validate_event({**data, "idempotency_key": "client-42"})
    assert isinstance(keyed, FeedbackEventIn)
    assert keyed.key() == "client-42"


def test_non_object_is_refused() -> None:
    with pytest.raises(InvalidEventError, match="expected a JSON object, got list"):
        validate_event([1, 2])


def test_every_list_of_signals_is_a_group_of_the_one_enum() -> None:
    from dashboard.filters import SAMPLE_SIGNALS
    from feedback.events import (
        NEGATIVE_SIGNALS,
        ONLINE_SIGNALS,
        POSITIVE_SIGNALS,
        USER_SIGNALS,
        Signal,
    )
    from feedback.rollup import FEEDBACK_SIGNALS
    from lab.simulation.protocol import REACTION_TYPES
    from registry.experiments import FLAGS

    # The order reports show and experiments' tallies store their bits in.
    shown = (
        "thumbs_up", "thumbs_down", "regenerate", "edit", "abandon", "task_success", "task_failure",
    )  # fmt: skip
    assert tuple(s.value for s in USER_SIGNALS) == shown
    assert POSITIVE_SIGNALS.isdisjoint(ONLINE_SIGNALS)
    assert POSITIVE_SIGNALS | set(ONLINE_SIGNALS) == set(USER_SIGNALS)
    assert set(ONLINE_SIGNALS) - {Signal.EDIT} == NEGATIVE_SIGNALS
    assert shown == FEEDBACK_SIGNALS
    assert (*shown, "none") == SAMPLE_SIGNALS
    assert ("none", *shown) == REACTION_TYPES
    assert FLAGS[: len(shown)] == shown
