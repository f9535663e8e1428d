"""A user's edit shown against the answer it replaced: a word-level diff (difflib).

Latin text is compared word by word (whitespace kept as its own token so the
result reads back exactly); Chinese, Japanese and Korean characters are compared
one by one, since those scripts put no spaces between words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Literal

_TOKEN = re.compile(
    r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"
    r"|\s+"
    r"|[^\W\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"
    r"|[^\w\s]"
)


@dataclass(frozen=True, slots=True)
class DiffSegment:
    """A run of text kept, removed from the original, or added by the edit."""

    op: Literal["same", "removed", "added"]
    text: str


def tokens(text: str) -> list[str]:
    """Words, whitespace runs, punctuation marks and single CJK characters, in order."""
    return _TOKEN.findall(text)


def edit_diff(original: str, edited: str) -> list[DiffSegment]:
    """Segments that turn ``original`` into ``edited`` (pure; adjacent runs merged)."""
    before, after = tokens(original), tokens(edited)
    matcher = SequenceMatcher(a=before, b=after, autojunk=False)
    segments: list[DiffSegment] = []

    def add(op: Literal["same", "removed", "added"], parts: list[str]) -> None:
        text = "".join(parts)
        if not text:
            return
        if segments and segments[-1].op == op:
            segments[-1] = DiffSegment(op, segments[-1].text + text)
        else:
            segments.append(DiffSegment(op, text))

    for tag, a1, a2, b1, b2 in matcher.get_opcodes():
        if tag == "equal":
            add("same", before[a1:a2])
        else:
            add("removed", before[a1:a2])
            add("added", after[b1:b2])
    return segments


def similarity(original: str, edited: str) -> float:
    """How much of the answer the edit kept, 0 to 1 (difflib's ratio over tokens)."""
    return SequenceMatcher(a=tokens(original), b=tokens(edited), autojunk=False).ratio()


def side_by_side(original: str, edited: str) -> tuple[list[DiffSegment], list[DiffSegment]]:
    """The diff as two columns: the original with what the edit removed marked, and the
    edit with what it added marked (each column reads back as its own text)."""
    segments = edit_diff(original, edited)
    before = [s for s in segments if s.op != "added"]
    after = [s for s in segments if s.op != "removed"]
    return before, after
