"""Cheap per-text language detection by the share of CJK characters."""

from __future__ import annotations

import re
from enum import StrEnum

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002a6df]")
_LETTER = re.compile(r"[^\W\d_]")


class TextLanguage(StrEnum):
    """Which recognizers a text needs: English, Chinese, or both."""

    EN = "en"
    ZH = "zh"
    MIXED = "mixed"


def cjk_share(text: str) -> float:
    """Share of letters in ``text`` that are CJK ideographs (0.0 when it has no letters)."""
    # Most texts hold no ideograph at all: no letter needs counting.
    if text.isascii() or _CJK.search(text) is None:
        return 0.0
    letters = len(_LETTER.findall(text))
    if not letters:
        return 0.0
    return len(_CJK.findall(text)) / letters


def detect_language(text: str, zh_threshold: float = 0.5) -> TextLanguage:
    """Classify ``text``: Chinese above ``zh_threshold`` CJK share, mixed when some, else English.

    A Chinese text that still holds a run of Latin letters (a name, a product)
    is reported as mixed so that the English recognizers see it too.
    """
    share = cjk_share(text)
    if share == 0.0:
        return TextLanguage.EN
    if share >= zh_threshold and not _LATIN_WORD.search(text):
        return TextLanguage.ZH
    return TextLanguage.MIXED


_LATIN_WORD = re.compile(r"[A-Z][a-z]+")
