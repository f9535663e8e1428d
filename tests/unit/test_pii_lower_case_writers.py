"""Names typed in lower case by writers who capitalise nothing, and names spoken to.

A writer who starts in lower case or writes "i think" does not capitalise names either:
in their text, a word the corpus (spaCy's Reddit word frequencies) hardly knows, that is
no typo of a frequent word nor a compound of two, is most often a name no list holds.
Words that are also names ("will", "mark", "bill", "may", "rose") stay, and so do links,
code, places after a preposition, typos and Latin words inside Chinese text. The sentences
are written here, none taken from a benchmark set.
"""

from __future__ import annotations

import pytest

from feedback.pii import ScrubberSettings, build_scrubber
from feedback.pii.person_names import load_name_gazetteer, load_name_statistics
from feedback.pii.scrubber import Scrubber


@pytest.fixture(scope="module")
def scrubber() -> Scrubber:
    """One scrubber for the module (spaCy, jieba and the corpus statistics load once)."""
    return build_scrubber(ScrubberSettings())


@pytest.mark.parametrize(
    ("text", "name"),
    [
        # a writer who starts in lower case: a rare word is a name, doing nothing special
        ("salute to ngozika and the whole crew", "ngozika"),
        ("where is refilwe ?", "refilwe"),
        # a writer who writes "i" in lower case, the name anywhere in the text
        ("tell bongani i said hi", "bongani"),
        # spoken to: set off by a comma before "you", after an interjection
        ("Wow kelechukwu, your edits are amazing!", "kelechukwu"),
        ("lol mthunzi, you killed it", "mthunzi"),
    ],
)
def test_names_of_lower_case_writers_are_found(scrubber: Scrubber, text: str, name: str) -> None:
    result = scrubber.scrub_text(text)
    assert name not in result.text
    assert result.summary.get("PERSON", 0) >= 1


@pytest.mark.parametrize(
    "text",
    [
        # words that are also names, in ordinary use, by a lower-case writer
        "i will mark the bill paid in may, and water the roses too",
        "will you bill me in may? the price rose again",
        # typos of frequent words, and compounds of two
        "i realy liek this vidoe, the tilework is nice",
        # a link, a place after a preposition, code
        "i saw it on sinaurl.cn today",
        "i live in begunje now",
        "for i in range(n): ctx = foo()",
        # a writer who capitalises: a rare lower-case word alone is no name
        "The yorbik was late again.",
        # Latin words inside Chinese text are brands and links
        "我刚买了ipadmini，地址：http://t.cn/8ssohcv",
        # a clause's end before ", you" is nobody spoken to
        "If your language has no phenome, you can try another sound.",
    ],
)
def test_ordinary_text_of_lower_case_writers_stays(scrubber: Scrubber, text: str) -> None:
    result = scrubber.scrub_text(text)
    assert result.summary.get("PERSON", 0) == 0, result.text


def test_rare_words_are_neither_known_typos_nor_compounds() -> None:
    gazetteer = load_name_gazetteer().with_statistics(load_name_statistics())
    if not gazetteer.known_words:
        pytest.skip("spacy-lookups-data is not installed")
    assert gazetteer.is_rare_word("ngozika")
    # known words, typos of frequent words, compounds of two frequent words
    assert not gazetteer.is_rare_word("people")
    assert not gazetteer.is_rare_word("freinds")
    assert not gazetteer.is_rare_word("vidoe")
    assert not gazetteer.is_rare_word("tilework")
    assert gazetteer.is_known_word("will")
    assert gazetteer.is_known_word("lol")
