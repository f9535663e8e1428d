"""Recognizers for English and international text: US SSN, phone numbers, street addresses.

Phone numbers and addresses are written in many national formats; these
patterns aim at the common shapes (grouped digits with a country code, a
house number and a street type, a street type word before or after the
name, military and PO box addresses) and then grow an address over the
unit, city, region, postcode and country that follow it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache

from presidio_analyzer import EntityRecognizer, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts

from feedback.pii.recognizers import (
    ANY_DIGIT,
    CompiledPatternRecognizer,
    fuse_overlaps,
    has_context,
)

_SSN_CONTEXT = re.compile(r"ssn|social security|social sec|ss#|ss #", re.I)
_PHONE_CONTEXT = re.compile(
    r"phone|call|tel\b|mobile|cell|fax|desk|office|whatsapp|text me|reach me|number", re.I
)


class SocialSecurityNumberRecognizer(CompiledPatternRecognizer):
    """US social security numbers: 3-2-4 digits with dashes or spaces (bare 9 digits need a cue).

    Numbers the SSA never issues (area 000 or 666, group 00, serial 0000) are rejected.
    """

    ENTITY = "US_SSN"
    PREFILTER = ANY_DIGIT
    PATTERN = re.compile(r"(?<![0-9A-Za-z-])(\d{3})([- ]?)(\d{2})\2(\d{4})(?![0-9A-Za-z-])")
    SCORE = 0.85

    def score_match(self, match: re.Match[str], text: str) -> float | None:
        """Reject impossible numbers; a bare 9-digit run needs an SSN cue before it."""
        area, separator, group, serial = match.groups()
        if area in {"000", "666"} or group == "00" or serial == "0000":
            return None
        if not separator and not has_context(text, match.start(), _SSN_CONTEXT):
            return None
        return self.SCORE


class PhoneNumberRecognizer(CompiledPatternRecognizer):
    """Phone numbers in international and national formats, 7 to 15 digits.

    ``+41 (0)62 585 51 90``, ``(579)888-3058``, ``0489 25 37 29``,
    ``+1-903-140-4508x769``, ``5403926876``. Dates, thousands and year ranges
    that share the shape are rejected.
    """

    ENTITY = "PHONE_NUMBER"
    PREFILTER = ANY_DIGIT
    PATTERN = re.compile(
        r"(?<![0-9A-Za-z_.+/-])"
        r"(?P<number>(?:(?:\+|00)\d{1,3}[ .-]?(?:\(0\)[ ]?)?)?"
        r"(?:\(\d{1,5}\)[ .-]?\d{1,5}(?:[ .-]\d{1,5}){0,4}"
        r"|\d{1,5}(?:[ .-]\d{1,8}){1,5}"
        r"|\d{7,15}))"
        r"(?:[ ]?(?:x|ext\.?|#)[ ]?\d{1,6})?"
        r"(?![0-9A-Za-z_/])"
    )
    SCORE = 0.6
    _DATE = re.compile(r"\d{4}([-./ ])\d{1,2}\1\d{1,2}|\d{1,2}([-./ ])\d{1,2}\2\d{2,4}")
    _THOUSANDS = re.compile(r"\d{1,3}(?:\.\d{3})+")
    _YEARS = re.compile(r"(?:19|20)\d\d[ -](?:19|20)\d\d")

    def score_match(self, match: re.Match[str], text: str) -> float | None:
        """Keep 7 to 15 digits that are not a date, a thousands figure or a year range."""
        number = match.group("number")
        digits = sum(ch.isdigit() for ch in number)
        if not 7 <= digits <= 15:
            return None
        if self._DATE.fullmatch(number) or self._THOUSANDS.fullmatch(number):
            return None
        if self._YEARS.fullmatch(number):
            return None
        plan = _numbering_plan_verdict(number)
        if plan is False:
            return None
        if plan or has_context(text, match.start(), _PHONE_CONTEXT):
            return 0.8
        return self.SCORE


def _numbering_plan_verdict(number: str) -> bool | None:
    """What libphonenumber says of a candidate: ``True`` a valid number (international, or
    national in the US), ``False`` an international number no plan allows (unknown
    country code, impossible length), ``None`` no verdict: a national number of unknown
    region keeps the shape checks alone (recall first: scrubbing too much is cheap)."""
    import phonenumbers

    compact = number.replace("(0)", "")
    international = compact.startswith(("+", "00"))
    if international and compact.startswith("00"):
        compact = "+" + compact[2:]
    try:
        parsed = phonenumbers.parse(compact, None if international else "US")
    except phonenumbers.NumberParseException:
        return False if international else None
    if phonenumbers.is_valid_number(parsed):
        return True
    if international and not phonenumbers.is_possible_number(parsed):
        return False
    return None


_STREET_TYPES = (
    "Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Place|Pl|Square|Sq|"
    "Terrace|Way|Parkway|Pkwy|Highway|Hwy|Circle|Cir|Trail|Alley|Crescent|Close|Row|Walk|Loop|"
    "Turnpike|Pike|Unions?|Forks?|Greens?|Park|Plaza|Points?|Ridges?|Ranch|Heights|Hills?|Mews|"
    "Gardens?|Groves?|Hollow|Junctions?|Crossing|Expressway|Freeway|Str|Pass|Path|Bridge|Club|"
    "Villages?|Vista|View|Station|Estates?|Fords?|Run|Keys?|Tunnel|Trace|Ports?|Center|Centre|"
    "Orchard|Manors?|Gateway|Mission|Ferry|Passage|Forges?|Plains?|Fort|Summit|Bypass|Shores?|"
    "Harbou?r|Islands?|Fields?|Wells?|Pines|Curve|Meadows?|Mills?|Landing|Falls?|Rapids?|Divide|"
    "Burgs?|Lakes?|Springs?|Stream|Valley|Camp|Canyon|Cape|Causeway|Common|Corners?|Course|Cove|"
    "Creek|Crest|Dale|Dam|Extension|Flats?|Glen|Haven|Inlet|Isle|Knolls?|Lights?|Locks?|Lodge|"
    "Motorway|Mount|Mountain|Neck|Oval|Overpass|Parade|Prairie|Quay|Rest|Rise|Route|Shoals?|"
    "Skyway|Spurs?|Throughway|Track|Trafficway|Underpass|Viaduct|Ville|Wall|Wharf|Wynd|Esplanade|"
    # The rest of the USPS street suffixes (Publication 28, appendix C1).
    "Annex|Arcade|Bayou|Beach|Bend|Bluffs?|Bottom|Branch|Brooks?|Cliffs?|Crossroads?|Forest|"
    "Land|Loaf|Mall|Pine|Radial|Ramp|River|Rue|Stravenue|Trailer|Via"
)
"""Street types; each may also be plural ("Courts", "Mountains"), as in Faker's addresses."""
_STREET_PREFIXES = (
    "Rue|Rua|Rúa|Via|Viale|Piazza|Piazzale|Piazzetta|Strada|Stradella|Calle|Carrer|Avenida|"
    "Avinguda|Av\\.|Avenue|Plaza|Praça|Paseo|Passeig|Camino|Travessa|Travesía|Largo|Alameda|Ronda|"
    "Rambla|Carretera|Callejón|Corso|Vicolo|Contrada|Borgo|Località|ul\\.|ulica|al\\.|aleja|pl\\.|"
    "plac|os\\.|Pod|Chemin|Allée|Place|Quai|Impasse|Route|Boulevard|trg|cesta|Jalan|Jl\\.|Drumul|"
    "Aleea|Bulevardul|Intrarea|Estrada|Rodovia|Vila|Quadra|Postbox|Bygget|Gran\\s+Vía"
)
_STREET_ENDINGS = (
    "katu|tie|kuja|polku|väg|vägen|gatan|gata|gate|gaten|veien|vei|vej|gade|straße|strasse|str\\.|"
    "weg|gasse|allee|platz|damm|laan|straat|plein|gracht|dijk|kade|singel|braut|vegur|stræti|"
    "stræde|utca|steeg|dreef|torget|gränd|stigen|bakken|haugen|lia|brekka|hof|baan|pad|ring"
)
_WORD = r"[^\W\d_][\w'’.-]*"
_CAP = r"[^\W\d_a-z][\w'’.-]*"
_HOUSE = r"\d{1,6}[A-Za-z]?(?:[-/]\d{1,4})?"
_AFTER_TYPES = r"u\.|út|utca|tér|körút|köz|sétány|ulica|cesta|put|gata|gade|vej|weg"
_MILITARY_POST = r"(?:APO|FPO|DPO)\s+(?:AA|AE|AP)\s+\d{5}\b"
"""US military post: APO/FPO/DPO, the "state" (Americas, Europe, Pacific) and a ZIP code."""

