"""A shadow adapter's answers paired with the answers users got: what each pair says.

The gateway stores a shadow's answer under the request id of the interaction it
shadowed (``gateway.shadow``), so every shadow answer pairs with the champion's
answer to the same prompt. :func:`shadow_pairs` reads a line's pairs over a
window and reads each side of a pair for what the shadow comparison
(``registry.shadow``) judges: output length, refusal, high-risk PII, and how far
the two answers are apart. Only the numbers leave this module, never the texts.

PII here means identifiers an answer should not carry (e-mail addresses, phone
numbers, card and IBAN numbers, US social security and Chinese resident ID
numbers), found with the project's own regex recognizers; names and addresses
need the full scrubber's NLP and are left out, so the check is cheap and its
false positives rare. The recognizers import Presidio (seconds), so they are
loaded on first use, never at import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Engine, func, select

from feedback.answers import is_refusal, output_tokens
from feedback.records import last_user_text
from feedback.schema import interactions_table, shadow_outputs_table

DEFAULT_LIMIT = 5_000
_WORD = re.compile(r"[^\W\d_]+|\d+|[\u3400-\u9fff]", re.UNICODE)


@dataclass(frozen=True, slots=True)
class ShadowPair:
    """One shadowed request: the answer the user got (champion) and the shadow's, as numbers."""

    request_id: str
    shadow_ok: bool
    champion_tokens: int
    shadow_tokens: int
    champion_refused: bool
    shadow_refused: bool
    champion_pii: bool
    shadow_pii: bool
    similarity: float


def answer_similarity(first: str, second: str) -> float:
    """Token-set Jaccard similarity of two answers (words, numbers, single CJK characters;
    case-folded): 1 for the same words, 0 for none in common; two empty answers are equal."""
    a = {t.casefold() for t in _WORD.findall(first)}
    b = {t.casefold() for t in _WORD.findall(second)}
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


@cache
def _recognizers() -> tuple[Any, ...]:
    from feedback.pii.recognizers import (
        EmailAddressRecognizer,
        IbanCodeRecognizer,
        PaymentCardRecognizer,
    )
    from feedback.pii.recognizers_en import PhoneNumberRecognizer, SocialSecurityNumberRecognizer
    from feedback.pii.recognizers_zh import ChineseMobileRecognizer, ChineseResidentIdRecognizer

    return (
        EmailAddressRecognizer(),
        PaymentCardRecognizer(),
        IbanCodeRecognizer(),
        PhoneNumberRecognizer(),
        SocialSecurityNumberRecognizer(),
        ChineseMobileRecognizer(),
        ChineseResidentIdRecognizer(),
    )


def has_high_risk_pii(text: str) -> bool:
    """Whether ``text`` carries an e-mail address, phone, card, IBAN, SSN or Chinese resident
    ID number (the regex recognizers of ``feedback.pii``)."""
    if not text:
        return False
    return any(recognizer.analyze(text) for recognizer in _recognizers())


def _tokens(metadata: Mapping[str, Any] | None, text: str) -> int:
    metadata = metadata or {}
    counted = metadata.get("output_tokens")
    if isinstance(counted, int) and counted >= 0:
        return counted
    return output_tokens(metadata.get("usage"), text)


def pair_of(
    request_id: str,
    champion: str,
    champion_metadata: Mapping[str, Any] | None,
    shadow: str,
    shadow_tokens: int | None,
    shadow_status: str,
) -> ShadowPair:
    """What one pair of answers says (a failed shadow answer counts only as an error)."""
    ok = shadow_status == "ok"
    return ShadowPair(
        request_id=request_id,
        shadow_ok=ok,
        champion_tokens=_tokens(champion_metadata, champion),
        shadow_tokens=(shadow_tokens if shadow_tokens is not None else output_tokens(None, shadow))
        if ok
        else 0,
        champion_refused=is_refusal(champion),
        shadow_refused=ok and is_refusal(shadow),
        champion_pii=has_high_risk_pii(champion),
        shadow_pii=ok and has_high_risk_pii(shadow),
        similarity=answer_similarity(champion, shadow) if ok else 0.0,
    )


def shadow_pairs(
    engine: Engine,
    business_line: str,
    adapter: str,
    since: datetime,
    until: datetime,
    *,
    limit: int = DEFAULT_LIMIT,
) -> list[ShadowPair]:
    """The line's requests ``adapter`` answered in shadow between ``since`` and ``until``
    (the newest ``limit``), each paired with the answer the user got."""
    shadow, served = shadow_outputs_table.c, interactions_table.c
    query = (
        select(
            shadow.request_id,
            served.response.label("champion"),
            served.metadata.label("champion_metadata"),
            shadow.response.label("shadow"),
            shadow.output_tokens,
            shadow.status,
        )
        .join_from(
            shadow_outputs_table,
            interactions_table,
            served.request_id == shadow.request_id,
        )
        .where(
            shadow.business_line == business_line,
            shadow.adapter_name == adapter,
            shadow.created_at >= since,
            shadow.created_at < until,
            served.status == "ok",
        )
        .order_by(shadow.created_at.desc())
        .limit(limit)
    )
    with engine.connect() as connection:
        rows: Sequence[Any] = connection.execute(query).all()
    return [
        pair_of(
            row.request_id,
            row.champion or "",
            row.champion_metadata,
            row.shadow or "",
            row.output_tokens,
            row.status,
        )
        for row in rows
    ]


def shadow_counts(
    engine: Engine, business_line: str, adapter: str, since: datetime
) -> tuple[int, int]:
    """(answered, failed) shadow answers of ``adapter`` on the line since ``since``: what a
    page shows between two looks of the canary flow, without reading any text."""
    shadow = shadow_outputs_table.c
    query = (
        select(shadow.status, func.count())
        .where(
            shadow.business_line == business_line,
            shadow.adapter_name == adapter,
            shadow.created_at >= since,
        )
        .group_by(shadow.status)
    )
    with engine.connect() as connection:
        counts = {status: int(n) for status, n in connection.execute(query)}
    return counts.get("ok", 0), sum(n for status, n in counts.items() if status != "ok")


@dataclass(frozen=True, slots=True)
class AnswerPair:
    """One shadowed request's prompt (the last user message) and both answers, as text:
    for a judge that reads them (simulated users, reviewers), never for a page or a log."""

    request_id: str
    prompt: str
    champion: str
    shadow: str


def shadow_answer_pairs(
    engine: Engine,
    business_line: str,
    adapter: str,
    since: datetime,
    until: datetime,
    *,
    limit: int = DEFAULT_LIMIT,
) -> list[AnswerPair]:
    """The texts of the line's answered shadow pairs in the window (newest ``limit``)."""
    shadow, served = shadow_outputs_table.c, interactions_table.c
    query = (
        select(shadow.request_id, served.messages, served.response, shadow.response)
        .join_from(shadow_outputs_table, interactions_table, served.request_id == shadow.request_id)
        .where(
            shadow.business_line == business_line,
            shadow.adapter_name == adapter,
            shadow.created_at >= since,
            shadow.created_at < until,
            shadow.status == "ok",
            served.status == "ok",
        )
        .order_by(shadow.created_at.desc())
        .limit(limit)
    )
    with engine.connect() as connection:
        rows = connection.execute(query).all()
    return [AnswerPair(row[0], last_user_text(row[1]), row[2] or "", row[3] or "") for row in rows]
