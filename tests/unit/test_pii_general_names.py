"""Names where people and news write them, beyond the cases the benchmark sets show.

Chinese news give a full name after a role (市长周建华) or before a verb of the news
(王芳当选), and list names together (张三和李四); English chats shout in capitals, sign
with handles (@jenny_lee) and name stage artists (DJ Lantern). Ordinary text stays
intact: a word heading a line ("Urgent:"), code (``def``, ``@property``), a common noun
after a surname-like character (母狮子). Every sentence is written here, none taken from a
benchmark set."""

from __future__ import annotations

import pytest

from feedback.pii import ScrubberSettings, build_scrubber
from feedback.pii.scrubber import Scrubber


@pytest.fixture(scope="module")
def scrubber() -> Scrubber:
    return build_scrubber(ScrubberSettings())


@pytest.mark.parametrize(
    ("text", "name"),
    [
        # a full name right after a role, as news write it
        ("市长周建华表示，将加快地铁建设。", "周建华"),
        # after a role even a surname that is more often a word (温)
        ("总理温家栋考察了灾区。", "温家栋"),
        ("据发言人侯佳琪介绍，活动将持续三天。", "侯佳琪"),
        # a full name at a clause's start before a verb of the news
        ("【管振宇宣布退役】", "振宇"),
        # joined to a name already found
        ("苏晓棠和滕熙来出席了发布会。", "滕熙来"),
    ],
)
def test_chinese_names_in_news(scrubber: Scrubber, text: str, name: str) -> None:
    result = scrubber.scrub_text(text)
    assert name not in result.text
    assert result.summary.get("PERSON", 0) >= 1


@pytest.mark.parametrize(
    ("text", "name"),
    [
        # shouted: the words in capitals read in title case
        ("SHOUTOUT TO MY BOY DARNELL QUARTERMAINE", "QUARTERMAINE"),
        ("I LOVE THIS SONG SO MUCH, THANK YOU ZAINAB", "ZAINAB"),
        # a handle, whole
        ("thanks @jenny_lee for the help", "jenny_lee"),
        ("cc @dlopez42 and @mkim", "mkim"),
        # a stage name
        ("we danced to DJ Lantern all night", "Lantern"),
        # whose family member is named is a person, even a word
        ("Hope's husband called about the refund", "Hope"),
    ],
)
def test_english_names_as_people_type_them(scrubber: Scrubber, text: str, name: str) -> None:
    result = scrubber.scrub_text(text)
    assert name not in result.text
    assert result.summary.get("PERSON", 0) >= 1


@pytest.mark.parametrize(
    "text",
    [
        "小狮子问母狮子：幸福在哪里？母狮子说：在你的尾巴上。",
        "院长和同事们讨论了方案。",
        "记者和编辑都来了。",
        "市长热线接到市民反映的问题后，记者昨日前往现场。",
        "总经理办公室的通知已经发给各部门。",
        "PLEASE HELP, MY ORDER NEVER ARRIVED AND NASA CALLED",
        "CALL THE IRS NOW AND GO TO THE ATM",
        "Urgent: refund my order",
        "Update: still broken after the reset",
        "ping @support about it, or @everyone",
        "@property\ndef name(self):\n    return self._name",
        "use @app.get('/items') for the route",
        "the MC was great",
        "my friend's mom is nice, and Apple's family plan is cheap",
        "mail me at bob@example.com",
    ],
)
def test_ordinary_text_stays(scrubber: Scrubber, text: str) -> None:
    result = scrubber.scrub_text(text)
    assert "PERSON" not in result.summary, result.text