_ENDING_BEFORE_NUMBER = re.compile(rf"(?i:{_STREET_ENDINGS})\Z")
_SPACE_BEFORE_DIGIT = re.compile(r"\s+\d")
_TYPE_BEFORE_NUMBER = re.compile(rf"\s(?i:{_AFTER_TYPES})\s+\d")


def _street_ending_before_number(text: str) -> bool:
    """Whether a street ending ("katu", "straße") runs into spaces and a digit somewhere."""
    return any(
        _ENDING_BEFORE_NUMBER.search(text, max(0, space.start() - 12), space.start())
        for space in _SPACE_BEFORE_DIGIT.finditer(text)
    )


def _street_type_before_number(text: str) -> bool:
    """Whether a street type written after the name ("u.", "út") precedes a number."""
    return _TYPE_BEFORE_NUMBER.search(text) is not None


_ADDRESS_FORMS: tuple[tuple[str, Callable[[str], bool] | None], ...] = (
    # 2450 Crown St, 363 52 Huntly Street, 1317 Kimberly Way
    (
        rf"\b{_HOUSE}\s+(?:\d{{1,5}}\s+)?(?:[NSEW]\.?\s+)?(?:{_CAP}\s+){{0,3}}{_CAP}\s+"
        rf"(?i:(?:{_STREET_TYPES})s?)\b\.?",
        None,
    ),
    # Koskikatu 25, 6750 Koskikatu 25, tawastintie 6, Nieuwe Baan 473
    (
        rf"(?:\b{_HOUSE}\s+)?(?:\b{_CAP}\s+){{0,2}}\b[^\W\d_][\w'’-]*(?i:{_STREET_ENDINGS})\s+"
        rf"{_HOUSE}\b\.?",
        _street_ending_before_number,
    ),
    # Rua Diadema 1903, Via dei Fiorentini 1, ul. Więckowskiego Stefana 28
    (
        rf"(?:\b{_HOUSE}\s+)?(?<![\w.])(?i:{_STREET_PREFIXES})\s+(?:{_WORD}\s+){{0,4}}?"
        rf"{_HOUSE}\b\.?",
        None,
    ),
    # Király u. 15., hegyalja út 98.
    (
        rf"\b(?:{_WORD}\s+){{0,2}}{_WORD}\s+(?i:{_AFTER_TYPES})\s+{_HOUSE}\b\.?",
        _street_type_before_number,
    ),
    # 5100 Quadra 104, 22829 Jagerij 64: a number, a street name, a number.
    (rf"\b\d{{3,6}}\s+(?:{_CAP}\s+){{0,2}}{_CAP}\s+\d{{1,4}}[A-Za-z]?\b", None),
    # Military mail: PSC 0729, Box 5797, APO AP 96854 / Unit 1234 Box 5678, DPO AE 12345
    # / USS Mahler, FPO AA 70489 / USNS Smith FPO AP 12345; the box alone is enough.
    (rf"\b(?:PSC|Unit|CMR)\s+\d{{1,5}},?\s+Box\s+\d{{1,5}}\b(?:,?\s+{_MILITARY_POST})?", None),
    (rf"\b(?:USNS|USNV|USS|USCGC)\s+(?:{_CAP}\s+)?{_CAP},?\s+{_MILITARY_POST}", None),
    (rf"\b{_MILITARY_POST}", None),
    # P.O. Box 149, PO Box 12
    (r"(?<!\w)(?:\d{1,6}\s+)?(?i:P\.?\s?O\.?\s*Box)\s+\d{1,6}\b", None),
    # the corner of 35 Pentelis Str. and Waechter Turnpike
    (
        r"\b(?i:(?:the\s+)?corner\s+of)\s+[^.,;!?\n]{3,60}?\s+and\s+[^.,;!?\n]{3,40}?"
        r"(?=[.,;!?\n]|$)",
        None,
    ),
)
"""The forms of an address core, in the order they are tried, each with a test that every
text holding a match of it passes (``None``: no test)."""
_ADDRESS_CORES = re.compile("|".join(form for form, _ in _ADDRESS_FORMS))


