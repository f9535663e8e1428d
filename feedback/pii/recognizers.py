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

from feedback.pii.checksums import cn_resident_id_valid, iban_valid, luhn_valid


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
    :meth:`score_match` to validate a match (return ``None`` to drop it), or :meth:`matches`
    when one pattern cannot say the entity.
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
        return self.matches(text)

    def matches(self, text: str) -> list[RecognizerResult]:
        """The entity's spans in ``text``: each match of ``PATTERN`` that :meth:`score_match`
        keeps (a subclass whose entity one pattern cannot say overrides this)."""
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
    RESIDENT_ID_SCORE = 0.9
    """Below the resident ID's 1.0: one in ten of those IDs passes Luhn by chance, while a
    random 18-digit number rarely has an ID's birth date and GB 11643 check character, so
    a number that is both is an ID (still scrubbed as a card where that recognizer is off)."""

    def score_match(self, match: re.Match[str], text: str) -> float | None:
        """Luhn-valid and not one digit repeated."""
        digits = re.sub(r"\D", "", match.group())
        if len(set(digits)) == 1 or not luhn_valid(digits):
            return None
        return self.RESIDENT_ID_SCORE if cn_resident_id_valid(digits) else self.SCORE


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


# Keyword patterns are lower case and matched on the lower-cased text: a case-insensitive
# alternation costs Python's regex engine several times more at every position.
_CODE_NAMES = (
    r"pin(?:[ \t]+(?:code|number))?|cvv2?|cvc2?|csc|otp|one[ \t-]time[ \t]+(?:pass)?code|"
    r"(?:verification|security|access|auth(?:entication|orization)?|2fa|login|sign[ \t-]in|sms)"
    r"[ \t]+code"
)
_KEY_NAMES = (
    r"password|passcode|passphrase|passwd|pwd|"
    r"api[ \t_-]?key|secret[ \t_-]?key|client[ \t_-]?secret|access[ \t_-]?(?:key|token)|"
    r"auth(?:entication)?[ \t_-]?token|bearer[ \t_-]?token|private[ \t_-]?key|token|secret"
)
_HAN_NAMES = r"支付密码|登录密码|密码|口令|验证码|校验码|动态码|安全码|密钥|秘钥|pin码"
# Between the name and the value: "is", "was now", "has been changed to", ":" or "=", or a
# space (never a line break: code and lists put unrelated words on the next line).
_VERB = (
    r"(?:[ \t]+(?:is|was|are|'s|’s)(?:[ \t]+(?:now|still|currently|actually|just|simply|also))?"
    r"|[ \t]+(?:is[ \t]+|was[ \t]+|has[ \t]+been[ \t]+)?(?:now[ \t]+)?"
    r"(?:changed|set|reset|updated)[ \t]+to)?"
)
_LINK = r"(?:[ \t]*(?:=|:|：)[ \t]*|[ \t]+)"
_QUOTED = r"[\"'“‘`](?P<quoted>[^\s\"'”’`]{3,128})[\"'”’`]"
_NAMED_SECRET = re.compile(
    # A code by name, digits only ("pin 4821", "cvv: 123", "the verification code is 839 201").
    rf"\b(?:{_CODE_NAMES}){_VERB}{_LINK}"
    r"(?P<code>(?<![\w-])\d{3,4}(?:[ -]?\d{2,4})?(?![\w-]))"
    # A password, key or token by name.
    rf"|\b(?:{_KEY_NAMES}){_VERB}(?P<sep>{_LINK})"
    rf"(?:{_QUOTED}|(?P<word>[^\s\"'“‘`<>()\[\]{{}}*][^\s\"'“‘`<>]{{3,127}}?))"
    r"(?=[.,;:!?)\]]*(?:\s|$)|[\u3000-\u303f\uff00-\uffef])"
    # A Chinese name for a secret, then ASCII ("密码是abc12345", "验证码：839201").
    rf"|(?:{_HAN_NAMES})(?:是|为|：|:|=|[ \t])*"
    r"(?P<han>[A-Za-z0-9!@#$%^&*_+=~.\\/-]{4,64}?)(?![A-Za-z0-9!@#$%^&*_+=~.\\/-])"
)
_NAMED_SECRET_ANY_CASE = re.compile(_NAMED_SECRET.pattern, re.IGNORECASE)
"""For the rare text whose lower case changes its length (so positions would not match)."""
_SHAPED_SECRET = re.compile(
    r"(?<![\w-])(?:"
    r"sk[-_](?:live_|test_|proj-|ant-)?[A-Za-z0-9_-]{20,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}|hf_[A-Za-z0-9]{30,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r")(?![\w-])"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)",
    re.DOTALL,
)
"""Credentials of a well-known shape: API keys and tokens by their vendor prefix, a JWT, a
PEM private key."""
# Substrings one of the patterns needs: most texts hold none and skip both scans.
_NAMED_CUES = (
    "pass", "pwd", "api", "secret", "access", "token", "private", "cvv", "cvc", "csc", "otp",
    "code", "码", "口令", "钥",
)  # fmt: skip
_SHAPED_CUES = (
    "sk-", "sk_", "AKIA", "ASIA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_",
    "glpat-", "xox", "AIza", "hf_", "eyJ", "-----BEGIN",
)  # fmt: skip
_INNER_SYMBOL = re.compile(r"[!@#$%^&*_+=~|\\/]")
_MIXED_CASE = re.compile(r"[a-z][^A-Z]*[A-Z]")


