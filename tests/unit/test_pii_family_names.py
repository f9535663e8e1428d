"""A given name followed by a family name in another case, and names after a formal title.

Writers who type in lower case, or capitalise only part of a name ("bo Burnham"), leave
the family name to no casing rule: after a given name that is no English word, a word
used as a name (a known or typical surname, a word people mostly capitalise, or one the
corpus uses like names) is the rest of the name. After "mr", "mrs", "dr" or "prof", even
a lower-case English word is a name ("mr beast"); "ms" is milliseconds as often. The
sentences are written here, none taken from a benchmark set.
"""

from __future__ import annotations

import pytest

from feedback.pii import ScrubberSettings, build_scrubber
from feedback.pii.scrubber import Scrubber


@pytest.fixture(scope="module")
def scrubber() -> Scrubber:
    """One scrubber for the module (spaCy, jieba and the corpus statistics load once)."""
    return build_scrubber(ScrubberSettings())


@pytest.mark.parametrize(
    ("text", "leaked"),
    [
        # a given name, then a word the corpus uses like names, both in lower case
        ("omg did you hear what donald trump said today", "trump"),
        # a given name in lower case, the family name capitalised
        ("honestly olga Kowalczyk is the best teacher here", "Kowalczyk"),
        # after a formal title, a lower-case English word
        ("cant believe mr beast gave away a car", "beast"),
        ("dr phil was on again last night", "phil"),
    ],
)
def test_family_names_and_titled_words_are_found(
    scrubber: Scrubber, text: str, leaked: str
) -> None:
    result = scrubber.scrub_text(text)
    assert leaked not in result.text.split()
    assert result.summary.get("PERSON", 0) >= 1


@pytest.mark.parametrize(
    "text",
    [
        # "ms" after a number is milliseconds
        "we see 200 ms latency on the client",
        # a given name that is an English word starts no family name
        "is it harder to find work as a junior developer",
        # words that are also names, in ordinary use
        "the rose garden will open in may",
    ],
)
def test_words_after_a_unit_or_an_english_given_name_stay(scrubber: Scrubber, text: str) -> None:
    assert scrubber.scrub_text(text).text == text
