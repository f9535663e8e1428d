"""Person names in English and other Latin-script text, beyond what spaCy's NER tags.

The small English model misses many foreign names, or tags them as an
organisation or a place. A gazetteer of given names and surnames (Faker's
lists for every Latin-script locale) turns such entities into persons, finds
untagged names after a known given name or a title, and catches lower-case
names after a cue such as "my name is". After "I'm", WordNet's adjectives and
adverbs (read from the spaCy model's lemmatizer tables) keep "I'm sorry" from
being taken for a name.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from presidio_analyzer import RecognizerResult


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_NAME_TOKEN = re.compile(r"[^\W\d_][^\W\d_'’-]*(?:['’-][^\W\d_]+)*")
_TITLES = frozenset(
    {"mr", "mrs", "ms", "miss", "mx", "dr", "prof", "sir", "madam", "mme", "mlle", "herr", "frau"}
)
_CUES = re.compile(
    r"(?:\bmy name is|\bname is|\bi am|\bi'm|\bim|\bcall me|\bcalled|\bnamed|\bname:|"
    r"\bthis is|\bsigned|\bregards,?|\bthanks,?|\bdear|\bhi|\bhello|\bhey|\bwith|\bby|"
    r"\bfollow up with|\bspeak to|\buser:)\s*$",
    re.IGNORECASE,
)
_SURNAME_ENDINGS = re.compile(
    r"(?:ová|ova|eva|ina|ská|ski|ska|sky|ský|cki|cka|wicz|vich|vić|ović|ević|ić|escu|eanu|enko|"
    r"chuk|czuk|yan|idis|poulos|akis|oglu|sson|ssen|dóttir|dottir|dze|shvili|ov|ev)$"
)
_STRONG_CUES = re.compile(
    r"(?:\bmy name is|\bname is|\bname\?|\bname:|\bcall me|\bcalls me|\bcalled|\bnamed|"
    r"\bfollow up with|\bsigned|\bi am|\bi'm|\bi’m)\s*$",
    re.IGNORECASE,
)
_SELF_CUES = re.compile(r"(?:\bi am|\bi'm|\bi’m|\bim)\s*$", re.IGNORECASE)
""""I am" / "I'm": a name may follow, but far more often an adjective ("I'm sorry")."""
_EVERYDAY_ADJECTIVES = _words(
    "sorry sure glad afraid fine ready sick tired done late busy free able unable aware alone "
    "okay ok new back here there home lost stuck curious worried scared excited interested "
    "confused happy sad mad upset angry pleased grateful thankful honest serious good great "
    "well right wrong certain positive unsure unhappy hungry thirsty sleepy cold hot bored "
    "annoyed frustrated disappointed concerned calling writing looking trying wondering "
    "going getting having hoping asking reaching following checking"
)
"""Words often said after "I'm", for when no English lexicon could be loaded."""
_SPEAKER = re.compile(r"(?m)^[\W_]*([A-Z][^\W\d_]+):")
_LIST = re.compile(
    r"(?:[^\W\d_][\w'’-]*,\s+){1,8}[^\W\d_][\w'’-]*,?\s+(?:and|&|or)\s+[^\W\d_][\w'’-]*"
)
_NOT_SPEAKERS = _words(
    "phone mobile desk fax email e-mail website web address name user bot note notes info q a "
    "re subject date time from to cc bcc tel cell office home work http https answer question"
)
_NER_TO_PERSON = frozenset({"ORG", "PRODUCT", "WORK_OF_ART", "NORP", "FAC", "EVENT", "LAW"})
_EXTRA_COMMON = _words(
    "love princess royal prince king queen lord lady angel christian sky rain storm star sun "
    "moon monday tuesday wednesday thursday friday saturday sunday january february march "
    "april may june july august september october november december spring summer autumn "
    "winter god jesus christ allah buddha bible church city county state river lake mountain "
    "island north south east west central new old great grand saint san santa st mount port "
    "fort university college school hospital bank company group team club party house home "
    "english french german spanish italian russian chinese japanese american british european "
    "african asian indian canadian australian mexican brazilian irish scottish dutch swiss "
    "happy merry lucky sweet honey baby darling dear love lovely pretty beautiful email mail "
    "phone call text ping fax ip url website web address card ssn iban tel mobile desk office "
    "contact user bot hi hello hey thanks thank please ok okay i'm i’m im i've i’ve i'll i’ll "
    "i'd i’d"
)


@dataclass(frozen=True)
class NameGazetteer:
    """Given names, surnames and common words, all case-folded."""

    given_names: frozenset[str]
    surnames: frozenset[str]
    common_words: frozenset[str]
    function_words: frozenset[str]
    """Stop words and greetings: never part of a name, even capitalised."""
    descriptive_words: frozenset[str] = _EVERYDAY_ADJECTIVES
    """Adjectives and adverbs (WordNet's, from the spaCy model, when it has them)."""
    english_words: frozenset[str] = frozenset()
    """Every English lemma the lexicon knows (nouns, verbs, adjectives, adverbs)."""
    verbs: frozenset[str] = frozenset()
    stop_words: frozenset[str] = frozenset()

    def is_listed_name(self, word: str) -> bool:
        """In the given-name or surname lists, even if also a common word ("April", "West")."""
        folded = word.casefold()
        return folded not in self.stop_words and (
            folded in self.given_names or folded in self.surnames
        )

    def is_listed_surname(self, word: str) -> bool:
        """In the surname lists, even if also a common word ("West", "Love"), but no stop word."""
        folded = word.casefold()
        return folded in self.surnames and folded not in self.stop_words

    def with_lexicon(self, lexicon: EnglishLexicon) -> NameGazetteer:
        """This gazetteer with an English lexicon added (see :func:`load_english_lexicon`)."""
        return replace(
            self,
            descriptive_words=lexicon.descriptive | _EVERYDAY_ADJECTIVES,
            english_words=lexicon.words,
            verbs=lexicon.verbs,
        )

    def is_descriptive(self, word: str) -> bool:
        """True for an adjective, an adverb or a verb's -ing/-ed form ("sorry", "writing")."""
        folded = word.casefold()
        if folded in self.descriptive_words:
            return True
        return any(stem in self.verbs for stem in _verb_stems(folded))

    def is_english_word(self, word: str) -> bool:
        """True for a word of the English lexicon or a common word."""
        folded = word.casefold()
        return (
            folded in self.english_words
            or folded in self.common_words
            or self.is_descriptive(folded)
            or (folded.endswith("s") and folded[:-1] in self.english_words)
        )

    def is_given_name(self, word: str) -> bool:
        """True for a given name that is not also a common English word."""
        folded = word.casefold()
        return folded in self.given_names and folded not in self.common_words

    def is_surname(self, word: str) -> bool:
        """True for a surname that is not also a common English word."""
        folded = word.casefold()
        return folded in self.surnames and folded not in self.common_words

    def is_surname_like(self, word: str) -> bool:
        """A known surname, or a word with a typical surname ending (-ová, -ski, -ović…)."""
        if self.is_surname(word):
            return True
        folded = word.casefold()
        return (
            len(folded) >= 5
            and folded not in self.common_words
            and folded not in self.given_names
            and _SURNAME_ENDINGS.search(folded) is not None
        )

    def is_function_word(self, word: str) -> bool:
        """True for a stop word or a word such as "Email" or "Dear" that never is a name."""
        return word.casefold() in self.function_words

    def is_common(self, word: str) -> bool:
        """True for a common English word (stop words, Faker's English word list, and more)."""
        return word.casefold() in self.common_words


def _latin_names(values: Iterable[object]) -> set[str]:
    names = set()
    for value in values:
        if (
            isinstance(value, str)
            and len(value) >= 2
            and value[0].isupper()
            and all(ch.isalpha() or ch in "-'" for ch in value)
            and all(ord(ch) < 0x250 for ch in value)
        ):
            names.add(value.casefold())
    return names


def _provider_lists(provider: type, prefix: str) -> list[object]:
    values: list[object] = []
    for attribute in dir(provider):
        if attribute.startswith(prefix):
            value = getattr(provider, attribute, None)
            if isinstance(value, (list, tuple, set, frozenset, dict)):
                values.extend(value)
    return values


@cache
def load_name_gazetteer() -> NameGazetteer:
    """Build the gazetteer from Faker's person providers (all locales) and spaCy's stop words.

    Cached: the lists are read once per process (about 0.1 s).
    """
    import faker.providers.person as person_providers
    from faker.providers.lorem.en_US import Provider as EnglishLorem
    from spacy.lang.en.stop_words import STOP_WORDS

    given: set[str] = set()
    surnames: set[str] = set()
    for module in pkgutil.iter_modules(person_providers.__path__):
        provider = importlib.import_module(f"{person_providers.__name__}.{module.name}").Provider
        given |= _latin_names(_provider_lists(provider, "first_name"))
        given |= _latin_names(_provider_lists(provider, "first_romanized"))
        surnames |= _latin_names(_provider_lists(provider, "last_name"))
        surnames |= _latin_names(_provider_lists(provider, "last_romanized"))
    common = {w.casefold() for w in STOP_WORDS} | {w.casefold() for w in EnglishLorem.word_list}
    common |= _EXTRA_COMMON
    stop_words = frozenset({w.casefold() for w in STOP_WORDS})
    return NameGazetteer(
        frozenset(given),
        frozenset(surnames),
        frozenset(common),
        stop_words | _EXTRA_COMMON,
        stop_words=stop_words,
    )


@dataclass(frozen=True)
class EnglishLexicon:
    """WordNet's lemmas as shipped in the spaCy model's lemmatizer tables, case-folded."""

    descriptive: frozenset[str]
    """Adjectives and adverbs."""
    verbs: frozenset[str]
    words: frozenset[str]
    """Every lemma and every irregular form."""


@cache
def load_english_lexicon(model_path: str) -> EnglishLexicon:
    """Read the lemmatizer tables of an installed spaCy model (``<model>/lemmatizer/lookups``).

    An empty lexicon when the model has none (the gazetteer then falls back to
    a short list of everyday adjectives). Cached; about 0.05 s.
    """
    from spacy.lookups import Lookups

    folder = Path(model_path) / "lemmatizer" / "lookups"
    empty = EnglishLexicon(frozenset(), frozenset(), frozenset())
    if not (folder / "lookups.bin").exists():
        return empty
    lookups = Lookups().from_disk(folder)
    if not lookups.has_table("lemma_index"):
        return empty
    index = lookups.get_table("lemma_index")

    def lemmas(pos: str) -> set[str]:
        values = index.get(pos) or []
        return {str(v).casefold() for v in values if "_" not in str(v)}

    words: set[str] = set()
    for pos in ("noun", "verb", "adj", "adv"):
        words |= lemmas(pos)
    if lookups.has_table("lemma_exc"):
        for forms in lookups.get_table("lemma_exc").values():
            if isinstance(forms, dict):
                words |= {str(f).casefold() for f in forms if "_" not in str(f)}
    return EnglishLexicon(
        frozenset(lemmas("adj") | lemmas("adv")), frozenset(lemmas("verb")), frozenset(words)
    )


def _verb_stems(word: str) -> list[str]:
    """Possible base forms of an -ing or -ed word: writing → writ, write; stopped → stop."""
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) > len(suffix) + 2:
            stem = word[: -len(suffix)]
            stems = [stem, stem + "e"]
            if len(stem) > 2 and stem[-1] == stem[-2]:
                stems.append(stem[:-1])
            if suffix == "ed" and stem.endswith("i"):
                stems.append(stem[:-1] + "y")
            return stems
    return []


