"""Find PII in batches of texts and replace it with numbered placeholders.

The scrubber runs Presidio recognizers directly rather than through
``AnalyzerEngine``: pattern recognizers over every text, spaCy's NER (and
nothing else of the pipeline) over a whole batch at once with ``nlp.pipe``,
and the Chinese recognizers on one jieba segmentation per text. Replacement
writes what Presidio's ``AnonymizerEngine`` writes for these spans (``<TYPE_n>``,
same-placeholder neighbours across spaces merged) without its per-call
overhead. Within one record the same value always gets the same placeholder,
so a conversation stays readable.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from presidio_analyzer import (
    AnalyzerEngine,
    EntityRecognizer,
    RecognizerRegistry,
    RecognizerResult,
)
from presidio_analyzer.nlp_engine import NoOpNlpEngine

from feedback.pii.language import TextLanguage, detect_language
from feedback.pii.person_names import (
    NameGazetteer,
    PersonNameFinder,
    load_english_lexicon,
    load_name_gazetteer,
    load_name_statistics,
)
from feedback.pii.product_names import BUILT_IN_PRODUCT_NAMES, ProductNames
from feedback.pii.recognizers import (
    CompiledPatternRecognizer,
    CredentialUrlRecognizer,
    EmailAddressRecognizer,
    IbanCodeRecognizer,
    IpAddressRecognizer,
    PaymentCardRecognizer,
    SecretRecognizer,
    use_offline_suffix_list,
)
from feedback.pii.recognizers_en import (
    PhoneNumberRecognizer,
    SocialSecurityNumberRecognizer,
    StreetAddressRecognizer,
)
from feedback.pii.recognizers_zh import (
    ChineseAddressRecognizer,
    ChineseLandlineRecognizer,
    ChineseMobileRecognizer,
    ChineseNameRecognizer,
    ChineseResidentIdRecognizer,
    ChineseSegmenter,
)
from feedback.pii.surnames_zh import COMPOUND_SURNAMES, SINGLE_SURNAMES
from flywheel.settings.scrubber import ScrubberSettings, load_scrubber_settings

if TYPE_CHECKING:
    from spacy.language import Language

_CAPITALISED = re.compile(r"\b[A-Z][\w'’-]*")
_LATIN_NAME_PART = re.compile(r"[^\W\d_]{3,}")
_CJK = re.compile(r"[\u3400-\u9fff]")
_SPACES = re.compile(" +")
_CJK_NAME = re.compile(r"[\u3400-\u9fff]{2}")
_CJK_RUN = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]+")
_SHOUTED_WORD = re.compile(r"\b[A-Z][A-Z'’]{3,}\b")
_SHOUTED_RUN = re.compile(
    r"(?:^|(?<=\s))(?:[A-Z][A-Z'’]*[\s,.!?:;]+){2,}[A-Z][A-Z'’]*\b|^[A-Z'’]{2,}(?: [A-Z'’]{2,})+$"
)
"""Three words in capitals in a row, or a text of two or more such words alone."""


@dataclass(frozen=True, slots=True)
class ScrubbedSpan:
    """Where the input text was replaced: offsets in the input, the type and the placeholder."""

    start: int
    end: int
    entity_type: str
    placeholder: str


@dataclass(frozen=True, slots=True)
class ScrubResult:
    """One scrubbed text: the new text, counts per entity type (never values), the spans."""

    text: str
    summary: dict[str, int]
    spans: tuple[ScrubbedSpan, ...]
    language: TextLanguage


@dataclass
class PlaceholderBook:
    """Placeholders for one record: the same value always maps to the same placeholder."""

    _numbers: dict[tuple[str, str], int] = field(default_factory=dict)
    _counts: Counter[str] = field(default_factory=Counter)

    def placeholder(self, entity_type: str, value: str) -> str:
        """``<TYPE_n>`` for ``value``, numbered in order of first appearance per type."""
        key = (entity_type, " ".join(value.split()).casefold())
        number = self._numbers.get(key)
        if number is None:
            self._counts[entity_type] += 1
            number = self._numbers[key] = self._counts[entity_type]
        return f"{entity_type}_{number}"


class _Slot(NamedTuple):
    """Where a text of a record lives: a field, or the content of one message of a field."""

    record: int
    field: str
    message: int | None


class Scrubber:
    """Scrubs texts and records; build it once with :func:`build_scrubber`."""

    def __init__(
        self,
        settings: ScrubberSettings,
        nlp: Language | None,
        pattern_recognizers: Sequence[EntityRecognizer],
        gazetteer: NameGazetteer,
        street_addresses: StreetAddressRecognizer | None,
        chinese_names: ChineseNameRecognizer | None,
        chinese_addresses: ChineseAddressRecognizer | None,
        segmenter: ChineseSegmenter | None,
        product_names: ProductNames | None = None,
    ) -> None:
        self.settings = settings
        self._products = product_names or ProductNames(())
        self._nlp = nlp
        self._patterns = tuple(pattern_recognizers)
        self._gazetteer = gazetteer
        self._names = PersonNameFinder(gazetteer) if "PERSON" in settings.entities else None
        self._street_addresses = street_addresses
        self._chinese_names = chinese_names
        self._chinese_addresses = chinese_addresses
        self._segmenter = segmenter
        self._entities = frozenset(settings.entities) | {
            entity for recognizer in self._patterns for entity in recognizer.supported_entities
        }

    def detect(self, texts: Sequence[str]) -> list[list[RecognizerResult]]:
        """PII found in each text: merged, non-overlapping spans above the score threshold."""
        pieces = list(self._pieces(texts))
        languages = [
            detect_language(piece, self.settings.zh_share_threshold) for _, _, piece in pieces
        ]
        by_rules = [
            self._detect_one(piece, language)
            for (_, _, piece), language in zip(pieces, languages, strict=True)
        ]
        selected = [
            position
            for position, ((_, _, piece), language) in enumerate(
                zip(pieces, languages, strict=True)
            )
            if self._needs_ner(piece, language, by_rules[position])
        ]
        if selected and self._names is not None:
            views = [_latin_view(pieces[p][2], languages[p]) for p in selected]
            for position, view, ents in zip(
                selected, views, self._spacy_entities(views), strict=True
            ):
                by_rules[position].extend(self._names.from_entities(view, ents))
        found: list[list[RecognizerResult]] = [[] for _ in texts]
        for (index, offset, _), results in zip(pieces, by_rules, strict=True):
            for result in results:
                result.start += offset
                result.end += offset
                found[index].append(result)
        return [
            self._merge(self._products.without_products(text, results))
            for text, results in zip(texts, found, strict=True)
        ]

    def _pieces(self, texts: Sequence[str]) -> Iterator[tuple[int, int, str]]:
        """Texts cut at whitespace into pieces no longer than ``max_text_chars``."""
        limit = self.settings.max_text_chars
        for index, text in enumerate(texts):
            offset = 0
            while len(text) - offset > limit:
                cut = max(
                    text.rfind("\n", offset, offset + limit),
                    text.rfind(" ", offset, offset + limit),
                )
                cut = cut if cut > offset else offset + limit
                yield index, offset, text[offset:cut]
                offset = cut
            yield index, offset, text[offset:]

    def _needs_ner(self, text: str, language: TextLanguage, found: list[RecognizerResult]) -> bool:
        """NER only where it can add a name: a capitalised word, not a common word, that
        the rules left outside every span they found (most texts need none, or have
        every name found already)."""
        if self._nlp is None or self._names is None or language is TextLanguage.ZH:
            return False
        spans = self._merge(list(found))
        return any(
            not self._gazetteer.is_common(match.group())
            and not any(s.start <= match.start() and match.end() <= s.end for s in spans)
            for match in _CAPITALISED.finditer(text)
        )

    def _spacy_entities(self, texts: Sequence[str]) -> list[list[tuple[int, int, str]]]:
        """spaCy's entities, ``(start, end, label)``, of each text: one ``nlp.pipe`` pass."""
        if self._nlp is None:
            return [[] for _ in texts]
        docs = self._nlp.pipe(texts, batch_size=self.settings.batch_size)
        return [[(e.start_char, e.end_char, e.label_) for e in doc.ents] for doc in docs]

    def _detect_one(self, text: str, language: TextLanguage) -> list[RecognizerResult]:
        """What the pattern, name, address and Chinese recognizers find without NER."""
        results: list[RecognizerResult] = []
        for recognizer in self._patterns:
            results.extend(recognizer.analyze(text, recognizer.supported_entities, None))
        if language is not TextLanguage.ZH and "en" in self.settings.languages:
            latin = _latin_view(text, language)
            if self._names is not None:
                results.extend(
                    self._names.from_rules(latin, latin_script=language is TextLanguage.EN)
                )
            if self._street_addresses is not None:
                results.extend(self._street_addresses.analyze(latin))
        if language is not TextLanguage.EN and self._segmenter is not None:
            tokens = self._segmenter.tokens(text)
            if self._chinese_names is not None:
                results.extend(
                    self._chinese_names.find(text, tokens, self._segmenter.new_words(text))
                )
            if self._chinese_addresses is not None:
                results.extend(self._chinese_addresses.find(text, tokens))
        return results

    def _merge(self, results: list[RecognizerResult]) -> list[RecognizerResult]:
        """Drop low scores and unwanted types, then fuse overlapping spans into one.

        Overlaps are fused (not resolved to one winner) so that no piece of a
        value survives. The fused span takes the type of the part that holds
        the other (a street named after a person is still an address), else
        of its strongest part (two types of one span: the stronger).
        """
        kept = sorted(
            (
                r
                for r in results
                if r.entity_type in self._entities
                and r.score >= self.settings.score_threshold
                and r.end > r.start
            ),
            key=lambda r: (r.start, -r.end),
        )
        merged: list[RecognizerResult] = []
        for result in kept:
            if merged and result.start < merged[-1].end:
                last = merged[-1]
                best = max((last, result), key=lambda r: (r.score, r.end - r.start, r.entity_type))
                if (last.start, last.end) == (result.start, result.end):
                    pass  # one span, two types: the stronger, whichever came first
                elif last.start <= result.start and result.end <= last.end:
                    best = last
                elif result.start <= last.start and last.end <= result.end:
                    best = result
                merged[-1] = RecognizerResult(
                    best.entity_type, last.start, max(last.end, result.end), best.score
                )
            else:
                merged.append(
                    RecognizerResult(result.entity_type, result.start, result.end, result.score)
                )
        return merged

    def _propagate(self, texts: Sequence[str], found: list[list[RecognizerResult]]) -> None:
        """Mark every other mention of a name already found in the same record.

        "Brad L Key ... starring Key": the second mention would otherwise leak; so
        would "厚林" after "李厚林".
        """
        parts: set[str] = set()
        for text, results in zip(texts, found, strict=True):
            for result in results:
                if result.entity_type != "PERSON":
                    continue
                value = text[result.start : result.end]
                if self._products.is_product(value):
                    continue
                if _CJK.search(value):
                    if len(value) >= 2:
                        parts.add(value)
                    given = _chinese_given_name(value)
                    if given:
                        parts.add(given)
                    continue
                for part in _LATIN_NAME_PART.findall(value):
                    if (
                        part[0].isupper()
                        and not self._gazetteer.is_function_word(part)
                        and not self._products.is_product(part)
                    ):
                        parts.add(part)
        if not parts:
            return
        for index, text in enumerate(texts):
            extra = [
                RecognizerResult("PERSON", start, start + len(part), 0.5)
                for part in parts
                for start in _whole_word_occurrences(text, part)
                if not any(r.start <= start and start + len(part) <= r.end for r in found[index])
            ]
            if extra:
                found[index] = self._merge(found[index] + extra)

    def _apply(
        self, text: str, results: list[RecognizerResult], book: PlaceholderBook
    ) -> ScrubResult:
        scrubbed, spans = _replace(text, results, book)
        summary = dict(Counter(span.entity_type for span in spans))
        language = detect_language(text, self.settings.zh_share_threshold)
        return ScrubResult(scrubbed, summary, tuple(spans), language)

    def scrub_text(self, text: str) -> ScrubResult:
        """Scrub one text; placeholders are numbered within this text."""
        return self.scrub_texts([text])[0]

    def scrub_texts(self, texts: Sequence[str]) -> list[ScrubResult]:
        """Scrub independent texts in one batch; each text numbers its own placeholders."""
        found = self.detect(texts)
        results = []
        for text, detections in zip(texts, found, strict=True):
            single = [detections]
            self._propagate([text], single)
            results.append(self._apply(text, single[0], PlaceholderBook()))
        return results

    def scrub_records(
        self, records: Sequence[Mapping[str, Any]], fields: Sequence[str]
    ) -> list[dict[str, Any]]:
        """Copies of ``records`` with ``fields`` scrubbed and a ``"pii"`` summary added.

        A field may be a string or a list of chat messages (``{"role", "content"}``,
        whose ``content`` strings are scrubbed). Fields a record lacks, or that
        hold anything else, are left as they are. The summary counts mentions
        per entity type over all scrubbed fields of the record.
        """
        wanted = list(dict.fromkeys(fields))
        slots: list[_Slot] = []
        texts: list[str] = []
        for index, record in enumerate(records):
            for name in wanted:
                for slot, text in _texts_of(index, name, record.get(name)):
                    slots.append(slot)
                    texts.append(text)
        found = self.detect(texts)

        by_record: dict[int, list[int]] = {}
        for position, slot in enumerate(slots):
            by_record.setdefault(slot.record, []).append(position)
        outputs = [_copy(record, wanted) for record in records]
        summaries: list[Counter[str]] = [Counter() for _ in records]
        for index, positions in by_record.items():
            record_texts = [texts[p] for p in positions]
            record_found = [found[p] for p in positions]
            self._propagate(record_texts, record_found)
            book = PlaceholderBook()
            for position, text, detections in zip(
                positions, record_texts, record_found, strict=True
            ):
                # Only the text and its counts: a record needs no ScrubResult (nor its
                # language, which costs a count of every letter of a Chinese text).
                scrubbed, spans = _replace(text, detections, book)
                summaries[index].update(span.entity_type for span in spans)
                _put(outputs[index], slots[position], scrubbed)
        for output, summary in zip(outputs, summaries, strict=True):
            output["pii"] = dict(sorted(summary.items()))
        return outputs


