"""Each PII recognizer on its own: valid values are found, look-alikes with bad checks are not."""

from __future__ import annotations

import pytest
from faker import Faker

from feedback.pii.checksums import (
    cn_resident_id_check_char,
    cn_resident_id_valid,
    iban_valid,
    luhn_valid,
)
from feedback.pii.language import TextLanguage, cjk_share, detect_language
from feedback.pii.recognizers import (
    CredentialUrlRecognizer,
    EmailAddressRecognizer,
    IbanCodeRecognizer,
    IpAddressRecognizer,
    PaymentCardRecognizer,
    SecretRecognizer,
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


def found(recognizer: object, text: str) -> list[str]:
    """The texts a recognizer finds in ``text``."""
    return [text[r.start : r.end] for r in recognizer.analyze(text)]  # type: ignore[attr-defined]


def with_wrong_check_digit(number: str) -> str:
    """The same number with its last digit changed, so that a check digit fails."""
    last = number[-1]
    replacement = "0" if last in "X9" else str(int(last) + 1)
    return number[:-1] + replacement


@pytest.fixture(scope="module")
def segmenter() -> ChineseSegmenter:
    segmenter = ChineseSegmenter()
    segmenter.load()
    return segmenter


@pytest.fixture
def faker_zh() -> Faker:
    fake = Faker("zh_CN")
    fake.seed_instance(20240517)
    return fake


@pytest.fixture
def faker_en() -> Faker:
    fake = Faker("en_US")
    fake.seed_instance(20240517)
    return fake


# Chinese resident ID -----------------------------------------------------------------------


def test_resident_id_check_char_matches_the_standard_example() -> None:
    # GB 11643-1999 worked example: 11010519491231002X.
    assert cn_resident_id_check_char("11010519491231002") == "X"
    assert cn_resident_id_valid("11010519491231002X")
    assert cn_resident_id_valid("11010519491231002x")


def test_faker_resident_ids_are_found_in_chinese_text(faker_zh: Faker) -> None:
    recognizer = ChineseResidentIdRecognizer()
    for _ in range(20):
        number = faker_zh.ssn()
        assert cn_resident_id_valid(number)
        assert found(recognizer, f"我的身份证号是{number}，请核对。") == [number]


def test_resident_ids_with_a_wrong_check_digit_are_rejected(faker_zh: Faker) -> None:
    recognizer = ChineseResidentIdRecognizer()
    for _ in range(20):
        number = with_wrong_check_digit(faker_zh.ssn())
        assert not cn_resident_id_valid(number)
        assert found(recognizer, f"身份证{number}") == []


def test_resident_id_with_an_impossible_birth_date_is_rejected() -> None:
    first17 = "11010519490231002"  # 31 February
    number = first17 + cn_resident_id_check_char(first17)
    assert not cn_resident_id_valid(number)
    assert found(ChineseResidentIdRecognizer(), number) == []


# Cards -----------------------------------------------------------------------------------


def test_faker_credit_cards_pass_luhn_and_are_found(faker_en: Faker) -> None:
    recognizer = PaymentCardRecognizer()
    for _ in range(20):
        number = faker_en.credit_card_number()
        assert luhn_valid(number)
        assert found(recognizer, f"card {number} expires soon") == [number]


def test_cards_with_a_bad_luhn_digit_are_not_found(faker_en: Faker) -> None:
    recognizer = PaymentCardRecognizer()
    for _ in range(20):
        number = with_wrong_check_digit(faker_en.credit_card_number())
        assert not luhn_valid(number)
        assert found(recognizer, f"card {number}") == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("我的银行卡号是6222021234567890128，谢谢", ["6222021234567890128"]),
        ("卡号 6222 0212 3456 7890 128", ["6222 0212 3456 7890 128"]),
        ("Visa 4111-1111-1111-1111 please", ["4111-1111-1111-1111"]),
        ("银行卡6222021234567890127", []),
        ("order 0000000000000000", []),
    ],
)
def test_bank_cards_in_chinese_and_english_text(text: str, expected: list[str]) -> None:
    assert found(PaymentCardRecognizer(), text) == expected


# Chinese phone numbers -----------------------------------------------------------------------


