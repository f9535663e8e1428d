"""PII scrubbing for English and Chinese text, on Presidio, offline.

Build a :class:`Scrubber` once with :func:`build_scrubber` and pass it to
:func:`scrub_records` (a batch of records, several fields each) or
:func:`scrub_text` (one text). Nothing heavy happens at import.
"""

from feedback.pii.presidio_import import import_presidio

import_presidio()

from feedback.pii.language import TextLanguage, cjk_share, detect_language  # noqa: E402
from feedback.pii.scrubber import (  # noqa: E402
    PlaceholderBook,
    ScrubbedSpan,
    Scrubber,
    ScrubResult,
    build_scrubber,
    scrub_records,
    scrub_text,
)
from flywheel.settings.scrubber import SUPPORTED_ENTITIES, ScrubberSettings  # noqa: E402

__all__ = [
    "SUPPORTED_ENTITIES",
    "PlaceholderBook",
    "ScrubResult",
    "ScrubbedSpan",
    "Scrubber",
    "ScrubberSettings",
    "TextLanguage",
    "build_scrubber",
    "cjk_share",
    "detect_language",
    "scrub_records",
    "scrub_text",
]
