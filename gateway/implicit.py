"""Signals users give without a button: a rephrased question, a follow-up that complains (pure).

Most users never press thumbs; many do show they were not helped. Within one
session of one line, a request right after another:

- that **asks the same thing in other words** (most of its words are the last
  question's, yet it is not the same prompt: that one is a regenerate already)
  means the last answer did not help: a ``regenerate`` of it, marked inferred;
- whose new message **complains** about the answer ("that's wrong", "not what I
  asked", "不对", "答非所问") is a ``thumbs_down`` of it, marked inferred.

Both are conservative: short messages and mere topic overlap are not rephrases,
and a complaint must be the user's newest message in a conversation that holds
the answer it complains about.
"""

from __future__ import annotations

import re
from typing import Any

from feedback.records import last_user_text

REPHRASE = "rephrase"
COMPLAINT = "complaint"
# Share of the two questions' words they have in common (Jaccard), and the fewest words.
REPHRASE_OVERLAP = 0.6
REPHRASE_MIN_WORDS = 4

_COMPLAINTS = re.compile(
    r"\b(?:that(?:'s| is) (?:wrong|not (?:right|true|correct|helpful|what i (?:asked|meant)))"
    r"|(?:this|that|it) (?:does(?:n't| not)|did(?:n't| not)) (?:help|answer|work)"
    r"|not what i (?:asked|meant|wanted)|you did(?:n't| not) answer|wrong answer"
    r"|(?:useless|unhelpful) answer|that(?:'s| is) useless|makes no sense)\b"
    r"|不对|错了|没用|答非所问|不是我问的|没有帮助|没帮助|看不懂",
    re.IGNORECASE,
)
_WORD = re.compile(r"[\w']+")
_HAN = re.compile(r"([\u4e00-\u9fff])")


def answered_before(messages: Any) -> bool:
    """Whether the conversation holds an assistant answer before its newest user message."""
    roles = [m.get("role") for m in messages or () if isinstance(m, dict)]
    if "user" not in roles:
        return False
    newest_user = len(roles) - 1 - roles[::-1].index("user")
    return "assistant" in roles[:newest_user]


def words(text: str) -> set[str]:
    """The lower-cased words of a text (each Han character a word)."""
    return {w.lower() for w in _WORD.findall(_HAN.sub(r" \1 ", text))}


def is_rephrase(question: str, earlier: str) -> bool:
    """Whether ``question`` asks ``earlier`` again in other words."""
    new, old = words(question), words(earlier)
    if min(len(new), len(old)) < REPHRASE_MIN_WORDS or new == old:
        return False
    return len(new & old) / len(new | old) >= REPHRASE_OVERLAP


def is_complaint(text: str) -> bool:
    """Whether a follow-up message complains about the answer it follows."""
    return _COMPLAINTS.search(text) is not None


def implicit_signal(messages: Any, earlier_question: str) -> str | None:
    """What a request says about the answer before it in its session: :data:`COMPLAINT`,
    :data:`REPHRASE`, or None."""
    question = last_user_text(messages)
    if answered_before(messages) and is_complaint(question):
        return COMPLAINT
    if is_rephrase(question, earlier_question):
        return REPHRASE
    return None