def _replace(
    text: str, results: list[RecognizerResult], book: PlaceholderBook
) -> tuple[str, list[ScrubbedSpan]]:
    """``text`` with ``results`` replaced by the book's placeholders, and the spans."""
    spans = [
        ScrubbedSpan(
            result.start,
            result.end,
            result.entity_type,
            f"<{book.placeholder(result.entity_type, text[result.start : result.end])}>",
        )
        for result in results
    ]
    return replace_spans(text, spans), spans


def replace_spans(text: str, spans: Sequence[ScrubbedSpan]) -> str:
    """``text`` with each span replaced by its placeholder, as Presidio's ``AnonymizerEngine``
    replaces sorted, non-overlapping results: neighbours with the same placeholder and only
    spaces between them become one placeholder."""
    pieces: list[str] = []
    position = 0
    previous: ScrubbedSpan | None = None
    for span in spans:
        gap = text[position : span.start]
        if (
            previous is not None
            and previous.placeholder == span.placeholder
            and _SPACES.fullmatch(gap)
        ):
            position = span.end
            continue
        pieces.append(gap)
        pieces.append(span.placeholder)
        position = span.end
        previous = span
    pieces.append(text[position:])
    return "".join(pieces)


def _chinese_given_name(name: str) -> str | None:
    """The two-character given name of a full Chinese name (李厚林 → 厚林), which friends use
    on its own; ``None`` for anything else."""
    if len(name) == 4 and name[:2] in COMPOUND_SURNAMES:
        given = name[2:]
    elif len(name) == 3 and name[0] in SINGLE_SURNAMES:
        given = name[1:]
    else:
        return None
    return given if _CJK_NAME.fullmatch(given) and given[0] != given[1] else None