@cache
def _cores_of(forms: tuple[bool, ...]) -> re.Pattern[str]:
    return re.compile(
        "|".join(form for (form, _), kept in zip(_ADDRESS_FORMS, forms, strict=True) if kept)
    )


def _address_cores(text: str) -> re.Pattern[str]:
    """The address cores for ``text``: without the forms that cannot match anywhere in it.

    Two forms try every word as the start of a street name and cost most of the search;
    a form that matches nowhere in a text changes no match of the others, so the
    matches are those of :data:`_ADDRESS_CORES`.
    """
    return _cores_of(tuple(test is None or test(text) for _, test in _ADDRESS_FORMS))


_UNIT = re.compile(
    r"(?:Apt\.?|Apartment|Suite|Ste\.?|Unit|Flat|Room|Floor|Fl\.?)\s*#?\s*\d{1,5}[A-Za-z]?\b", re.I
)
_PARTICLES = "de|del|la|le|na|am|an|der|di|do|da|dos|sur|upon|on"
_TAIL_SEPARATOR = re.compile(r"[ \t>?]*(?:[,\n][ \t>?]*){0,3}")
_TAIL_PART = re.compile(
    r"(?P<unit>(?:Apt\.?|Apartment|Suite|Ste\.?|Unit|Flat|Room|Floor)\s*#?\s*\d{1,5}[A-Za-z]?\b)"
    r"|(?P<postcode>[A-Z]\d[A-Z][ ]?\d[A-Z]\d\b|[A-Z]{1,2}\d[A-Z\d]?[ ]?\d[A-Z]{2}\b"
    r"|\d{4,6}(?:-\d{4})?\b)"
    r"|(?P<region>[A-Z]{2}\b|nan\b)"
    rf"|(?P<word>{_CAP}(?:[ \t]+(?:{_CAP}|{_PARTICLES})){{0,3}})"
    r"|(?P<lower>[^\W\d_][\w'’-]*(?:[ \t][^\W\d_][\w'’-]*){0,2})"
)
_ADDRESS_CUES = re.compile(
    r"(?:\baddress(?:\s+is)?|\blives?\s+(?:on|at|in)|\blocated\s+(?:at|on)|\bmeet\s+(?:me|you)\s+at|"
    r"\bsent\s+to|\bmoved\s+to|\bstop\s+at|\bdeliver(?:ed)?\s+to|\bship(?:ped)?\s+to)[\s:]*$",
    re.I,
)
_MAY_HOLD_ADDRESS = re.compile(r"\d|corner", re.I)
"""Every address pattern holds a number but "the corner of A and B"."""
_LABEL_LINE = re.compile(r"[A-Za-z -]{2,20}:")


