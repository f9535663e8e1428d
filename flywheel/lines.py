"""What a business line may be called, in one place.

A line's name becomes part of other names (its adapters ``<line>-v<version>``, its
MLflow model and experiment, rate-limit counters, store rows), so it is held to
lowercase letters, digits and underscores, starting with a letter, at most 64
characters; every place a name enters (settings, recipes, imports, key files)
checks it against :data:`BUSINESS_LINE`.
"""

from __future__ import annotations

import re

BUSINESS_LINE = r"^[a-z][a-z0-9_]{0,63}$"
LINE_NAME_RULE = "lowercase letters, digits and underscores, starting with a letter, at most 64"
_LINE = re.compile(BUSINESS_LINE)


def is_line_name(name: object) -> bool:
    """Whether ``name`` may name a business line."""
    return isinstance(name, str) and _LINE.fullmatch(name) is not None