def _latin_view(text: str, language: TextLanguage) -> str:
    """What the English rules and NER read: shouted text in title case, and for mixed
    text, CJK runs blanked out (same length, so offsets hold).

    spaCy's English tokenizer does not split "Smith见面", so it would miss the name.
    """
    text = _unshouted(text)
    if language is not TextLanguage.MIXED:
        return text
    return _CJK_RUN.sub(lambda m: " " * len(m.group()), text)


def _unshouted(text: str) -> str:
    """Words written in capitals in a row ("I LIVE FOR YOUR VLOGS ESTEE", "TANNER FOXX")
    in title case, as names are written in ordinary text, so that the casing rules and
    NER can tell them from words. Lone capitals ("NASA") and short words ("IRS", "ATM":
    acronyms more often than names) stay. Same length, so offsets hold."""
    if not _SHOUTED_RUN.search(text):
        return text
    return _SHOUTED_RUN.sub(
        lambda run: _SHOUTED_WORD.sub(lambda m: m.group()[0] + m.group()[1:].lower(), run.group()),
        text,
    )


def _whole_word_occurrences(text: str, part: str) -> Iterator[int]:
    """Start offsets of ``part`` in ``text`` not inside a longer Latin word."""
    start = text.find(part)
    while start >= 0:
        end = start + len(part)
        before = text[start - 1 : start]
        after = text[end : end + 1]
        if _CJK.match(part) or not (_is_letter(before) or _is_letter(after)):
            yield start
        start = text.find(part, end)


