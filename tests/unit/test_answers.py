"""Refusals and output length, read from the answer alone."""

from __future__ import annotations

import pytest

from feedback.answers import is_refusal, output_tokens, time_per_output_token_ms


@pytest.mark.parametrize(
    "text",
    [
        "I'm sorry, but I can't help with that.",
        "I cannot provide medical diagnoses. Please see a doctor.",
        "As an AI language model, I cannot give legal advice.",
        "I won't do that.",
        "Unfortunately, I am unable to assist with this request.",
        "Thanks for asking. I'm not able to share account details.",
        "抱歉，我无法提供这方面的信息。",
        "作为一个AI，我不能回答这个问题。",
    ],
)
def test_refusals_are_recognised(text: str) -> None:
    assert is_refusal(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Sure! Here are two steps: 1. Call the bank. 2. Freeze the card.",
        "I'm sorry for the trouble. Your refund is on its way.",
        "You can't return opened items, but I can help you with an exchange.",
        "The dose is on the label. I can't stress enough: see a doctor if it persists.",
        "I can't wait to help you!",
        "我们可以为您办理退款。",
        # Helps first; a limit mentioned past the opening is not a refusal.
        "Here is how to file the claim: "
        + "fill in the form and attach receipts. " * 8
        + "I cannot file it for you.",
    ],
)
def test_answers_that_help_are_not_refusals(text: str) -> None:
    assert not is_refusal(text)


def test_output_tokens_prefer_the_servers_usage() -> None:
    assert output_tokens({"completion_tokens": 7, "prompt_tokens": 30}, "x" * 400) == 7
    assert output_tokens(None, "x" * 40) == 10
    assert output_tokens({"completion_tokens": "7"}, "abc") == 1
    assert output_tokens(None, "") == 0


def test_time_per_output_token() -> None:
    assert time_per_output_token_ms(1100.0, 100.0, 11) == pytest.approx(100.0)
    assert time_per_output_token_ms(1100.0, 100.0, 1) is None
    assert time_per_output_token_ms(None, 100.0, 11) is None
