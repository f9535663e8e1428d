"""Names as people type them in chats and comments, and ordinary text that must stay intact.

The scrubber is the real one (spaCy, Faker's name lists, the spaCy lookups corpus
statistics); the sentences are written here, not taken from a benchmark set.
"""

from __future__ import annotations

import random

import pytest
from presidio_anonymizer import AnonymizerEngine
from presidio_anonymizer.entities import RecognizerResult as AnonymizerResult

from feedback.pii import ScrubberSettings, build_scrubber
from feedback.pii.person_names import load_name_gazetteer, load_name_statistics
from feedback.pii.scrubber import ScrubbedSpan, Scrubber, replace_spans


@pytest.fixture(scope="module")
def scrubber() -> Scrubber:
    """One scrubber for the module (spaCy, jieba and the corpus statistics load once)."""
    return build_scrubber(ScrubberSettings())


@pytest.mark.parametrize(
    ("text", "name"),
    [
        # a lower-case given name that is no English word
        ("did you see what priya posted last night", "priya"),
        # a word people mostly write capitalised, typed in lower case after a thank-you
        ("thanks obama", "obama"),
        # a capitalised word inside a sentence that is no English, chat or place word
        ("We watched the match with Oduya and his cousin yesterday.", "Oduya"),
        # coordinated with a found name: an unknown word is a name too
        ("emma and tsholo went to the mall", "tsholo"),
        # a listed given name that is also a word, written capitalised far more often
        ("can you help mason with the boxes", "mason"),
        # a given name shouted in capitals
        ("THANK YOU MARVIN", "MARVIN"),
        # a capitalised word used in a large corpus the way names are
        ("not a Trump supporter at all", "Trump"),
        # an unknown lower-case word that acts, or is compared
        ("momo is the best", "momo"),
        ("he plays better than klay", "klay"),
        # a determiner before a surname-shaped word still leaves a person
        ("Unlike the Sokolov novel, it is short.", "Sokolov"),
        # a name-like word at a sentence's start with the possessive a tokeniser split off
        ("Trump ' s a stud", "Trump"),
    ],
)
def test_informal_names_are_found(scrubber: Scrubber, text: str, name: str) -> None:
    result = scrubber.scrub_text(text)
    assert name not in result.text
    assert result.summary.get("PERSON", 0) >= 1


@pytest.mark.parametrize(
    "text",
    [
        "I'm sorry, I can't make it to the meeting tomorrow.",
        "lol that was so funny, gonna watch it again tbh",
        "Thats awesome, congrats on the new job!",
        "Awwwww this is sooo cute hahaha",
        "The weather in Denmark was nice, we took the train to Copenhagen.",
        "Can you explain how photosynthesis works in simple terms?",
        "My React app stores its data in Postgres and Redis.",
        "I installed it on Ubuntu and the Python script runs fine.",
        "Please summarise this article about the European Central Bank and inflation.",
        "Beauty ' s only skin deep , they say",
    ],
)
def test_ordinary_text_stays_intact(scrubber: Scrubber, text: str) -> None:
    assert scrubber.scrub_text(text).text == text


def test_chat_words_places_and_misspellings_are_no_names() -> None:
    gazetteer = load_name_gazetteer()
    assert gazetteer.is_informal_word("lmao")
    assert gazetteer.is_informal_word("dont")  # spaCy's apostrophe-less contractions
    assert gazetteer.is_informal_word("Loooool")  # elongated
    assert gazetteer.is_informal_word("hahahaha")  # laughter
    assert gazetteer.is_place("Denmark")
    assert not gazetteer.is_place("Priya")


def test_corpus_statistics_tell_proper_nouns_and_name_like_words() -> None:
    statistics = load_name_statistics()
    assert "obama" in statistics.usually_capitalised
    assert "colors" not in statistics.usually_capitalised
    assert "martin" in statistics.name_like
    assert "table" not in statistics.name_like


def test_replace_spans_writes_what_presidio_anonymizer_writes() -> None:
    engine = AnonymizerEngine()  # type: ignore[no-untyped-call]
    rng = random.Random(7)
    for _ in range(500):
        text = "".join(rng.choice("ab  c,") for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 8))))
        spans = [
            ScrubbedSpan(start, end, "PERSON", f"<PERSON_{rng.randint(1, 2)}>")
            for start, end in zip(cuts[::2], cuts[1::2], strict=False)
            if end > start
        ]
        expected = (
            engine.anonymize(
                text, [AnonymizerResult(s.placeholder[1:-1], s.start, s.end, 1.0) for s in spans]
            ).text
            if spans
            else text
        )
        assert replace_spans(text, spans) == expected
