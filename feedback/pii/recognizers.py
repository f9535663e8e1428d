"""Presidio recognizers over compiled regular expressions, for identifiers in any language.

Each recognizer is a real :class:`presidio_analyzer.EntityRecognizer`, so it
can be added to a Presidio ``AnalyzerEngine``; the scrubber calls
:meth:`analyze` directly to skip the engine's per-call overhead. Numeric
patterns use ASCII look-arounds instead of ``\\b`` because a CJK character
counts as a word character, and ``电话13812345678`` has no word boundary.
"""

from __future__ import annotations

import ipaddress
import re
from functools import cache
from typing import ClassVar

import tldextract
from presidio_analyzer import EntityRecognizer, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts

from feedback.pii.checksums import iban_valid, luhn_valid


@cache
def offline_suffix_extractor() -> tldextract.TLDExtract:
    """A tldextract instance that only uses the public suffix list bundled with the package.

    No URL and no cache folder, so it never touches the network or the disk.
    """
    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, fallback_to_snapshot=True)


def use_offline_suffix_list() -> None:
    """Make ``tldextract.extract`` (used by Presidio's email/URL recognizers) work offline.

    Presidio calls the module-level extractor, which by default downloads the
    public suffix list on first use; this swaps it for the bundled snapshot.
    """
    import tldextract.tldextract as tldextract_module

    tldextract_module.TLD_EXTRACTOR = offline_suffix_extractor()


class CompiledPatternRecognizer(EntityRecognizer):
    """One compiled pattern, an optional check on each match, and a fixed score.

    Subclasses set ``ENTITY``, ``PATTERN`` and ``SCORE`` and may override
    :meth:`score_match` to validate a match (return ``None`` to drop it).
    ``PREFILTER``, when set, is a cheap pattern every match contains (a digit,
    an ``@``): a text without it is not scanned with the full pattern.
    """

    ENTITY: ClassVar[str]
    PATTERN: ClassVar[re.Pattern[str]]
    SCORE: ClassVar[float] = 0.8
    LANGUAGE: ClassVar[str] = "en"
    GROUP: ClassVar[int | str] = 0
    PREFILTER: ClassVar[re.Pattern[str] | None] = None

    def __init__(self) -> None:
        super().__init__(
            supported_entities=[self.ENTITY],
            supported_language=self.LANGUAGE,
            name=type(self).__name__,
        )

    def load(self) -> None:
        """Nothing to load: patterns are compiled with the class."""

    def score_match(self, match: re.Match[str], text: str) -> float | None:
        """The score of one match, or ``None`` when the match is not a real entity."""
        return self.SCORE

    def analyze(
        self,
        text: str,
        entities: list[str] | None = None,
        nlp_artifacts: NlpArtifacts | None = None,
    ) -> list[RecognizerResult]:
        """Find the entity in ``text`` (Presidio's recognizer interface)."""
        if entities and self.ENTITY not in entities:
            return []
        if self.PREFILTER is not None and self.PREFILTER.search(text) is None:
            return []
        results = []
        for match in self.PATTERN.finditer(text):
            score = self.score_match(match, text)
            if score is not None:
                start, end = match.span(self.GROUP)
                results.append(RecognizerResult(self.ENTITY, start, end, score))
        return results


def fuse_overlaps(results: list[RecognizerResult]) -> list[RecognizerResult]:
    """Overlapping results of one recognizer fused into one span with the best score."""
    fused: list[RecognizerResult] = []
    for result in sorted(results, key=lambda r: (r.start, -r.end)):
        if fused and result.start < fused[-1].end:
            last = fused[-1]
            last.end = max(last.end, result.end)
            last.score = max(last.score, result.score)
        else:
            fused.append(result)
    return fused


ANY_DIGIT = re.compile(r"\d")
"""The prefilter of every recognizer of numbers."""