@dataclass(frozen=True, slots=True)
class _Word:
    text: str
    start: int
    end: int

    @property
    def capitalised(self) -> bool:
        return self.text[0].isupper() and not (len(self.text) > 3 and self.text.isupper())


class PersonNameFinder:
    """Person names from spaCy entities plus gazetteer and cue rules."""

    ENTITY = "PERSON"

    def __init__(self, gazetteer: NameGazetteer) -> None:
        self.gazetteer = gazetteer

    def find(self, text: str, entities: Iterable[tuple[int, int, str]]) -> list[RecognizerResult]:
        """Names in ``text`` given spaCy's entities as ``(start, end, label)``."""
        results: list[RecognizerResult] = []
        for ent_start, ent_end, label in entities:
            trimmed = self._trim(text, ent_start, ent_end)
            if trimmed is None:
                continue
            start, end = trimmed
            span = text[start:end]
            if label == "PERSON":
                results.append(RecognizerResult(self.ENTITY, start, end, 0.85))
            elif label in _NER_TO_PERSON and self._looks_like_name(span):
                results.append(RecognizerResult(self.ENTITY, start, end, 0.6))
        results.extend(self._gazetteer_names(text))
        return results

    def _trim(self, text: str, start: int, end: int) -> tuple[int, int] | None:
        """Entity bounds without a possessive, common words at the edges, or e-mail/number parts.

        The small model sometimes runs a name into the next token ("Email ann@x.com").
        """
        words = [(m.start() + start, m.end() + start) for m in re.finditer(r"\S+", text[start:end])]

        def noise(bounds: tuple[int, int]) -> bool:
            word = text[bounds[0] : bounds[1]].strip(".,;:!?\"'()")
            return (
                not word
                or any(ch.isdigit() or ch == "@" for ch in word)
                or self.gazetteer.is_function_word(word)
                or (word.islower() and self.gazetteer.is_common(word))
            )

        while words and noise(words[0]):
            words.pop(0)
        while words and noise(words[-1]):
            words.pop()
        if not words:
            return None
        span = text[words[0][0] : words[-1][1]]
        span = span.removesuffix("'s").removesuffix("’s").rstrip(".,;:!?\"')")
        return words[0][0], words[0][0] + len(span)

    def _looks_like_name(self, span: str) -> bool:
        words = _NAME_TOKEN.findall(span)
        if not 1 <= len(words) <= 4 or not all(w[0].isupper() for w in words):
            return False
        if self.gazetteer.is_given_name(words[0]):
            return True
        return len(words) >= 2 and self.gazetteer.is_surname(words[-1])

    def _gazetteer_names(self, text: str) -> list[RecognizerResult]:
        words = [_Word(m.group(), m.start(), m.end()) for m in _NAME_TOKEN.finditer(text)]
        results = []
        index = 0
        while index < len(words):
            end_index = self._name_at(text, words, index)
            if end_index is not None:
                results.append(
                    RecognizerResult(self.ENTITY, words[index].start, words[end_index].end, 0.55)
                )
                index = end_index + 1
            else:
                index += 1
        results.extend(self._speakers(text))
        results.extend(self._lists(text, words))
        return results

    def _speakers(self, text: str) -> list[RecognizerResult]:
        """``Ubul: What a wife.`` -- a name labelling a line of dialogue."""
        return [
            RecognizerResult(self.ENTITY, m.start(1), m.end(1), 0.5)
            for m in _SPEAKER.finditer(text)
            if m.group(1).casefold() not in _NOT_SPEAKERS
            and not self.gazetteer.is_common(m.group(1))
        ]

    def _lists(self, text: str, words: list[_Word]) -> list[RecognizerResult]:
        """In "Hleb, Sheila, Donna and Shane", once two items are names, all of them are."""
        results: list[RecognizerResult] = []
        for match in _LIST.finditer(text):
            items = [w for w in words if match.start() <= w.start < match.end()]
            items = [w for w in items if w.text.casefold() not in {"and", "or"}]
            known = sum(
                self.gazetteer.is_given_name(w.text) or self.gazetteer.is_surname_like(w.text)
                for w in items
            )
            if known >= 2 and known * 2 >= len(items):
                results.extend(
                    RecognizerResult(self.ENTITY, w.start, w.end, 0.5)
                    for w in items
                    if not self.gazetteer.is_common(w.text)
                )
        return results

    def _self_named(self, word: _Word) -> bool:
        """After "I'm": a known given name, or a word that is not an English adjective.

        "I'm sorry", "I'm Sorry", "i'm writing" are not names; "I'm Ann",
        "i'm maria", "I'm Xochitl" are. A lower-case word must also not be an
        English word at all.
        """
        gazetteer = self.gazetteer
        if gazetteer.is_given_name(word.text):
            return True
        if gazetteer.is_descriptive(word.text):
            return False
        return word.capitalised or not gazetteer.is_english_word(word.text)

    def _name_at(self, text: str, words: list[_Word], index: int) -> int | None:
        """Index of the last word of a name starting at ``words[index]``, or ``None``."""
        word = words[index]
        gazetteer = self.gazetteer
        previous = words[index - 1].text.casefold().rstrip(".") if index else ""
        window = text[max(0, word.start - 25) : word.start]
        titled = previous in _TITLES and text[words[index - 1].end : word.start].strip(". ") == ""
        strong = _STRONG_CUES.search(window) is not None
        cued = titled or strong or _CUES.search(window) is not None
        if _SELF_CUES.search(window) and not self._self_named(word):
            return None
        following = words[index + 1] if index + 1 < len(words) else None
        adjacent = following is not None and _adjacent(text, word, following)
        if word.capitalised:
            starts = (
                gazetteer.is_given_name(word.text)
                or titled
                or (cued and not gazetteer.is_common(word.text))
                or (strong and gazetteer.is_listed_name(word.text))
                or (
                    adjacent
                    and following is not None
                    and following.capitalised
                    and not gazetteer.is_common(word.text)
                    and gazetteer.is_surname_like(following.text)
                )
            )
        else:
            starts = (
                len(word.text) >= 3
                and not gazetteer.is_common(word.text)
                and (
                    strong
                    or (
                        gazetteer.is_given_name(word.text)
                        and (
                            cued
                            or (
                                adjacent
                                and following is not None
                                and not following.capitalised
                                and gazetteer.is_surname_like(following.text)
                            )
                        )
                    )
                )
            )
        if not starts:
            return None
        last = index
        for following in words[index + 1 : index + 4]:
            if not _adjacent(text, words[last], following):
                break
            if len(following.text) == 1 and following.text.isalpha():
                last += 1  # a middle initial
                continue
            same_case = following.capitalised == word.capitalised
            if same_case and (
                gazetteer.is_surname_like(following.text)
                or (following.capitalised and not gazetteer.is_common(following.text))
                or (strong and not gazetteer.is_common(following.text))
            ):
                last += 1
                continue
            if (
                word.capitalised
                and following.capitalised
                and text[words[last].end : following.start] == " "
                and (
                    (strong and following.text.casefold() in gazetteer.surnames)
                    or (
                        gazetteer.is_listed_surname(following.text)
                        and gazetteer.is_given_name(words[last].text)
                    )
                )
            ):
                last += 1  # "Evan West", "Tina English": a surname that is also a word
                continue
            break
        if words[last].text.isalpha() and len(words[last].text) == 1 and last > index:
            last -= 1  # "benjamin a" ends before a dangling initial
        return last


def _adjacent(text: str, left: _Word, right: _Word) -> bool:
    gap = text[left.end : right.start]
    return gap.strip(" .") == "" and "\n" not in gap and len(gap) <= 3
