"""Values as a person reads them: a mapping as ``key: value, key: value``, never a Python repr."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def in_words(value: Any, *, empty: str = "none") -> str:
    """``value`` in plain words: a mapping as ``key: value, key: value`` (underscores in keys
    read as spaces; a nested mapping in parentheses), a list or tuple as its items joined by
    commas, an empty one as ``empty``, anything else as ``str``."""
    if isinstance(value, Mapping):
        if not value:
            return empty
        parts = []
        for key, item in value.items():
            shown = in_words(item, empty=empty)
            if isinstance(item, Mapping) and item:
                shown = f"({shown})"
            parts.append(f"{str(key).replace('_', ' ')}: {shown}")
        return ", ".join(parts)
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(str(item) for item in value) if value else empty
    return str(value)


def _whole(value: float) -> bool:
    return abs(value - round(value)) < 1e-6


def sure(p: float) -> str:
    """How sure a test is, for a person: ``1 - p`` as a percentage ("95%", "99.4%"), shown to
    the digits ``p`` needs and never rounded up (a p of 0.0001 is "99.99%", not "100%")."""
    p = min(max(float(p), 0.0), 1.0)
    digits = 0
    while digits < 3 and p < 10 ** -(digits + 2):
        digits += 1
    # A level one more digit states exactly is shown whole: 0.025 needed reads "97.5%".
    if digits < 3 and not _whole(p * 100 * 10**digits) and _whole(p * 1000 * 10**digits):
        digits += 1
    scale = 10**digits
    shown = min(math.floor(round((1 - p) * 100 * scale, 6)), 100 * scale - 1) / scale
    return f"{shown:.{digits}f}%"
