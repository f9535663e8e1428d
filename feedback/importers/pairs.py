"""Preference pairs from a file (HH-RLHF or trl rows) as flywheel feedback.

A data scientist's own pairs enter the store the way labelled feedback does:
each pair becomes two interactions that answer the same prompt, the chosen one
ranked 0 and the rejected one ranked 1, so the ``rank`` rule of
:mod:`feedback.examples` turns them into a DPO pair with lineage, and the
usual cleaning (PII scrubbing, dedup, per-user caps, the time split) applies.

Two row formats, one JSON object a line, ``.jsonl`` or ``.jsonl.gz``:

- ``hh``: Anthropic HH-RLHF, ``{"chosen": "\\n\\nHuman: ...\\n\\nAssistant: ...",
  "rejected": "..."}``: two transcripts that must agree up to the last
  assistant turn (:func:`feedback.importers.hh_rlhf.pair_from_row`).
- ``trl``: ``{"prompt", "chosen", "rejected"}``, each a string or a
  conversational list of ``{"role", "content"}`` messages (trl's standard
  and conversational preference formats); chosen and rejected are one
  assistant answer each.

Ids are content hashes (business line, prompt, both answers), so importing
a file again stores nothing new; a row that is not a usable pair comes back as a
:class:`~feedback.jsonl.MalformedLine` with its line number and the reason,
for the quarantine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, get_args

import orjson

from feedback.events import prompt_hash
from feedback.importers.hh_rlhf import MalformedPair, PreferencePair, pair_from_row
from feedback.jsonl import JsonlItem, JsonlRecord, MalformedLine, iter_jsonl

PairFormat = Literal["hh", "trl"]
PAIR_FORMATS: tuple[str, ...] = get_args(PairFormat)
SOURCE = "pairs"
IMPORTED_MODEL = "imported-pairs"
PROMPT_ROLES = frozenset({"system", "user", "assistant", "tool"})


def iter_pairs_file(path: Path) -> Iterator[JsonlItem]:
    """The lines of a ``.jsonl`` or ``.jsonl.gz`` file, parsed (bad lines as malformed), read
    within bounds (:func:`feedback.jsonl.iter_jsonl`)."""
    yield from iter_jsonl(path)


def pair_from_hh(row: dict[str, Any], line_number: int) -> PreferencePair:
    """One HH-RLHF row as a pair; ``ValueError`` says why it is not one."""
    result = pair_from_row(row, line_number)
    if isinstance(result, MalformedPair):
        raise ValueError(f"HH-RLHF row: {result.reason}")
    _check_answers(result.chosen, result.rejected)
    return result


def pair_from_trl(row: dict[str, Any], line_number: int) -> PreferencePair:
    """One trl preference row as a pair; ``ValueError`` says why it is not one."""
    missing = [key for key in ("prompt", "chosen", "rejected") if key not in row]
    if missing:
        raise ValueError(f"trl row: missing {', '.join(repr(k) for k in missing)}")
    prompt = _prompt(row["prompt"])
    chosen, rejected = _answer(row["chosen"], "chosen"), _answer(row["rejected"], "rejected")
    _check_answers(chosen, rejected)
    return PreferencePair(prompt, chosen, rejected, line_number)


def row_format(row: dict[str, Any], pair_format: PairFormat | None = None) -> PairFormat:
    """The format a row is read in: the given one, else trl for a row with a ``prompt``."""
    if pair_format is not None:
        return pair_format
    return "trl" if "prompt" in row else "hh"


def parse_pair(
    row: dict[str, Any], line_number: int, pair_format: PairFormat | None = None
) -> PreferencePair:
    """One row as a pair (see :func:`row_format`); ``ValueError`` says why it is not one."""
    if row_format(row, pair_format) == "trl":
        return pair_from_trl(row, line_number)
    return pair_from_hh(row, line_number)


def read_pairs(
    items: Iterable[JsonlItem], pair_format: PairFormat | None = None
) -> Iterator[tuple[JsonlRecord, PreferencePair] | MalformedLine]:
    """Each line as (its record, the pair), or malformed with the reason."""
    for item in items:
        if isinstance(item, MalformedLine):
            yield item
            continue
        try:
            yield item, parse_pair(item.data, item.line_number, pair_format)
        except ValueError as exc:
            yield MalformedLine(item.line_number, str(exc), item.raw)


def pair_key(pair: PreferencePair, business_line: str) -> str:
    """A content hash naming one pair of one line: the same pair gets the same ids."""
    body = [business_line, list(pair.prompt), pair.chosen, pair.rejected]
    return hashlib.sha256(orjson.dumps(body)).hexdigest()[:32]


def pair_events(
    pair: PreferencePair,
    *,
    business_line: str,
    source_file: str,
    pair_format: PairFormat,
    imported_at: datetime,
) -> list[dict[str, Any]]:
    """Two interactions (the chosen and the rejected answer) and their rank events."""
    key = pair_key(pair, business_line)
    messages = list(pair.prompt)
    created_at = imported_at.isoformat().replace("+00:00", "Z")
    events: list[dict[str, Any]] = []
    for rank, (answer, text) in enumerate((("chosen", pair.chosen), ("rejected", pair.rejected))):
        request_id = f"pairs-{key}-{answer}"
        events.append(
            {
                "type": "interaction",
                "request_id": request_id,
                "session_id": f"pairs-{key}",
                "business_line": business_line,
                "base_model": IMPORTED_MODEL,
                "messages": messages,
                "response": text,
                "prompt_hash": prompt_hash(messages),
                "status": "ok",
                "source": SOURCE,
                "created_at": created_at,
                "metadata": {
                    "source_file": source_file,
                    "source_line": pair.source_row,
                    "format": pair_format,
                    "answer": answer,
                },
            }
        )
        events.append(
            {
                "type": "rank",
                "request_id": request_id,
                "rank": rank,
                "idempotency_key": f"pairs:{key}:{answer}:rank",
                "created_at": created_at,
            }
        )
    return events


def pairs_items(
    items: Iterable[JsonlItem],
    *,
    business_line: str,
    source_file: str,
    imported_at: datetime,
    pair_format: PairFormat | None = None,
) -> Iterator[JsonlRecord | MalformedLine]:
    """Ingest items of a pairs file; each event keeps its line, for the quarantine."""
    for parsed in read_pairs(items, pair_format):
        if isinstance(parsed, MalformedLine):
            yield parsed
            continue
        record, pair = parsed
        for event in pair_events(
            pair,
            business_line=business_line,
            source_file=source_file,
            pair_format=row_format(record.data, pair_format),
            imported_at=imported_at,
        ):
            yield JsonlRecord(record.line_number, event, record.raw)


def _check_answers(chosen: str, rejected: str) -> None:
    if not chosen.strip():
        raise ValueError("the chosen answer is empty")
    if not rejected.strip():
        raise ValueError("the rejected answer is empty")
    if chosen.strip() == rejected.strip():
        raise ValueError("chosen and rejected answers are identical")


def _prompt(value: Any) -> tuple[dict[str, str], ...]:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("trl row: 'prompt' is empty")
        return ({"role": "user", "content": value},)
    if not isinstance(value, list) or not value:
        raise ValueError("trl row: 'prompt' must be a string or a non-empty list of messages")
    messages = tuple(_message(m, f"prompt.{i}") for i, m in enumerate(value))
    if messages[-1]["role"] != "user":
        raise ValueError("trl row: the prompt does not end with a user message")
    return messages


def _answer(value: Any, name: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or len(value) != 1:
        raise ValueError(f"trl row: {name!r} must be a string or a list of one assistant message")
    message = _message(value[0], f"{name}.0")
    if message["role"] != "assistant":
        raise ValueError(f"trl row: {name}.0 has role {message['role']!r}, not 'assistant'")
    return message["content"]


def _message(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError(f"trl row: {where} is not a message object")
    role, content = value.get("role"), value.get("content")
    if role not in PROMPT_ROLES:
        raise ValueError(f"trl row: {where}.role {role!r} is not one of {sorted(PROMPT_ROLES)}")
    if not isinstance(content, str):
        raise ValueError(f"trl row: {where}.content is missing or not a string")
    return {"role": role, "content": content}