def test_faker_mobile_numbers_are_found(faker_zh: Faker) -> None:
    recognizer = ChineseMobileRecognizer()
    for _ in range(20):
        number = faker_zh.phone_number()
        assert found(recognizer, f"我的手机{number}，随时联系") == [number]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("电话+86 138 1234 5678", ["+86 138 1234 5678"]),
        ("手机：139-1234-5678。", ["139-1234-5678"]),
        ("编号12345678901", []),  # starts with 12: not a mobile prefix
        ("订单号213812345678", []),  # longer digit run
    ],
)
def test_mobile_number_shapes(text: str, expected: list[str]) -> None:
    assert found(ChineseMobileRecognizer(), text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("办公室电话010-62345678转", ["010-62345678"]),
        ("座机(0755)82345678", ["(0755)82345678"]),
        ("请拨0571-8888 6666", ["0571-8888 6666"]),
        ("分机 021-55556666-123", ["021-55556666-123"]),
        ("房间号 0101", []),
    ],
)
def test_landline_numbers(text: str, expected: list[str]) -> None:
    assert found(ChineseLandlineRecognizer(), text) == expected


# Other identifiers -------------------------------------------------------------------------


def test_emails_need_a_public_suffix_and_work_next_to_chinese(faker_en: Faker) -> None:
    recognizer = EmailAddressRecognizer()
    email = faker_en.email()
    assert found(recognizer, f"write to {email}.") == [email]
    assert found(recognizer, "邮箱abc.def@example.com谢谢") == ["abc.def@example.com"]
    assert found(recognizer, "icon@2x.notatld") == []


def test_iban_checksum() -> None:
    assert iban_valid("GB82 WEST 1234 5698 7654 32")
    assert not iban_valid("GB82 WEST 1234 5698 7654 33")
    recognizer = IbanCodeRecognizer()
    assert found(recognizer, "IBAN gb82west12345698765432 ok") == ["gb82west12345698765432"]
    assert found(recognizer, "IBAN GB82WEST12345698765433") == []


def test_ip_addresses() -> None:
    recognizer = IpAddressRecognizer()
    assert found(recognizer, "from 192.168.10.254 and 2001:db8::8a2e:370:7334") == [
        "192.168.10.254",
        "2001:db8::8a2e:370:7334",
    ]
    assert found(recognizer, "version 999.1.2.3 at 12:30") == []


def test_credentials_in_urls() -> None:
    text = "clone https://bob:s3cret@git.example.com/repo.git now"
    assert found(CredentialUrlRecognizer(), text) == ["https://bob:s3cret@git.example.com/repo.git"]
    assert found(CredentialUrlRecognizer(), "see https://example.com/a:b") == []


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("my password is hunter2 and I cannot log in", "hunter2"),
        ("Password: Tr0ub4dor&3", "Tr0ub4dor&3"),
        ("my password is 'sunshine'.", "sunshine"),
        ("api_key=abc123xyz", "abc123xyz"),
        ("my PIN is 4821, can you unlock the card?", "4821"),
        ("the verification code is 839 201", "839 201"),
        ("CVV: 123", "123"),
        ("我的密码是abc12345，帮我登录", "abc12345"),
        ("验证码：839201。", "839201"),
        ("use sk-proj-abcDEF1234567890abcdef12345 now", "sk-proj-abcDEF1234567890abcdef12345"),
        ("key AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
        ("token ghp_16C7e42F292c6912E7710c838347Ae17", "ghp_16C7e42F292c6912E7710c838347Ae17"),
        (
            "auth eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N_XgL0",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N_XgL0",
        ),
        (
            "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n-----END PRIVATE KEY----- thanks",
            "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n-----END PRIVATE KEY-----",
        ),
    ],
)
def test_secrets_are_found_without_the_word_that_names_them(text: str, secret: str) -> None:
    assert found(SecretRecognizer(), text) == [secret]


@pytest.mark.parametrize(
    "text",
    [
        "my password is wrong and I cannot log in",
        "I forgot my password, can you reset it?",
        "the password-protected file will not open",
        "Your password must be at least 8 characters.",
        "the secret is to stay calm",
        "use discount code SAVE20 at checkout",
        "my zip code is 94103",
        "error code 404 on the page",
        "pin the tab to the top",
        "the security code on the back of the card",
        "密码错误，无法登录",
        "修改密码需要验证码",
        "Sure, here is how to reset your password: open settings and choose reset.",
        "a loss on the per-token log-ratios, averaged per token (sigmoid_norm)",
        "missing API key: send 'Authorization: Bearer <key>'",
        "the access token e.g. expires",
    ],
)
def test_talk_about_secrets_is_not_a_secret(text: str) -> None:
    assert found(SecretRecognizer(), text) == []


