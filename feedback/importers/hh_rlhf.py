"""Anthropic HH-RLHF rows (``chosen`` / ``rejected`` transcripts) as preference pairs.

Each row holds two whole transcripts (``\\n\\nHuman: ...\\n\\nAssistant: ...``)
that share a conversation and differ in the last assistant turn. A pair is
well-formed when both transcripts have the same text up to their last
``\\n\\nAssistant:``; rows whose prefixes differ are reported with the reason,
never cut into a pair that would teach the wrong thing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from feedback.jsonl import MalformedLine, iter_jsonl

ASSISTANT = "\n\nAssistant:"
TURN = re.compile(r"\n\n(Human|Assistant):")
ROLE_OF = {"Human": "user", "Assistant": "assistant"}


@dataclass(frozen=True, slots=True)
class PreferencePair:
    """A prompt (chat messages) with a preferred and a dispreferred answer."""

    prompt: tuple[dict[str, str], ...]
    chosen: str
    rejected: str
    source_row: int

    def as_row(self) -> dict[str, Any]:
        """trl's conversational preference format."""
        return {
            "prompt": list(self.prompt),
            "chosen": [{"role": "assistant", "content": self.chosen}],
            "rejected": [{"role": "assistant", "content": self.rejected}],
        }


@dataclass(frozen=True, slots=True)
class MalformedPair:
    """A row that is not a usable pair, and why."""

    source_row: int
    reason: str


def transcript_messages(text: str) -> list[dict[str, str]]:
    """Split an HH transcript into chat messages (``Human`` → user, ``Assistant`` → assistant)."""
    parts = TURN.split(text)
    messages = []
    for role, content in zip(parts[1::2], parts[2::2], strict=True):
        messages.append({"role": ROLE_OF[role], "content": content.strip()})
    return messages


def pair_from_row(row: dict[str, Any], index: int) -> PreferencePair | MalformedPair:
    """One row → a pair, or the reason it is not one (pure)."""
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if not isinstance(chosen, str) or not isinstance(rejected, str):
        return MalformedPair(index, "missing 'chosen' or 'rejected' text")
    cut_c, cut_r = chosen.rfind(ASSISTANT), rejected.rfind(ASSISTANT)
    if cut_c < 0 or cut_r < 0:
        return MalformedPair(index, "no assistant turn")
    if chosen[:cut_c] != rejected[:cut_r]:
        return MalformedPair(
            index, "chosen and rejected conversations differ before the last answer"
        )
    prompt = transcript_messages(chosen[:cut_c])
    if not prompt or prompt[-1]["role"] != "user":
        return MalformedPair(index, "the conversation does not end with a human turn")
    answer_c = chosen[cut_c + len(ASSISTANT) :].strip()
    answer_r = rejected[cut_r + len(ASSISTANT) :].strip()
    if answer_c == answer_r:
        return MalformedPair(index, "chosen and rejected answers are identical")
    return PreferencePair(tuple(prompt), answer_c, answer_r, index)


def pairs_from_rows(
    rows: Iterable[dict[str, Any]],
) -> tuple[list[PreferencePair], list[MalformedPair]]:
    """All well-formed pairs, and the rows that were not, with reasons."""
    pairs: list[PreferencePair] = []
    malformed: list[MalformedPair] = []
    for index, row in enumerate(rows):
        result = pair_from_row(row, index)
        (pairs if isinstance(result, PreferencePair) else malformed).append(result)  # type: ignore[arg-type]
    return pairs, malformed


def read_hh_rlhf(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of an HH-RLHF ``.jsonl`` or ``.jsonl.gz`` file, read within bounds; a line that
    is not a JSON object is a ``ValueError`` naming it."""
    for item in iter_jsonl(path):
        if isinstance(item, MalformedLine):
            raise ValueError(item.describe(str(path)))
        yield item.data
