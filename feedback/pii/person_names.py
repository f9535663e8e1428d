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
import itertools
import pkgutil
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import NamedTuple

from presidio_analyzer import RecognizerResult


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_NAME_TOKEN = re.compile(r"[^\W\d_][^\W\d_'’-]*(?:['’-][^\W\d_]+)*")
_TITLES = frozenset(
    {"mr", "mrs", "ms", "miss", "mx", "dr", "prof", "sir", "madam", "mme", "mlle", "herr", "frau"}
    # Stage names: "DJ Switch", "Lil Sly", "MC Hammer".
    | {"dj", "mc", "lil"}
)
_FORMAL_TITLES = frozenset({"mr", "mrs", "dr", "prof"})
"""Titles after which even a lower-case English word is a name ("mr beast", "dr phil");
not "ms", which is milliseconds as often ("200 ms latency")."""
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


_INFORMAL_WORDS = _words(
    "lol lols lolz lmao lmfao rofl omg omfg wtf wth idk idc imo imho tbh tbf smh btw brb afk ikr "
    "fyi np thx ty tysm plz pls ppl bc cuz coz cos tho altho thru ya yah yea yeah yep yup nope "
    "nah naw bruh bro bros brah bae fam fav fave faves vid vids vlog vlogs vlogger vlogging "
    "selfie noob meme memes dope gonna wanna gotta kinda sorta dunno lemme gimme outta lotta "
    "sayin aight ayy ugh eww aww heh hehe haha yo yoo ooh ohh uh um umm hmm welp whoa woah wow "
    "oops yikes yay hooray hurray congrats gg subs subbed shoutout collab irl dm dms tl dr tldr "
    "okey kk xd xo xoxo luv ur wat wut wot cya ttyl hbd bday nvm ngl fr lowkey highkey iirc afaik "
    "smth sth gr8 m8 pov fomo yolo bestie sis lil ima imma finna tryna boi gurl cutie hun "
    "youtube youtuber youtubers iphone ipad ipod app apps emoji emojis online offline wifi "
    "hashtag retweet tweet tweets chatbot chatbots bot bots ai llm llms gpu gpus cpu api apis "
    "faq faqs login logout signup username usernames admin admins smartphone smartphones "
    "def elif const var func println printf init args kwargs str int bool len async await "
    "struct enum impl fn npm sudo repo json yaml html css sql regex config localhost"
)
"""Everyday chat words that the English lexicon lacks; never a name on their own."""
_AUXILIARIES = _words(
    "is isn was wasn has hasn had hadn will would does doesn did didn can could should must may "
    "might are aren were weren s"
)
_ELONGATED = re.compile(r"([^\W\d_])\1\1")
_LAUGHTER = re.compile(r"(?:[aeiou]?h+[aeiou]+)+h*|(?:he)+h?|(?:ja)+|l+o+l+[sz]?|l+m+f*a+o+|x+d+")


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
    places: frozenset[str] = frozenset()
    """Countries, states, provinces and cities (Faker's address lists, all locales)."""
    informal_words: frozenset[str] = frozenset()
    """Chat words: abbreviations, interjections, contractions written without apostrophe."""
    usually_capitalised: frozenset[str] = frozenset()
    """Words written capitalised far more often than not ("obama", "messi"): proper nouns."""
    often_capitalised: frozenset[str] = frozenset()
    """Words written capitalised clearly more often than not ("mason", "tanner")."""
    name_like: frozenset[str] = frozenset()
    """Words used the way given names and surnames are (see :func:`load_name_statistics`)."""
    known_words: frozenset[str] = frozenset()
    """The corpus's most frequent word forms, case-folded: what people write, names among them."""
    frequent_words: frozenset[str] = frozenset()
    """The most frequent of those: a word one typo from one of these is that word misspelt."""

    def is_place(self, word: str) -> bool:
        """True for a known country, state, province or city name."""
        return word.casefold() in self.places

    def is_informal_word(self, word: str) -> bool:
        """True for chat vocabulary: "lol", "bruh", "thats", "Awwwww", "hahaha"."""
        folded = word.casefold()
        return (
            folded in self.informal_words
            or _ELONGATED.search(folded) is not None
            or _LAUGHTER.fullmatch(folded) is not None
        )

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

    def with_statistics(self, statistics: NameStatistics) -> NameGazetteer:
        """This gazetteer with corpus statistics added (see :func:`load_name_statistics`)."""
        return replace(
            self,
            usually_capitalised=statistics.usually_capitalised,
            often_capitalised=statistics.often_capitalised,
            name_like=statistics.name_like,
            known_words=statistics.known_words,
            frequent_words=statistics.frequent_words,
        )

    def is_verb(self, word: str) -> bool:
        """True for an auxiliary or a form of a known verb ("is", "'s", "knew", "wears")."""
        folded = word.casefold()
        if folded in _AUXILIARIES or folded in self.verbs:
            return True
        return any(
            base in self.verbs for base in (*_verb_stems(folded), *_inflection_bases(folded))
        )

    def is_proper_noun(self, word: str) -> bool:
        """True for a word people mostly write capitalised ("obama", "lenovo")."""
        return word.casefold() in self.usually_capitalised

    def is_name_like(self, word: str) -> bool:
        """True for a word used in text the way given names and surnames are ("Trump")."""
        return word.casefold() in self.name_like

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
            or any(base in self.english_words for base in _inflection_bases(folded))
        )

    def is_misspelling(self, word: str) -> bool:
        """True for a longer word one typo away from an English word ("borring", "freinds").

        Short words are left out: "kaite" or "grian" are one typo from a word too;
        so are proper nouns and name-like words of the corpus statistics ("Kimmel").
        """
        folded = word.casefold()
        if (
            len(folded) < 6
            or not self.english_words
            or folded in self.usually_capitalised
            or folded in self.name_like
        ):
            return False
        return any(
            candidate in self.english_words or candidate in self.common_words
            for candidate in _one_edit(folded)
        )

    def is_known_word(self, word: str) -> bool:
        """True for a frequent word form of the corpus, an English word or a chat word."""
        folded = word.casefold()
        return (
            folded in self.known_words
            or self.is_english_word(folded)
            or self.is_informal_word(folded)
        )

    def is_rare_word(self, word: str) -> bool:
        """True for a word the corpus hardly knows and no typo of a frequent word.

        In lower-case chat, most such words are names no list holds ("kunjana");
        the rest are misspellings, foreign words and coinages. False when no corpus
        statistics were loaded.
        """
        folded = word.casefold()
        if not self.known_words or folded in self.known_words:
            return False
        if any(
            folded[:cut] in self.frequent_words and folded[cut:] in self.frequent_words
            for cut in range(4, len(folded) - 3)
        ):
            return False  # a compound of two frequent words: "tilework", "hydropower"
        return not any(candidate in self.frequent_words for candidate in _one_edit(folded))

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
    import faker.providers.address as address_providers
    import faker.providers.person as person_providers
    from faker.providers.lorem.en_US import Provider as EnglishLorem
    from spacy.lang.en.stop_words import STOP_WORDS
    from spacy.lang.en.tokenizer_exceptions import TOKENIZER_EXCEPTIONS

    given: set[str] = set()
    surnames: set[str] = set()
    for module in pkgutil.iter_modules(person_providers.__path__):
        provider = importlib.import_module(f"{person_providers.__name__}.{module.name}").Provider
        given |= _latin_names(_provider_lists(provider, "first_name"))
        given |= _latin_names(_provider_lists(provider, "first_romanized"))
        surnames |= _latin_names(_provider_lists(provider, "last_name"))
        surnames |= _latin_names(_provider_lists(provider, "last_romanized"))
    places: set[str] = set()
    for module in pkgutil.iter_modules(address_providers.__path__):
        provider = importlib.import_module(f"{address_providers.__name__}.{module.name}").Provider
        for attribute in ("countries", "cities", "states", "provinces", "regions", "counties"):
            places |= _latin_names(getattr(provider, attribute, None) or ())
    # "dont", "thats", "gonna": spaCy's tokenizer knows these apostrophe-less contractions.
    contractions = {k.casefold() for k in TOKENIZER_EXCEPTIONS if k.isalpha() and len(k) > 1}
    common = {w.casefold() for w in STOP_WORDS} | {w.casefold() for w in EnglishLorem.word_list}
    common |= _EXTRA_COMMON
    stop_words = frozenset({w.casefold() for w in STOP_WORDS})
    return NameGazetteer(
        frozenset(given),
        frozenset(surnames),
        frozenset(common),
        stop_words | _EXTRA_COMMON,
        stop_words=stop_words,
        places=frozenset(places - given),
        informal_words=frozenset(contractions | _INFORMAL_WORDS),
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


_INFLECTIONS = (
    ("ies", "y"),
    ("ves", "f"),
    ("men", "man"),
    ("es", ""),
    ("s", ""),
    ("er", ""),
    ("er", "e"),
    ("est", ""),
    ("est", "e"),
    ("ers", ""),
    ("ers", "e"),
    ("ly", ""),
)
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _inflection_bases(word: str) -> list[str]:
    """Possible bases of a plural, comparative or adverb: ladies → lady, newer → new."""
    return [
        word[: -len(suffix)] + base
        for suffix, base in _INFLECTIONS
        if word.endswith(suffix) and len(word) > len(suffix) + 2
    ]


def _one_edit(word: str) -> Iterator[str]:
    """Every string one deletion, transposition, substitution or insertion from ``word``."""
    for i in range(len(word) + 1):
        head, tail = word[:i], word[i:]
        if tail:
            yield head + tail[1:]
        if len(tail) > 1:
            yield head + tail[1] + tail[0] + tail[2:]
        for letter in _LETTERS:
            if tail:
                yield head + letter + tail[1:]
            yield head + letter + tail


@dataclass(frozen=True)
class NameStatistics:
    """What word frequencies and word clusters of a large English corpus say about names."""

    usually_capitalised: frozenset[str]
    often_capitalised: frozenset[str]
    name_like: frozenset[str]
    known_words: frozenset[str] = frozenset()
    frequent_words: frozenset[str] = frozenset()


_CAPITALISED_LOG_RATIO = 1.0
"""Capitalised at least e (2.7) times as often as in lower case: a proper noun."""
_OFTEN_CAPITALISED_LOG_RATIO = 0.5
"""Capitalised at least 1.6 times as often: a proper noun if it is also a listed name."""
_NAME_CLUSTER_SHARE = 0.2
"""A word cluster in which at least this share of words are listed names holds names."""
_MIN_CLUSTER_SIZE = 20
_KNOWN_WORDS = 100_000
"""The corpus's most frequent word forms (of its 1,000,000): words people know and write."""
_FREQUENT_WORDS = 50_000
"""The forms a misspelling is most likely to be a typo of."""


@cache
def load_name_statistics() -> NameStatistics:
    """Read spaCy's English lexeme tables (``spacy-lookups-data``): word probabilities and
    Brown clusters computed on Reddit comments.

    A word whose capitalised form is far more frequent than its lower-case one is a
    proper noun even when typed in lower case. A Brown cluster groups words used in
    the same contexts; where Faker's names make up a good share of a cluster, its
    other words are used as names too. The most frequent word forms tell a word from a
    rare one and a typo of a frequent one. Empty when the package is not installed.
    Cached; about 1.6 s of CPU and 500 MB while reading, about 20 MB kept.
    """
    import gzip
    import importlib.resources
    from collections import defaultdict

    import orjson

    try:
        folder = importlib.resources.files("spacy_lookups_data") / "data"
    except ModuleNotFoundError:
        return NameStatistics(frozenset(), frozenset(), frozenset())
    gazetteer = load_name_gazetteer()
    # orjson reads these two 1,000,000-word tables twice as fast as json (same values).
    probabilities: dict[str, float] = orjson.loads(
        gzip.decompress((folder / "en_lexeme_prob.json.gz").read_bytes())
    )
    floor = min(probabilities.values())
    by_frequency = sorted(probabilities, key=probabilities.__getitem__, reverse=True)
    known = frozenset(w.casefold() for w in by_frequency[:_KNOWN_WORDS])
    frequent = frozenset(w.casefold() for w in by_frequency[:_FREQUENT_WORDS])
    del by_frequency
    ratios = {
        word.casefold(): probability - probabilities.get(word.lower(), floor)
        for word, probability in probabilities.items()
        if _title_word(word)
    }
    del probabilities
    clusters: dict[str, int] = orjson.loads(
        gzip.decompress((folder / "en_lexeme_cluster.json.gz").read_bytes())
    )
    members: defaultdict[int, list[str]] = defaultdict(list)
    for word, cluster in clusters.items():
        if cluster and _title_word(word):
            members[cluster].append(word.casefold())
    del clusters
    name_like: set[str] = set()
    for words in members.values():
        listed = sum(w in gazetteer.given_names or w in gazetteer.surnames for w in words)
        if len(words) >= _MIN_CLUSTER_SIZE and listed >= _NAME_CLUSTER_SHARE * len(words):
            name_like.update(words)
    return NameStatistics(
        frozenset(w for w, ratio in ratios.items() if ratio >= _CAPITALISED_LOG_RATIO),
        frozenset(w for w, ratio in ratios.items() if ratio >= _OFTEN_CAPITALISED_LOG_RATIO),
        frozenset(name_like),
        known,
        frequent,
    )


def _title_word(word: str) -> bool:
    return len(word) >= 2 and word.isalpha() and word[0].isupper() and word[1:].islower()


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


class _Word(NamedTuple):
    """One word of a text, where it is, and whether it is capitalised (not all capitals
    beyond three letters)."""

    text: str
    start: int
    end: int
    capitalised: bool


def _words_of(text: str) -> list[_Word]:
    # A tuple per word, built once per text: the rules look at each word many times.
    return [
        _Word(
            word := match.group(),
            match.start(),
            match.end(),
            word[0].isupper() and not (len(word) > 3 and word.isupper()),
        )
        for match in _NAME_TOKEN.finditer(text)
    ]


class PersonNameFinder:
    """Person names from spaCy entities plus gazetteer and cue rules."""

    ENTITY = "PERSON"

    def __init__(self, gazetteer: NameGazetteer) -> None:
        self.gazetteer = gazetteer
        self._misspellings: dict[str, bool] = {}
        self._rare_words: dict[str, bool] = {}

    def find(self, text: str, entities: Iterable[tuple[int, int, str]]) -> list[RecognizerResult]:
        """Names in ``text`` given spaCy's entities as ``(start, end, label)``."""
        return self.from_entities(text, entities) + self.from_rules(text)

    def from_rules(self, text: str, *, latin_script: bool = True) -> list[RecognizerResult]:
        """Names the gazetteer and the cue, chat and corpus rules find, without NER.

        ``latin_script``: the text is written in Latin script only. Within Chinese text,
        Latin words in lower case are brands and links more often than names, so the
        rule for a lower-case writer's rare words is left out. Nothing in code, and no lone
        acronym no name list knows (:meth:`from_entities` says why).
        """
        return [
            result
            for result in self._gazetteer_names(text, latin_script)
            if not self._not_a_name(text, result.start, result.end)
        ]

    def _not_a_name(self, text: str, start: int, end: int) -> bool:
        """An identifier in code (one word no name list knows: a name in a code comment or
        string, "Peter Novak" or "Peter", is still a name), a span holding code's brackets
        or operators ("logger.info(await client"), a lone acronym, or a thing's name."""
        span = text[start:end]
        identifier = " " not in span and not self.gazetteer.is_listed_name(span)
        return (
            (identifier and in_code(text, start, end))
            or _CODE_CHARACTERS.search(span) is not None
            or self._acronym(span)
            or self._thing_phrase(text, start, span)
        )

    def _thing_phrase(self, text: str, start: int, span: str) -> bool:
        """Capitalised words, the first no listed name, ending in an English word that no
        name list knows and the corpus never uses like a name, after a determiner, a place
        preposition or a verb of using or of a screen ("your Premium Plan", "tap Forgot
        Password"): a button, a plan or a product, not a person. A person's last word is a
        name ("Rose Baker": a listed surname; "Donald Trump": used like a name); a nickname
        is not after such a word ("like Bubble Boy"); a phrase that starts with a given name
        stays a person ("Jack Sparrow", and so "Aurora Backpack"): a name let through costs
        more than a product scrubbed."""
        words = _NAME_TOKEN.findall(span)
        if len(words) < 2 or not all(word[0].isupper() for word in words):
            return False
        first, last = words[0], words[-1]
        if not (
            not self.gazetteer.is_listed_name(first)
            and self.gazetteer.is_english_word(last)
            and not self.gazetteer.is_listed_name(last)
            and not self.gazetteer.is_proper_noun(last)
            and not self.gazetteer.is_name_like(last)
        ):
            return False
        tokens = _words_of(text)
        index = next((i for i, w in enumerate(tokens) if w.start == start), None)
        if index is None:
            return False
        before = tokens[index - 1].text.casefold() if index else ""
        return before in _UI_VERBS or self._after_thing_word(text, tokens, index)

    def from_entities(
        self, text: str, entities: Iterable[tuple[int, int, str]]
    ) -> list[RecognizerResult]:
        """Names among spaCy's entities: persons, and organisations or works that look like one.
        Not in code (an identifier is no name) and not a lone acronym no name list knows
        ("HDR", "USB"): the small model takes both for persons."""
        results: list[RecognizerResult] = []
        for ent_start, ent_end, label in entities:
            trimmed = self._trim(text, ent_start, ent_end)
            if trimmed is None:
                continue
            start, end = trimmed
            span = text[start:end]
            if self._not_a_name(text, start, end):
                continue
            if label == "PERSON" and not self._thing_not_person(text, start, span):
                results.append(RecognizerResult(self.ENTITY, start, end, 0.85))
            elif label in _NER_TO_PERSON and self._looks_like_name(span):
                results.append(RecognizerResult(self.ENTITY, start, end, 0.6))
        return results

    def _acronym(self, span: str) -> bool:
        """One word in capitals, three letters or more, that is no listed name: an acronym
        ("HDR", "NASA"), not a name typed in capitals ("JOHN" is listed). Two capitals are
        as often initials people go by ("AJ", "KK") as an acronym."""
        return (
            " " not in span
            and len(span) >= 3
            and span.isupper()
            and not self.gazetteer.is_listed_name(span)
        )

    def _thing_not_person(self, text: str, start: int, span: str) -> bool:
        """A one-word entity after "the", "on", "installed"... that no name list knows
        ("on Ubuntu", "the Python script"): the small model's person is a product."""
        if " " in span or self.gazetteer.is_listed_name(span):
            return False
        words = _words_of(text)
        index = next((i for i, w in enumerate(words) if w.start == start), None)
        return (
            index is not None
            and self._after_thing_word(text, words, index)
            and _SURNAME_ENDINGS.search(span.casefold()) is None
        )

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
                or (
                    self.gazetteer.is_common(word)
                    and (word.islower() or not self.gazetteer.is_listed_name(word))
                )
                or self.gazetteer.is_informal_word(word)
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

    def _gazetteer_names(self, text: str, latin_script: bool = True) -> list[RecognizerResult]:
        words = _words_of(text)
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
        results.extend(self._handles(text))
        results.extend(self._lists(text, words))
        results.extend(self._given_and_family(text, words))
        results.extend(self._informal_names(text, words, latin_script))
        return results

    def _informal_names(
        self, text: str, words: list[_Word], latin_script: bool = True
    ) -> list[RecognizerResult]:
        """Names as people type them in chats and comments, where NER is weakest.

        See :meth:`_informal_name` for the rules; a name found so also makes the
        unknown word it is coordinated with a name ("emma and kaite").
        """
        gazetteer = self.gazetteer
        writer: list[bool] = []

        def lower_case_writer() -> bool:
            # Judged once per text, and only when a rare word asks.
            if not writer:
                writer.append(latin_script and _writes_in_lower_case(text, words, gazetteer))
            return writer[0]

        found = [
            self._informal_name(text, words, index, lower_case_writer)
            or self._has_kin(text, words, index)
            for index in range(len(words))
        ]
        for index in [i for i, is_name in enumerate(found) if is_name]:
            for other in (index - 2, index - 1, index + 1, index + 2):
                if (
                    0 <= other < len(words)
                    and not found[other]
                    and _coordinated(text, words, index, other)
                    and self._may_be_name(words[other].text)
                ):
                    found[other] = True
        return [
            RecognizerResult(self.ENTITY, word.start, word.end, 0.45)
            for word, is_name in zip(words, found, strict=True)
            if is_name
        ]

    def _may_be_name(self, token: str) -> bool:
        """A known given name, or no English, chat, place or misspelt word."""
        gazetteer = self.gazetteer
        base = _POSSESSIVE.sub("", token)
        if gazetteer.is_given_name(base):
            return True
        return (
            len(base) >= 3
            and _name_shaped(base)
            and not gazetteer.is_english_word(base)
            and not gazetteer.is_informal_word(base)
            and not gazetteer.is_place(base)
            and not self._misspelt(base)
        )

    def _rare(self, word: str) -> bool:
        known = self._rare_words.get(word)
        if known is None:
            if len(self._rare_words) >= _MISSPELLING_CACHE:
                self._rare_words.clear()
            known = self._rare_words[word] = self.gazetteer.is_rare_word(word)
        return known

    def _misspelt(self, word: str) -> bool:
        known = self._misspellings.get(word)
        if known is None:
            if len(self._misspellings) >= _MISSPELLING_CACHE:
                self._misspellings.clear()
            known = self._misspellings[word] = self.gazetteer.is_misspelling(word)
        return known

    def _informal_name(
        self, text: str, words: list[_Word], index: int, lower_case_writer: Callable[[], bool]
    ) -> bool:
        """One word of informal text that is a name on its own (see the two cases)."""
        word = words[index]
        base = _POSSESSIVE.sub("", word.text)
        gazetteer = self.gazetteer
        if (
            len(base) < 3
            or _CONTRACTION.search(base) is not None
            or gazetteer.is_common(base)
            or gazetteer.is_informal_word(base)
            or gazetteer.is_function_word(base)
        ):
            return False
        if self._after_thing_word(text, words, index):
            # "the Sokolov novel" still names a person; "the Python script" does not.
            return word.capitalised and _SURNAME_ENDINGS.search(base.casefold()) is not None
        if word.capitalised:
            return self._capitalised_name(text, words, index, base)
        if base.isupper():
            return base.casefold() in gazetteer.given_names and not gazetteer.is_english_word(base)
        return base.islower() and self._lower_case_name(text, words, index, base, lower_case_writer)

    def _has_kin(self, text: str, words: list[_Word], index: int) -> bool:
        """ "Beauty's mother", "kapil's wife": whose family member is named is a person, even
        a word ("Hope", "Beauty"), if capitalised; a lower-case one must be no English word."""
        word = words[index]
        base = _POSSESSIVE.sub("", word.text)
        if base == word.text:
            possessive = _SPLIT_POSSESSIVE.match(text, word.end)
            after = possessive.end() if possessive else -1
        else:
            after = word.end
        if after < 0 or len(base) < 3 or not _KIN.match(text, after):
            return False
        gazetteer = self.gazetteer
        if (
            gazetteer.is_function_word(base)
            or gazetteer.is_informal_word(base)
            or gazetteer.is_place(base)
            or (index and words[index - 1].text.casefold() in _BEFORE_THINGS)
        ):
            return False
        return word.capitalised or (base.islower() and not gazetteer.is_english_word(base))

    @staticmethod
    def _after_thing_word(text: str, words: list[_Word], index: int) -> bool:
        """After a determiner, a place preposition or a verb of using, directly or through a
        list: a product, a tool or a place ("the Minecraft", "on Ubuntu", "installed Docker
        and Kubernetes"), unless it ends like a surname (-ov, -ski, -dóttir)."""
        for _ in range(4):
            if not index:
                return False
            previous = words[index - 1]
            gap = text[previous.end : words[index].start]
            folded = previous.text.casefold()
            if folded in _BEFORE_THINGS and gap.strip() == "":
                return True
            if folded in {"and", "or"} and gap.strip() == "" and index >= 2:
                index -= 2
            elif gap.strip() == "," and previous.text[:1].isupper():
                index -= 1
            else:
                return False
        return False

    def _capitalised_name(self, text: str, words: list[_Word], index: int, base: str) -> bool:
        """Inside a sentence, a capitalised word that is no English, chat or place word.

        Such a proper noun is, in chat text, most often a person ("you and Desi");
        so is a capitalised word used in a large corpus the way names are ("like
        Trump"), unless it is an adjective or a plural. At a sentence's start,
        where every word is capitalised, an unknown word counts ("Tebogo is
        cute"), and a name-like one that acts ("Trump will").
        """
        gazetteer = self.gazetteer
        word = words[index]
        if not _name_shaped(base) or gazetteer.is_place(base):
            return False
        english = gazetteer.is_english_word(base)
        name_like = (
            gazetteer.is_name_like(base)
            and base.casefold() not in gazetteer.descriptive_words
            and not _plural(base, gazetteer)
        )
        if _sentence_start(text, word.start):
            if not english:
                return not self._misspelt(base)
            return name_like and self._acts(text, words, index, base)
        return not english or name_like

    def _acts(self, text: str, words: list[_Word], index: int, base: str) -> bool:
        """True when the word is a possessive or a verb follows it ("kapil's", "momo is")."""
        word = words[index]
        following = words[index + 1] if index + 1 < len(words) else None
        return (
            base != word.text
            or _SPLIT_POSSESSIVE.match(text, word.end) is not None
            or (
                following is not None
                and _adjacent(text, word, following)
                and (
                    self.gazetteer.is_verb(following.text)
                    or _POSSESSIVE.search(following.text) is not None
                )
            )
        )

    def _lower_case_name(
        self,
        text: str,
        words: list[_Word],
        index: int,
        base: str,
        lower_case_writer: Callable[[], bool],
    ) -> bool:
        """A name typed in lower case.

        A word people mostly write capitalised that is a listed name or no English
        word ("thanks obama", "rick astley"); a known given name that is no
        English word ("notice gaby"), or one that is but is used like a name and
        written capitalised clearly more often ("help mason"); an unknown word (no
        English, chat, place or misspelt word) that does something ("momo is the best", "kapil's
        expression"), is greeted or compared ("better than klay") or spoken to ("wow
        edubes, your video"); and where the writer types in lower case (so would not
        capitalise a name either), a word the corpus hardly knows ("salute to kunjana").
        """
        gazetteer = self.gazetteer
        folded = base.casefold()
        english = gazetteer.is_english_word(base)
        if gazetteer.is_proper_noun(base) and (
            not english or folded in gazetteer.given_names or gazetteer.is_name_like(base)
        ):
            return True
        if english:
            return (
                folded in gazetteer.given_names
                and gazetteer.is_name_like(base)
                and folded in gazetteer.often_capitalised
            )
        if folded in gazetteer.given_names:
            return True
        if gazetteer.is_place(base):
            return False
        if self._rare_word_alone(text, words, index, base) and lower_case_writer():
            return True
        return not self._misspelt(base) and self._acts_or_addressed(text, words, index, base)

    def _rare_word_alone(self, text: str, words: list[_Word], index: int, base: str) -> bool:
        """A rare word (see :meth:`NameGazetteer.is_rare_word`) of plain ASCII letters,
        a whole token (no link or file name), not after a preposition of place ("in
        begunje")."""
        return (
            base.isascii()
            and base.isalpha()
            and _standalone(text, words[index])
            and not (index and words[index - 1].text.casefold() in _BEFORE_PLACES)
            and self._rare(base)
        )

    def _acts_or_addressed(self, text: str, words: list[_Word], index: int, base: str) -> bool:
        """The word acts (see :meth:`_acts`), follows a greeting or a comparison, or is
        spoken to at a sentence's start or after an interjection."""
        gazetteer = self.gazetteer
        word = words[index]
        acts = self._acts(text, words, index, base)
        previous = words[index - 1] if index else None
        after_cue = (
            previous is not None
            and previous.text.casefold() in _ADDRESS_CUES
            and text[previous.end : word.start].strip() == ""
        )
        # "wow edubes, your video": spoken to, at a sentence's start or after an interjection
        # ("for phenome, you can" is a clause's end).
        vocative = (_VOCATIVE.match(text, word.end) is not None and _standalone(text, word)) and (
            _sentence_start(text, word.start)
            or (
                previous is not None
                and gazetteer.is_informal_word(previous.text)
                and text[previous.end : word.start].strip() == ""
            )
        )
        return acts or after_cue or vocative

    def _speakers(self, text: str) -> list[RecognizerResult]:
        """``Ubul: What a wife.`` -- a name labelling a line of dialogue."""
        return [
            RecognizerResult(self.ENTITY, m.start(1), m.end(1), 0.5)
            for m in _SPEAKER.finditer(text)
            if m.group(1).casefold() not in _NOT_SPEAKERS
            and not self.gazetteer.is_common(m.group(1))
            # "Urgent:", "Update:", "Warning:" head a line as names do; a word is no speaker.
            and (
                self.gazetteer.is_given_name(m.group(1))
                or not self.gazetteer.is_english_word(m.group(1))
            )
        ]

    def _handles(self, text: str) -> list[RecognizerResult]:
        """``@jenny_lee``, ``@MarkTwain42``: a user's handle names them as a name does.

        Not an e-mail address (a word before the @), a code decorator (``@property``,
        ``@app.get(``) or a handle that is an English word (``@support``, ``@everyone``).
        """
        if "@" not in text:
            return []
        results = []
        for match in _HANDLE.finditer(text):
            handle = match.group(1)
            line_start = text[: match.start()].rsplit("\n", 1)[-1].strip() == ""
            if _CALLED.match(text, match.end()) or (
                line_start and _LINE_END.match(text, match.end())
            ):
                continue
            if (
                handle.isalpha()
                and (
                    self.gazetteer.is_english_word(handle)
                    or self.gazetteer.is_common(handle)
                    or self.gazetteer.is_informal_word(handle)
                )
                and not self.gazetteer.is_given_name(handle)
            ):
                continue
            results.append(RecognizerResult(self.ENTITY, match.start(1), match.end(1), 0.5))
        return results

    def _given_and_family(self, text: str, words: list[_Word]) -> list[RecognizerResult]:
        """ "bo burnham", "donald trump", "olga krylova's": a given name that is no English
        word, then, one space on, a word used as a name (a known or typical surname, a word
        people mostly capitalise, or one the corpus uses like names), the two not both
        capitalised (that case is :meth:`_name_at`'s). Writers who type in lower case, or
        capitalise only part of a name, leave the family name out of the casing rules."""
        gazetteer = self.gazetteer
        results = []
        for first, second in itertools.pairwise(words):
            if (
                (first.capitalised and second.capitalised)
                or text[first.end : second.start] != " "
                or len(first.text) < 2
                or not gazetteer.is_given_name(first.text)
                or gazetteer.is_english_word(first.text)
                or first.text.casefold() in _BEFORE_PLACES
            ):
                continue
            family = _POSSESSIVE.sub("", second.text)
            if (
                len(family) < 3
                or not _name_shaped(family)
                or gazetteer.is_common(family)
                or gazetteer.is_function_word(family)
                or gazetteer.is_informal_word(family)
                or gazetteer.is_place(family)
            ):
                continue
            if (
                gazetteer.is_surname_like(family)
                or gazetteer.is_proper_noun(family)
                or gazetteer.is_name_like(family)
            ):
                end = second.start + len(family)
                results.append(RecognizerResult(self.ENTITY, first.start, end, 0.5))
        return results

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
        capitalised = word.capitalised
        common = gazetteer.is_common(word.text)
        # Most words start no name whatever precedes them (a short or common lower-case
        # word; a common capitalised word that is neither titled nor a listed name): the
        # cue patterns, searched for every other word, are not searched for these.
        if not capitalised and (len(word.text) < 3 or common):
            return None
        previous = words[index - 1].text.casefold().rstrip(".") if index else ""
        titled = previous in _TITLES and text[words[index - 1].end : word.start].strip(". ") == ""
        if capitalised and common and not titled and not gazetteer.is_listed_name(word.text):
            return None
        window = text[max(0, word.start - 25) : word.start]
        strong = _STRONG_CUES.search(window) is not None
        following = words[index + 1] if index + 1 < len(words) else None
        adjacent = following is not None and _adjacent(text, word, following)
        if capitalised:
            starts = (
                gazetteer.is_given_name(word.text)
                or titled
                or (not common and (strong or _CUES.search(window) is not None))
                or (strong and gazetteer.is_listed_name(word.text))
                or (
                    adjacent
                    and following is not None
                    and following.capitalised
                    and not common
                    and gazetteer.is_surname_like(following.text)
                )
            )
        else:
            starts = (
                strong
                or (
                    titled
                    and previous in _FORMAL_TITLES
                    and not gazetteer.is_informal_word(word.text)
                )
                or (
                    gazetteer.is_given_name(word.text)
                    and (
                        titled
                        or _CUES.search(window) is not None
                        or (
                            adjacent
                            and following is not None
                            and not following.capitalised
                            and gazetteer.is_surname_like(following.text)
                        )
                    )
                )
            )
        # "I'm sorry": after "I am" only a word that can be a name starts one.
        if not starts or (_SELF_CUES.search(window) and not self._self_named(word)):
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


_MISSPELLING_CACHE = 100_000
# Code in a text: a fenced block, closed (a stray fence must not exempt the rest of a text),
# and inline code. spaCy reads identifiers there as names ("from nio import", "MATRIX_ROOM").
_CODE_SPANS = re.compile(r"```.*?```|`[^`\n]+`", re.DOTALL)


def in_code(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` is code: inside a fenced block or inline code, or a call
    or an attribute ("send(", "client.login", "room.display_name": a parenthesis right after
    it, or a dot joining it to a lower-case identifier). A sentence's full stop, an initial
    ("J.Smith") and a user name ("peter_novak") are no code."""
    if text[end : end + 1] == "(":
        return True
    if text[start - 1 : start] == "." and _IDENTIFIER_BEFORE.search(text, 0, start - 1):
        return True
    if _IDENTIFIER_AFTER.match(text, end):
        return True
    if "`" not in text:
        return False
    return any(m.start() <= start and end <= m.end() for m in _CODE_SPANS.finditer(text))


_IDENTIFIER_BEFORE = re.compile(r"(?<![\w.])[a-z_][a-z0-9_]+\Z")
_IDENTIFIER_AFTER = re.compile(r"\.[a-z_][a-z0-9_]+\b")
# No name holds a bracket or an operator.
_CODE_CHARACTERS = re.compile(r"[(){}\[\]=;<>]")


_HANDLE = re.compile(r"(?<![\w.@/])@([A-Za-z][A-Za-z0-9_]{1,29})(?![\w@])")
_CALLED = re.compile(r"\(|\.[A-Za-z]")
"""After a handle, a call or an attribute make it code (``@app.get(``)."""
_LINE_END = re.compile(r"[ \t]*(?:\n|$)")
_CONTRACTION = re.compile(r"['’](?:t|re|ve|ll|d|m)$", re.IGNORECASE)
"""can't, you're, we'll: never a name (O'Brien and D'Angelo are)."""
_BEFORE_THINGS = _words(
    "the my your our their its this these those on in into onto inside via "
    "using use used uses install installed installs installing run runs ran running"
)
_UI_VERBS = _words("tap click select press choose pick toggle enable disable")
"""Verbs of a screen: what follows them is a button or a setting ("tap Forgot Password")."""
_POSSESSIVE = re.compile(r"['’]s$")
_KIN = re.compile(
    r"\s+(?:mother|mom|mum|mama|father|dad|papa|sister|brother|sis|bro|wife|husband|son|"
    r"daughter|girlfriend|boyfriend|gf|bf|fianc[eé]e?|parents|grandma|grandpa|"
    r"grandmother|grandfather|aunt|uncle|cousin|niece|nephew)\b",
    re.IGNORECASE,
)
"""A family member after a possessive: the possessor is a person."""
_SPLIT_POSSESSIVE = re.compile(r" ['’] ?s\b")
"""The possessive as a tokeniser leaves it ("Trump ' s"), detached from its word."""
_BEFORE_PLACES = _words("in at from near of de del la le du na")
"""Prepositions (some French, Spanish, Slavic) before a place's name: "flown in from chennai"."""
_VOCATIVE = re.compile(r"\s*,\s*(?:you|your|you're|you’re|youre|u|ur)\b", re.IGNORECASE)
"""A word set off by a comma before "you": the one spoken to ("nice one jess, you rock")."""
_ADDRESS_CUES = _words("thanks thank thx hey hi hello bye yo dear love miss than like with")
"""Words after which an unknown lower-case word is someone greeted, thanked or compared."""
_COORDINATORS = frozenset({"and", "or"})


def _coordinated(text: str, words: list[_Word], index: int, other: int) -> bool:
    """True for "A and B", "A & B", "A, B": the two words joined by one coordinator."""
    left, right = sorted((index, other))
    between = text[words[left].end : words[right].start]
    if right - left == 1:
        return between.strip() in {",", "&"}
    middle = words[left + 1].text.casefold()
    gap = between.replace(words[left + 1].text, " ", 1)
    return middle in _COORDINATORS and gap.strip(" ,") == ""


_CODE = re.compile(r"[{};=]|\(\)|</")
"""Braces, semicolons, assignments, calls, closing tags: code, whose names are no one's."""


def _writes_in_lower_case(text: str, words: list[_Word], gazetteer: NameGazetteer) -> bool:
    """True for an English text, not code, whose writer does not capitalise: it starts in
    lower case or writes the pronoun "i" so ("i think", "i'm"). Such a writer does not
    capitalise names either. English: at least half of its words are known words."""
    if not words or _CODE.search(text):
        return False
    lower = words[0].text[0].islower() or any(
        word.text in {"i'm", "i’m", "i've", "i’ve", "i'll", "i’ll", "i'd", "i’d"}
        or (
            word.text == "i"
            and position + 1 < len(words)
            and _adjacent(text, word, words[position + 1])
            and gazetteer.is_verb(words[position + 1].text)
        )
        for position, word in enumerate(words)
    )
    if not lower:
        return False
    known = sum(word.text.isascii() and gazetteer.is_known_word(word.text) for word in words)
    return 2 * known >= len(words)


_EDGE_PUNCTUATION = "\"'“”‘’()[]{}<>.,!?;:…*~"


def _standalone(text: str, word: _Word) -> bool:
    """True when the word is a whole token between spaces, give or take punctuation at its
    edges: not part of a link, an address, a hashtag or a code name ("sinaurl.cn")."""
    start, end = word.start, word.end
    while start and not text[start - 1].isspace():
        start -= 1
    while end < len(text) and not text[end].isspace():
        end += 1
    return text[start:end].strip(_EDGE_PUNCTUATION) == word.text


def _plural(word: str, gazetteer: NameGazetteer) -> bool:
    folded = word.casefold()
    return (
        folded.endswith("s")
        and folded not in gazetteer.english_words
        and (folded[:-1] in gazetteer.english_words or folded[:-2] in gazetteer.english_words)
    )


_SENTENCE_END = re.compile(r"(?:^|[.!?…:;\n])[^\w]*$")
_CAMEL_PREFIX = re.compile(r"(?:Mc|Mac|O'|O’|De|Di|Da|Du|Le|La|Van|Von)[A-Z][a-z]+")


def _sentence_start(text: str, start: int) -> bool:
    """True when only punctuation, quotes or emoji separate ``start`` from a sentence's end."""
    return _SENTENCE_END.search(text, max(0, start - 12), start) is not None


def _name_shaped(token: str) -> bool:
    """One capital then lower case, or a surname prefix ("McAvoy", "LeBron"), not "GoPro"."""
    if not any(ch.isupper() for ch in token[1:]):
        return True
    return _CAMEL_PREFIX.fullmatch(token) is not None


def _adjacent(text: str, left: _Word, right: _Word) -> bool:
    gap = text[left.end : right.start]
    return gap.strip(" .") == "" and "\n" not in gap and len(gap) <= 3