def test_us_ssn(faker_en: Faker) -> None:
    recognizer = SocialSecurityNumberRecognizer()
    ssn = faker_en.ssn()
    assert found(recognizer, f"my SSN is {ssn}") == [ssn]
    assert found(recognizer, "SSN 000-12-3456") == []
    assert found(recognizer, "social security number 123456789") == ["123456789"]
    assert found(recognizer, "order 123456789") == []


@pytest.mark.parametrize(
    "number",
    ["+41 (0)62 585 51 90", "(579)888-3058", "0489 25 37 29", "+1-903-140-4508x769", "5403926876"],
)
def test_international_phone_numbers(number: str) -> None:
    assert found(PhoneNumberRecognizer(), f"call me at {number}.") == [number]


@pytest.mark.parametrize("text", ["on 2023-05-17", "cost 1.000.000", "from 1990 2000", "in 1977"])
def test_numbers_that_are_not_phones(text: str) -> None:
    assert found(PhoneNumberRecognizer(), text) == []


@pytest.mark.parametrize(
    ("text", "address"),
    [
        (
            "Send it to 1600 Pennsylvania Avenue NW, Washington, DC 20500 today.",
            "1600 Pennsylvania Avenue NW, Washington, DC 20500",
        ),
        (
            "Meet me at 5100 Quadra 104\n Suite 845\n Evionnaz\n Switzerland 05377",
            "5100 Quadra 104\n Suite 845\n Evionnaz\n Switzerland 05377",
        ),
        ("He lives on Rua Diadema 1903.", "Rua Diadema 1903."),
        ("PSC 0729, Box 5797\nAPO AP 96854", "PSC 0729, Box 5797\nAPO AP 96854"),
        ("I live at 12 Main Street. Tomorrow I leave.", "12 Main Street."),
    ],
)
def test_street_addresses(text: str, address: str) -> None:
    assert max(found(StreetAddressRecognizer(), text), key=len) == address


# Chinese names and addresses ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("我叫赵新民，很高兴认识你", "赵新民"),
        ("感谢胡总的亲临", "胡总"),
        ("今天见到了王建国先生", "王建国"),
        ("@查小明 医生帅呆了", "查小明"),
        ("欧阳娜娜说她明天到", "欧阳娜娜"),
    ],
)
def test_chinese_names(segmenter: ChineseSegmenter, text: str, name: str) -> None:
    assert name in found(ChineseNameRecognizer(segmenter), text)


def test_faker_chinese_names_after_a_cue(segmenter: ChineseSegmenter, faker_zh: Faker) -> None:
    recognizer = ChineseNameRecognizer(segmenter)
    names = [faker_zh.name() for _ in range(30)]
    hits = sum(any(name in hit for hit in found(recognizer, f"我叫{name}，")) for name in names)
    assert hits >= 27


@pytest.mark.parametrize("text", ["今天天气很好，我们去公园散步吧", "这条路很长", "明白了"])
def test_plain_chinese_has_no_names_or_addresses(segmenter: ChineseSegmenter, text: str) -> None:
    assert found(ChineseNameRecognizer(segmenter), text) == []
    assert found(ChineseAddressRecognizer(segmenter), text) == []


@pytest.mark.parametrize(
    ("text", "address"),
    [
        (
            "寄到浙江省杭州市西湖区文三路478号华星时代广场A座1203室，谢谢",
            "浙江省杭州市西湖区文三路478号华星时代广场A座1203室",
        ),
        (
            "我家在北京市海淀区中关村大街27号院3号楼2单元501",
            "北京市海淀区中关村大街27号院3号楼2单元501",
        ),
    ],
)
def test_chinese_addresses(segmenter: ChineseSegmenter, text: str, address: str) -> None:
    assert found(ChineseAddressRecognizer(segmenter), text) == [address]


def test_faker_chinese_addresses(segmenter: ChineseSegmenter, faker_zh: Faker) -> None:
    recognizer = ChineseAddressRecognizer(segmenter)
    for _ in range(10):
        address = faker_zh.address()
        hits = found(recognizer, f"地址：{address}")
        assert hits, address
        assert address.split()[-1] in hits[-1]  # reaches the postcode


# Language ------------------------------------------------------------------------------------