class StreetAddressRecognizer(EntityRecognizer):
    """Street addresses in English and European formats, grown over the lines that follow."""

    ENTITY = "STREET_ADDRESS"

    def __init__(self) -> None:
        super().__init__(supported_entities=[self.ENTITY], supported_language="en")

    def load(self) -> None:
        """Nothing to load: patterns are compiled with the module."""

    def analyze(
        self,
        text: str,
        entities: list[str] | None = None,
        nlp_artifacts: NlpArtifacts | None = None,
    ) -> list[RecognizerResult]:
        """Find street addresses in ``text`` (Presidio's recognizer interface)."""
        if entities and self.ENTITY not in entities:
            return []
        if _MAY_HOLD_ADDRESS.search(text) is None:
            return []
        results = []
        for match in _address_cores(text).finditer(text):
            start, end = match.span()
            end = self._grow(text, end)
            score = 0.75 if _ADDRESS_CUES.search(text, max(0, start - 30), start) else 0.6
            results.append(RecognizerResult(self.ENTITY, start, end, score))
        for match in _UNIT.finditer(text):
            results.append(
                RecognizerResult(self.ENTITY, match.start(), self._grow(text, match.end()), 0.5)
            )
        return fuse_overlaps(results)

    @staticmethod
    def _grow(text: str, end: int) -> int:
        """Extend an address over the unit, city, region, postcode and country after it.

        A name-like part is taken only as a new component (after a comma or a
        line break) or when the address ends right after it, so that prose
        following an address is not swallowed.
        """
        for _ in range(8):
            separator = _TAIL_SEPARATOR.match(text, end)
            assert separator is not None  # the pattern matches the empty string
            start = separator.end()
            part = _TAIL_PART.match(text, start)
            if part is None or _LABEL_LINE.match(text, start):
                break
            new_component = "," in separator.group() or "\n" in separator.group()
            ends_here = text[part.end() : part.end() + 1] in ("", "\n", ",", ".", ";", "?", "!")
            if part.lastgroup == "word" and not (new_component or ends_here):
                break
            if part.lastgroup == "lower" and not ("," in separator.group() and ends_here):
                break
            end = part.end()
        return end