def has_context(text: str, start: int, words: re.Pattern[str], window: int = 40) -> bool:
    """True when one of ``words`` occurs in the ``window`` characters before ``start``."""
    return words.search(text, max(0, start - window), start) is not None


class EmailAddressRecognizer(CompiledPatternRecognizer):
    """E-mail addresses whose domain ends in a public suffix (offline suffix list)."""

    ENTITY = "EMAIL_ADDRESS"
    PREFILTER = re.compile("@")
    PATTERN = re.compile(
        r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9](?:[A-Za-z0-9._%+-]*[A-Za-z0-9_%+-])?"
        r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![A-Za-z0-9-])"
    )
    SCORE = 1.0

    def score_match(self, match: re.Match[str], text: str) -> float | None:
        """Keep the match when tldextract knows its suffix."""
        domain = match.group().rpartition("@")[2]
        return self.SCORE if offline_suffix_extractor()(domain).suffix else None


class PaymentCardRecognizer(CompiledPatternRecognizer):
    """Credit and bank card numbers (12 to 19 digits, spaces or dashes allowed) passing Luhn.

    Covers Chinese UnionPay bank cards (62…, 16 to 19 digits) as well.
    """

    ENTITY = "CREDIT_CARD"
    PREFILTER = ANY_DIGIT
    PATTERN = re.compile(r"(?<![0-9A-Za-z])(?:\d[ -]?){11,18}\d(?![0-9A-Za-z])")
    SCORE = 1.0

    def score_match(self, match: re.Match[str], text: str) -> float | None:
        """Luhn-valid and not one digit repeated."""
        digits = re.sub(r"\D", "", match.group())
        if len(set(digits)) == 1 or not luhn_valid(digits):
            return None
        return self.SCORE


class IbanCodeRecognizer(CompiledPatternRecognizer):
    """IBANs, compact or in groups of four, any case, with a valid mod-97 check."""

    ENTITY = "IBAN_CODE"
    PREFILTER = ANY_DIGIT
    PATTERN = re.compile(
        r"(?<![0-9A-Za-z])[A-Za-z]{2}\d{2}(?:[ ]?[A-Za-z0-9]{4}){2,7}(?:[ ]?[A-Za-z0-9]{1,3})?"
        r"(?![0-9A-Za-z])"
    )
    SCORE = 1.0

    def score_match(self, match: re.Match[str], text: str) -> float | None:
        """Keep the match when it passes the IBAN check."""
        return self.SCORE if iban_valid(match.group()) else None


class IpAddressRecognizer(CompiledPatternRecognizer):
    """IPv4 and IPv6 addresses (validated by :mod:`ipaddress`)."""

    ENTITY = "IP_ADDRESS"
    PREFILTER = re.compile(r"[\d:]")
    PATTERN = re.compile(
        r"(?<![0-9A-Za-z.:])(?:"
        r"(?:\d{1,3}\.){3}\d{1,3}"
        r"|(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|(?:\d{1,3}\.){3}\d{1,3})?"
        r")(?![0-9A-Za-z:]|\.\d)"
    )
    SCORE = 0.9

    def score_match(self, match: re.Match[str], text: str) -> float | None:
        """Keep addresses that :func:`ipaddress.ip_address` accepts, but not ``::``-only ones."""
        value = match.group()
        try:
            ipaddress.ip_address(value)
        except ValueError:
            return None
        if ":" in value and sum(ch.isalnum() for ch in value) < 3:
            return None
        return self.SCORE


class CredentialUrlRecognizer(CompiledPatternRecognizer):
    """URLs that carry a user name and password (``scheme://user:secret@host/...``)."""

    ENTITY = "URL"
    PREFILTER = re.compile("://")
    PATTERN = re.compile(
        r"(?<![A-Za-z0-9])[A-Za-z][A-Za-z0-9+.-]{1,15}://[^\s/?#@:]+:[^\s/?#@]+@[^\s<>\"'`]+"
    )
    SCORE = 1.0
