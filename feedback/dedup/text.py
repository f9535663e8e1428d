"""Text normalisation for duplicate detection.

Two forms come out of one message: the *exact form*, equal for two messages
that differ only in case, width, Unicode compatibility forms, whitespace or
punctuation; and the *shingle form*, the exact form with every digit replaced
by ``0`` so that template floods that differ only in order numbers, amounts or
dates look alike to MinHash.
"""

from __future__ import annotations

import re
import string
import sys
import unicodedata
from functools import cache

_DIGIT = re.compile(r"\d")


@cache
def _punctuation_table() -> dict[int, str]:
    # Built on first use, not at import: a scan of every code point takes ~0.15 s.
    table = {
        code_point: " "
        for code_point in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code_point)).startswith("P")
    }
    # ASCII symbols such as $ + < = > ^ ` | ~ are category S in Unicode, but
    # people type them as punctuation.
    table.update({ord(char): " " for char in string.punctuation})
    return table


def _fold(text: str) -> str:
    # NFKC unifies full-width and half-width forms; NFKC again after
    # case-folding gives Unicode's "NFKC_Casefold" caseless form.
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def normalise_text(text: str) -> str:
    """The exact-duplicate form of a message.

    NFKC, case-folded, punctuation replaced by spaces and runs of whitespace
    collapsed to one space. A message made only of punctuation (``"???"``)
    keeps its punctuation, so ``"?"`` and ``"!"`` stay different.
    """
    return message_forms(text, mask_digits=False)[0]


def message_forms(text: str, *, mask_digits: bool) -> tuple[str, str]:
    """The exact form and the shingle form of one message, from one pass of folding.

    The shingle form is the exact form without punctuation, with every decimal
    digit turned into ``0`` when ``mask_digits`` is set (the signature step
    then treats any token holding a digit as one placeholder token). It is
    empty for a message with nothing but punctuation or whitespace, which can
    then only be an exact duplicate.
    """
    folded = _fold(text)
    shingle_text = " ".join(folded.translate(_punctuation_table()).split())
    exact = shingle_text or " ".join(folded.split())
    if mask_digits:
        shingle_text = _DIGIT.sub("0", shingle_text)
    return exact, shingle_text