class SecretRecognizer(CompiledPatternRecognizer):
    """Passwords, PINs, one-time codes, API keys and tokens: the value a secret's name
    introduces ("my password is hunter2", "PIN: 4821", "验证码是 839201", "api_key=...") and
    credentials of a well-known shape (``sk-...``, ``AKIA...``, ``ghp_...``, a JWT, a PEM
    private key). No checksum tells a password from a word, so a value after "is" or a space
    needs a digit, a symbol or mixed case ("my password is wrong" is a complaint, not a
    secret, nor is "reset your password: open Settings"); one after ``=`` or in quotes is taken
    as it is.
    """

    ENTITY = "SECRET"
    SCORE = 0.9
    PATTERN = _SHAPED_SECRET

    def matches(self, text: str) -> list[RecognizerResult]:
        """Secrets in ``text``: the value alone, never the word that named it."""
        spans: list[tuple[int, int]] = []
        if any(cue in text for cue in _SHAPED_CUES):
            spans.extend(match.span() for match in _SHAPED_SECRET.finditer(text))
        lower = text.lower()
        if _names_a_secret(lower):
            named = _NAMED_SECRET if len(lower) == len(text) else _NAMED_SECRET_ANY_CASE
            for match in named.finditer(lower if named is _NAMED_SECRET else text):
                span = _value_span(match, text)
                if span is not None:
                    spans.append(span)
        results = [RecognizerResult(self.ENTITY, start, end, self.SCORE) for start, end in spans]
        return fuse_overlaps(results)


def _names_a_secret(lower: str) -> bool:
    if any(cue in lower for cue in _NAMED_CUES):
        return True
    start = lower.find("pin")
    while start >= 0:
        end = start + 3
        if (start == 0 or not lower[start - 1].isalpha()) and not lower[end : end + 1].isalpha():
            return True
        start = lower.find("pin", end)
    return False


def _value_span(match: re.Match[str], text: str) -> tuple[int, int] | None:
    for group in ("code", "quoted"):
        if match.group(group) is not None:
            return match.span(group)
    group = "han" if match.group("han") is not None else "word"
    start, end = match.span(group)
    value = text[start:end].rstrip(".!?")
    # After "=" (code, a query string) anything is the value, up to a query string's next
    # field; after "is" or ":" a word of a sentence is not ("reset your password: open Settings").
    assigned = (match.group("sep") or "").strip() == "="
    if assigned:
        value = value.split("&", 1)[0]
    if group == "han" or assigned or _looks_secret(value):
        return start, start + len(value)
    return None


def _looks_secret(word: str) -> bool:
    """A digit, a symbol inside (not a hyphen or a full stop: "log-ratios", "e.g."), or a
    capital after a small letter: not a word of a sentence."""
    inner = word.strip(".,;:!?")[1:-1]
    return bool(
        any(ch.isdigit() for ch in word) or _INNER_SYMBOL.search(inner) or _MIXED_CASE.search(word)
    )
