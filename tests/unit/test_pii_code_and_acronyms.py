"""Code and acronyms are no one's name: identifiers in a code block or called as a function,
and a lone word in capitals that no name list knows, stay as written; names around them,
in capitals or joined by an initial or an underscore, are still replaced."""

from __future__ import annotations

import pytest

from feedback.pii.person_names import in_code
from feedback.pii.scrubber import Scrubber, build_scrubber
from flywheel.settings.scrubber import ScrubberSettings


@pytest.fixture(scope="module")
def scrubber() -> Scrubber:
    """One scrubber for the module (spaCy, jieba and the corpus statistics load once)."""
    return build_scrubber(ScrubberSettings())


CODE = (
    "Here is the refactored version:\n\n```\nimport os\nimport asyncio\n"
    "from nio import AsyncClient, MatrixRoom\n\n_logger = get_logger()\n"
    'ELEM_ROOM = os.environ.get("ELEM_ROOM")\n\n# Add a callback for new messages\n'
    "# Log in to the server\nclient.add_event_callback(callback, MatrixRoom)\n```\n"
)


def test_identifiers_in_a_code_block_are_kept(scrubber: Scrubber) -> None:
    """Identifiers stay; a word a name list knows is still a name, even in a comment ("Add"
    is a surname: replaced, the price of keeping "Peter" in a code string replaced too)."""
    scrubbed = scrubber.scrub_text(CODE).text
    assert scrubbed == CODE.replace("# Add a callback", "# <PERSON_1> a callback")


@pytest.mark.parametrize(
    "text",
    [
        "HDR (High Dynamic Range): look for a TV that supports HDR and HDMI 2.1.",
        "The USB port and the NASA photo are on the left.",
        "Use `Session.close()` when done.",
        "Then call logger.info(await client.login(token)) and wait.",
    ],
)
def test_acronyms_and_inline_code_are_kept(scrubber: Scrubber, text: str) -> None:
    assert scrubber.scrub_text(text).text == text


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("Please call JOHN SMITH at the front desk.", "JOHN SMITH"),
        ("I met Peter Novak. He was kind.", "Peter Novak"),
        ("Signed, J.Smith", "Smith"),
        ("```\n# ask Peter Novak before merging\n```", "Peter Novak"),
        ('```\ncustomer = {"name": "Peter", "tier": 2}\n```', "Peter"),
        ("A stray ``` fence. Then I met Peter Novak.", "Peter Novak"),
    ],
)
def test_names_beside_code_rules_are_still_replaced(
    scrubber: Scrubber, text: str, name: str
) -> None:
    scrubbed = scrubber.scrub_text(text).text
    assert name not in scrubbed
    assert "<PERSON_1>" in scrubbed


@pytest.mark.parametrize(
    ("text", "word", "code"),
    [
        ("client.Login()", "Login", True),
        ("x = Foo.bar", "Foo", True),
        ("call Send(x)", "Send", True),
        ("I met Peter. He", "Peter", False),
        ("Signed, J.Smith", "Smith", False),
        ("Dr.Smith said so", "Smith", False),
        ("user peter_novak wrote", "peter", False),
        ("a `Foo` here", "Foo", True),
        ("```\nimport nio\n```", "nio", True),
        ("``` stray, then nio", "nio", False),
    ],
)
def test_what_counts_as_code(text: str, word: str, code: bool) -> None:
    start = text.index(word)
    assert in_code(text, start, start + len(word)) is code
