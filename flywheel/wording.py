"""Values as a person reads them: a mapping as ``key: value, key: value``, never a Python repr."""

from __future__ import annotations

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
