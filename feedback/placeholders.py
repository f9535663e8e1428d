"""The scrubber's placeholders in training text, and neutral words for those an answer invents.

The scrubber (:mod:`feedback.pii`) writes ``<PERSON_1>``, ``<EMAIL_ADDRESS_2>``. A
placeholder the prompt holds may be copied by the model; one that only the answer holds
(the answer named someone, or the model itself) would teach the model to print
``<PERSON_1>``. Such an answer is still a good answer: :func:`neutral_words` gives it a
plain word back ("the customer", "the email address"; 客户, 该邮箱) instead of losing
the example. Pure, and light to import (no Presidio).
"""

from __future__ import annotations

import re
from collections.abc import Collection

PLACEHOLDER = re.compile(r"<[A-Z][A-Z_]*_\d+>")
"""A placeholder as the scrubber writes it: ``<TYPE_n>``."""

NEUTRAL_WORDS: dict[str, tuple[str, str]] = {
    "PERSON": ("the customer", "客户"),
    "EMAIL_ADDRESS": ("the email address", "该邮箱"),
    "PHONE_NUMBER": ("the phone number", "该电话号码"),
    "CREDIT_CARD": ("the card number", "该银行卡号"),
    "IBAN_CODE": ("the account number", "该账号"),
    "US_SSN": ("the Social Security number", "该社会安全号码"),
    "CN_RESIDENT_ID": ("the ID number", "该身份证号"),
    "IP_ADDRESS": ("the IP address", "该IP地址"),
    "URL": ("the link", "该链接"),
    "STREET_ADDRESS": ("the address", "该地址"),
    "SECRET": ("the code", "该密码"),
}
"""Per entity type, the neutral words in English and in Chinese."""
OTHER_TYPE = ("those details", "相关信息")
"""For a type of the operator's own recognizers (``EMPLOYEE_ID``)."""

_VOCATIVE = re.compile(
    r"\b(?:hi|hello|hey|thanks|thank you|sorry|welcome|okay|ok|yes|no|"
    r"good (?:morning|afternoon|evening))[\s,]*$",
    re.IGNORECASE,
)
_DEAR = re.compile(r"\b(?:dear)\s*$|亲爱的$", re.IGNORECASE)
_SELF = re.compile(r"(?:\b(?:i'm|i’m|i am|my name is|this is)|我是|我叫)\s*$", re.IGNORECASE)
_HAN = re.compile(r"[\u3400-\u9fff]")


def neutral_words(text: str, keep: Collection[str] = ()) -> tuple[str, int]:
    """``text`` with every placeholder not in ``keep`` replaced by a neutral word of its
    type (:data:`NEUTRAL_WORDS`), and how many were replaced.

    English or Chinese by the characters around the placeholder. For a person, the
    words around it choose: one addressed ("Hi <PERSON_1>," "Thanks, <PERSON_1>!") is
    left out ("Hi," "Thanks!") or "there" ("Hello there and welcome"); "Dear
    <PERSON_1>" is "Dear customer"; one introducing themself ("I'm <PERSON_1>", 我是)
    is "your assistant" (您的助手). An English word
    starting a sentence is capitalised.
    """
    replaced = 0
    pieces: list[str] = []
    position = 0
    for match in PLACEHOLDER.finditer(text):
        if match.group() in keep:
            continue
        before = text[position : match.start()]
        word = _word_for(text, match.start(), match.end(), match.group())
        if word is None:  # addressed: the name is left out with the space or comma before it
            before = before.rstrip(" ,")
            word = ""
        pieces += [before, word]
        position = match.end()
        replaced += 1
    pieces.append(text[position:])
    return "".join(pieces), replaced


def _word_for(text: str, start: int, end: int, placeholder: str) -> str | None:
    """The neutral word for one placeholder; ``None`` when it is best left out."""
    entity_type = placeholder[1:-1].rsplit("_", 1)[0]
    chinese = _HAN.search(text[max(0, start - 6) : start] + text[end : end + 6]) is not None
    english_word, chinese_word = NEUTRAL_WORDS.get(entity_type, OTHER_TYPE)
    before = text[max(0, start - 24) : start]
    if entity_type == "PERSON":
        if _SELF.search(before):
            english_word, chinese_word = "your assistant", "您的助手"
        elif _DEAR.search(before):
            english_word, chinese_word = "customer", "客户"
        elif not chinese and _VOCATIVE.search(before):
            if text[end : end + 1] in {"", ",", "!", ".", "?"}:
                return None
            english_word = "there"
    if chinese:
        return chinese_word
    if _starts_sentence(text, start):
        return english_word[0].upper() + english_word[1:]
    return english_word


def _starts_sentence(text: str, start: int) -> bool:
    head = text[:start].rstrip()
    return not head or head.endswith((".", "!", "?", ":")) or "\n" in text[len(head) : start]
