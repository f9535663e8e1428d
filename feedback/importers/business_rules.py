"""Which business line a conversation belongs to: ordered, configurable rules.

A rule matches on the conversation's language and on keywords (whole words,
case-insensitive; for Chinese, substrings) in its opening prompt. The first
rule that matches wins; otherwise the default line applies.
"""

from __future__ import annotations

import re
from functools import cached_property
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from feedback.events import BUSINESS_LINE
from flywheel.errors import InputFileError
from flywheel.user_files import load_user_yaml

# A rules file is keyword lists: this is far more than one needs.
MAX_RULES_BYTES = 1024 * 1024


class BusinessRule(BaseModel):
    """Send conversations in ``languages`` mentioning any of ``keywords`` to ``business_line``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    business_line: str = Field(pattern=BUSINESS_LINE)
    languages: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()

    @cached_property
    def _pattern(self) -> re.Pattern[str] | None:
        if not self.keywords:
            return None
        words = sorted(self.keywords, key=len, reverse=True)
        parts = [
            re.escape(w) if re.search(r"[\u4e00-\u9fff]", w) else rf"\b{re.escape(w)}\b"
            for w in words
        ]
        return re.compile("|".join(parts), re.IGNORECASE)

    def matches(self, text: str, language: str | None) -> bool:
        """Whether this rule claims a conversation."""
        if self.languages and (language or "") not in self.languages:
            return False
        pattern = self._pattern
        return pattern is None or pattern.search(text) is not None


class BusinessRules(BaseModel):
    """An ordered rule list with a default line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default: str = Field(default="general", pattern=BUSINESS_LINE)
    rules: tuple[BusinessRule, ...] = ()

    def business_line_for(self, text: str, language: str | None = None) -> str:
        """The business line of a conversation opening with ``text``."""
        for rule in self.rules:
            if rule.matches(text, language):
                return rule.business_line
        return self.default


def load_business_rules(path: Path | None = None) -> BusinessRules:
    """Read rules from a user's YAML file (read within bounds; unreadable or invalid: an
    :class:`~flywheel.errors.InputFileError` naming the file and the key), or the shipped
    defaults when ``path`` is None."""
    if path is None:
        text = resources.files("feedback.importers").joinpath("business_rules.yaml").read_text()
        return BusinessRules.model_validate(yaml.safe_load(text) or {})
    data = load_user_yaml(path, max_bytes=MAX_RULES_BYTES, what="rules file") or {}
    try:
        return BusinessRules.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '(rules)'}: {error['msg']}"
            for error in errors[:5]
        )
        more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
        raise InputFileError(f"{path}: not valid business rules: {problems}{more}") from None
