"""Implicit signals: rephrased questions and complaining follow-ups (gateway.implicit)."""

from __future__ import annotations

import pytest

from gateway.implicit import (
    COMPLAINT,
    REPHRASE,
    answered_before,
    implicit_signal,
    is_complaint,
    is_rephrase,
)


@pytest.mark.parametrize(
    ("question", "earlier", "expected"),
    [
        (
            "how can I return the damaged blender I bought",
            "How do I return a damaged blender I bought?",
            True,
        ),
        ("我的快递三天了还没有到怎么办呢", "快递三天了还没有到怎么办", True),
        ("What is the refund policy for shoes?", "How do I reset my password on the app?", False),
        ("return blender", "return the blender", False),  # too short to tell
        ("How do I return a damaged blender?", "How do I return a damaged blender?", False),
    ],
)
def test_rephrases(question: str, earlier: str, expected: bool) -> None:
    assert is_rephrase(question, earlier) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("That's wrong, the order number was different.", True),
        ("this didn't help at all", True),
        ("Not what I asked.", True),
        ("不对，我问的是退款", True),
        ("你这是答非所问", True),
        ("Thanks, that worked!", False),
        ("What is wrong with my order?", False),
        ("Is that right?", False),
    ],
)
def test_complaints(text: str, expected: bool) -> None:
    assert is_complaint(text) is expected


def test_a_complaint_needs_the_answer_it_complains_about() -> None:
    follow_up = [
        {"role": "user", "content": "Where is my parcel?"},
        {"role": "assistant", "content": "It is on its way."},
        {"role": "user", "content": "That's wrong, it was delivered to the wrong house."},
    ]
    assert answered_before(follow_up)
    assert implicit_signal(follow_up, "Where is my parcel?") == COMPLAINT
    alone = [{"role": "user", "content": "That's wrong, it was delivered to the wrong house."}]
    assert not answered_before(alone)
    assert implicit_signal(alone, "Where is my parcel?") is None
    again = [{"role": "user", "content": "where is the parcel I ordered last week now"}]
    assert implicit_signal(again, "Where is my parcel I ordered last week?") == REPHRASE


def test_the_newest_user_text_of_any_conversation_shape() -> None:
    from feedback.records import last_user_text

    parts = [
        {"type": "text", "text": "Where is"},
        {"type": "image_url"},
        {"type": "text", "text": "my parcel?"},
    ]
    assert last_user_text(
        [{"role": "user", "content": "old"}, {"role": "user", "content": parts}]
    ) == ("Where is\nmy parcel?")
    assert (
        last_user_text([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
        == "hi"
    )
    assert last_user_text([{"role": "system", "content": "be kind"}]) == ""
    assert last_user_text("not a conversation") == ""
    assert last_user_text([{"role": "user", "content": 7}, "junk"]) == ""