def _is_letter(ch: str) -> bool:
    return ch.isalpha() and not _CJK.match(ch)


def _texts_of(index: int, name: str, value: object) -> Iterator[tuple[_Slot, str]]:
    if isinstance(value, str):
        yield _Slot(index, name, None), value
    elif isinstance(value, list):
        for position, message in enumerate(value):
            if isinstance(message, str):
                yield _Slot(index, name, position), message
            elif isinstance(message, Mapping) and isinstance(message.get("content"), str):
                yield _Slot(index, name, position), message["content"]


def _copy(record: Mapping[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    """A copy deep enough that scrubbing never touches the caller's record."""
    output = dict(record)
    for name in fields:
        value = output.get(name)
        if isinstance(value, list):
            output[name] = [dict(m) if isinstance(m, Mapping) else m for m in value]
    return output


def _put(output: dict[str, Any], slot: _Slot, text: str) -> None:
    if slot.message is None:
        output[slot.field] = text
        return
    container = output[slot.field]
    if isinstance(container[slot.message], str):
        container[slot.message] = text
    else:
        container[slot.message]["content"] = text


_SPACY_COMPONENTS_NOT_NEEDED = (
    "tok2vec",
    "tagger",
    "parser",
    "attribute_ruler",
    "lemmatizer",
    "senter",
    "morphologizer",
)


BUILT_IN_RECOGNIZERS: tuple[type[CompiledPatternRecognizer], ...] = (
    EmailAddressRecognizer,
    PaymentCardRecognizer,
    IbanCodeRecognizer,
    IpAddressRecognizer,
    CredentialUrlRecognizer,
    SecretRecognizer,
    SocialSecurityNumberRecognizer,
    PhoneNumberRecognizer,
    ChineseMobileRecognizer,
    ChineseLandlineRecognizer,
    ChineseResidentIdRecognizer,
)
"""The pattern recognizers every scrubber registers (those of the settings' entities)."""


def build_registry(settings: ScrubberSettings) -> RecognizerRegistry:
    """A Presidio registry of the pattern recognizers: the built-in ones for the settings'
    entities, then those of ``settings.recognizers_yaml`` (Presidio's YAML format).

    The scrubber runs these on every text; :func:`analyzer_engine` serves them to
    Presidio's ``AnalyzerEngine`` and ``BatchAnalyzerEngine``. Names, street and Chinese
    addresses need spaCy or jieba and stay outside the registry.
    """
    registry = RecognizerRegistry(supported_languages=list(settings.languages))
    for recognizer in BUILT_IN_RECOGNIZERS:
        if recognizer.ENTITY in settings.entities:
            registry.add_recognizer(recognizer())
    if settings.recognizers_yaml is not None:
        registry.add_recognizers_from_yaml(settings.recognizers_yaml)
    return registry


def analyzer_engine(registry: RecognizerRegistry) -> AnalyzerEngine:
    """A Presidio ``AnalyzerEngine`` over the registry (no NLP engine: the registered
    recognizers need none); wrap it in ``BatchAnalyzerEngine`` to analyze lists."""
    languages = list(registry.supported_languages)
    return AnalyzerEngine(
        registry=registry,
        nlp_engine=NoOpNlpEngine(
            [{"lang_code": language, "model_name": "none"} for language in languages]
        ),
        supported_languages=languages,
    )


def build_scrubber(
    settings: ScrubberSettings | None = None, *, product_names: Iterable[str] = ()
) -> Scrubber:
    """Build a scrubber from settings: load spaCy (NER only) and jieba as the languages need.

    ``product_names`` (the deployment's: see :func:`feedback.pii.product_names.
    deployment_names`) are never scrubbed as a person, nor are the settings' product names
    and the built-in model families. Loading takes a second or two; build once and reuse.
    Works offline: the spaCy model is an installed package and tldextract uses its bundled
    public suffix list.
    """
    settings = settings or load_scrubber_settings()
    use_offline_suffix_list()
    entities = set(settings.entities)
    patterns = build_registry(settings).recognizers
    nlp = None
    english = "en" in settings.languages
    gazetteer = load_name_gazetteer()
    if english and "PERSON" in entities:
        import spacy

        nlp = spacy.load(settings.spacy_model, exclude=list(_SPACY_COMPONENTS_NOT_NEEDED))
        nlp.max_length = settings.max_text_chars + 1
        if nlp.path is not None:
            # WordNet's adjectives tell "I'm sorry" from "I'm Ann".
            gazetteer = gazetteer.with_lexicon(load_english_lexicon(str(nlp.path)))
        # Which words people write capitalised, and which are used like names.
        gazetteer = gazetteer.with_statistics(load_name_statistics())
    segmenter = chinese_names = chinese_addresses = None
    if "zh" in settings.languages and entities & {"PERSON", "STREET_ADDRESS"}:
        segmenter = ChineseSegmenter()
        segmenter.load()
        if "PERSON" in entities:
            chinese_names = ChineseNameRecognizer(segmenter)
        if "STREET_ADDRESS" in entities:
            chinese_addresses = ChineseAddressRecognizer(segmenter)
    street = StreetAddressRecognizer() if english and "STREET_ADDRESS" in entities else None
    return Scrubber(
        settings,
        nlp,
        patterns,
        gazetteer,
        street,
        chinese_names,
        chinese_addresses,
        segmenter,
        ProductNames((*BUILT_IN_PRODUCT_NAMES, *settings.product_names, *product_names)),
    )


def scrub_text(text: str, scrubber: Scrubber) -> ScrubResult:
    """Scrub one text with ``scrubber`` (see :meth:`Scrubber.scrub_text`)."""
    return scrubber.scrub_text(text)


def scrub_records(
    records: Sequence[Mapping[str, Any]], fields: Sequence[str], scrubber: Scrubber
) -> list[dict[str, Any]]:
    """Scrub ``fields`` of a batch of records (see :meth:`Scrubber.scrub_records`)."""
    return scrubber.scrub_records(records, fields)