def test_language_by_cjk_share() -> None:
    assert cjk_share("hello") == 0.0
    assert cjk_share("你好") == 1.0
    assert detect_language("Hello there") is TextLanguage.EN
    assert detect_language("你好，世界") is TextLanguage.ZH
    assert detect_language("我和John Smith见面") is TextLanguage.MIXED


# Traffic-simulator findings -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "PSC 9816, Box 4760, APO AA 22222",
        "PSC 0729, Box 5797\nAPO AP 96854",
        "Unit 1234 Box 5678, DPO AE 12345",
        "USNS Smith, FPO AP 12345",
        "USS Jones, FPO AE 12345",
        "USCGC Holmes FPO AA 16674",
    ],
)
def test_military_addresses_are_found_whole(text: str) -> None:
    assert found(StreetAddressRecognizer(), f"I live at {text}. Thanks") == [text]


@pytest.mark.parametrize(
    "address",
    [
        "14797 Smith Pike, Lake Jamesview, GU 09301",
        "116 Ballard Courts, Rossland, NH 01392",
        "87890 Ramirez Stravenue, Williamsport, KY 80503",
        "6697 Moss Fall, Johnsonfort, MO 98898",
        "55111 Delgado Crossroad, Port Kristine, VT 85094",
        "447 Karen River, Jamesbury, CA 88862",
    ],
)
def test_street_types_of_the_usps_list_and_their_plurals(address: str) -> None:
    assert found(StreetAddressRecognizer(), f"I live at {address}. My SSN is") == [address]


def test_faker_us_addresses_are_found_whole(faker_en: Faker) -> None:
    recognizer = StreetAddressRecognizer()
    for _ in range(100):
        address = faker_en.address().replace("\n", ", ")
        hits = found(recognizer, f"I live at {address}. Call me.")
        assert any(address in hit for hit in hits), (address, hits)


@pytest.mark.parametrize(
    "address",
    [
        "内蒙古自治区大冶县六枝特龙街B座 123456",
        "吉林省银川县安次关街E座 978117",
        "河北省玉兰县六枝特重庆街B座 450177",
        "香港特别行政区福州县城北戴街K座 874953",
        "天津市呼和浩特市秀英饶路w座 267707",
    ],
)
def test_chinese_addresses_from_the_province_on(segmenter: ChineseSegmenter, address: str) -> None:
    text = f"我的地址是{address}。我的手机号是13812345678。"
    assert found(ChineseAddressRecognizer(segmenter), text) == [address]


def test_faker_chinese_addresses_are_found_whole(
    segmenter: ChineseSegmenter, faker_zh: Faker
) -> None:
    recognizer = ChineseAddressRecognizer(segmenter)
    for _ in range(100):
        address = faker_zh.address().replace("\n", "")
        assert found(recognizer, f"我的地址是{address}。") == [address]


@pytest.mark.parametrize(
    "text",
    [
        "我的银行卡号是多少",  # 银行卡: jieba's dictionary tags it as a person
        "请填写申请书",
        "母亲节快乐",
        "一个小时以后出发，我的老师很好",
        "高高兴兴地回家，天天开心，我们慢慢走",
        "这只小狗很可爱，哈哈哈哈",
    ],
)
def test_chinese_common_words_are_not_names(segmenter: ChineseSegmenter, text: str) -> None:
    assert found(ChineseNameRecognizer(segmenter), text) == []


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("我叫郭想。", "郭想"),  # the given name is an ordinary word (想)
        ("我叫黄桂花。", "黄桂花"),
        ("我叫屈明，今年三十岁", "屈明"),  # jieba reads 叫屈
        ("大家都叫他老王。", "老王"),
        ("我是小K，很高兴认识你", "小K"),
        ("这件事问问芳姐吧", "芳姐"),
        ("今天带果果去公园", "果果"),
        ("感谢豆豆，感谢乐乐。", "豆豆"),
        ("昨天见到了王菲菲", "王菲菲"),
        ("我不厚道地笑了宋晚晚", "宋晚晚"),
    ],
)
def test_chinese_names_after_cues_and_pet_names(
    segmenter: ChineseSegmenter, text: str, name: str
) -> None:
    assert name in found(ChineseNameRecognizer(segmenter), text)


@pytest.mark.parametrize("text", ["我叫司机。", "我叫了外卖。", "他在叫屈。", "我叫车来。"])
def test_calling_for_something_is_no_name(segmenter: ChineseSegmenter, text: str) -> None:
    assert found(ChineseNameRecognizer(segmenter), text) == []
