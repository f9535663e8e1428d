"""Chinese names that only their repetition or the dictionary gives away."""

from __future__ import annotations

import pytest

from feedback.pii.recognizers_zh import ChineseNameRecognizer, ChineseSegmenter


@pytest.fixture(scope="module")
def recognizer() -> ChineseNameRecognizer:
    segmenter = ChineseSegmenter()
    segmenter.load()
    return ChineseNameRecognizer(segmenter)


def spans(recognizer: ChineseNameRecognizer, text: str) -> list[tuple[int, int]]:
    return sorted((r.start, r.end) for r in recognizer.analyze(text))


def covered(recognizer: ChineseNameRecognizer, text: str, start: int, end: int) -> bool:
    """True when one found span holds ``text[start:end]`` whole."""
    return any(s <= start and end <= e for s, e in spans(recognizer, text))


def test_a_full_name_from_the_dictionary(recognizer: ChineseNameRecognizer) -> None:
    text = "他最喜欢金庸的小说"
    start = text.index("金庸")
    assert covered(recognizer, text, start, start + 2)


def test_a_name_found_once_is_replaced_everywhere(recognizer: ChineseNameRecognizer) -> None:
    text = "感谢佳怡，明天还要和佳怡一起去"
    first, second = text.index("佳怡"), text.rindex("佳怡")
    assert first != second
    assert covered(recognizer, text, first, first + 2)
    assert covered(recognizer, text, second, second + 2)


def test_a_given_name_character_standing_alone_again_and_again(
    recognizer: ChineseNameRecognizer,
) -> None:
    text = "婷讨厌莹，因为莹抢了她的位置，婷明里暗里地说莹，莹的朋友问婷为什么"
    for index, char in enumerate(text):
        if char in "婷莹":
            assert covered(recognizer, text, index, index + 1), (index, char)


def test_a_rare_doubled_verb_is_a_pet_name(recognizer: ChineseNameRecognizer) -> None:
    text = "视频上面解解和朋友牵手的时候"
    start = text.index("解解")
    assert covered(recognizer, text, start, start + 2)


@pytest.mark.parametrize(
    "text",
    [
        "我更新了微博客户端，转发微博就有机会，评论微博更有趣",  # 微/博 split, always together
        "当你强大了，你才会遇到比你强大的，因为强大",
        "她的包包和服装一样，包包很重要",  # 包 is a surname but 包包 a handbag
        "我们慢慢走，看看风景，想想明天，试试新菜",
        "胡萝卜洗净切丝，放入红辣椒和黑胡椒",  # jieba tags these as names
    ],
)
def test_ordinary_sentences_stay(recognizer: ChineseNameRecognizer, text: str) -> None:
    assert spans(recognizer, text) == []


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("如今小学生都喊着做中国的比尔．盖茨，可见", "比尔．盖茨"),
        ("贯穿我们的一生！——迈克尔·翁达杰《遥望》", "迈克尔·翁达杰"),
        ("林书豪力压勒布朗获东部周最佳", "勒布朗"),
        ("詹姆斯11号球衣，全新原盒", "詹姆斯"),  # frequent, and still a name
    ],
)
def test_transliterated_foreign_names(
    recognizer: ChineseNameRecognizer, text: str, name: str
) -> None:
    start = text.index(name)
    assert covered(recognizer, text, start, start + len(name))


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("coco小姐最爱香奈儿香水", "coco"),  # a Latin name before a title
        ("昨日，社区居委会主任杜长其透露，老人已送医", "杜长其"),  # before a verb of saying
        ("对南海杨知明说：补充一下", "杨知明"),  # 对…说 with a place before the person
    ],
)
def test_names_before_titles_and_speech(
    recognizer: ChineseNameRecognizer, text: str, name: str
) -> None:
    start = text.index(name)
    assert covered(recognizer, text, start, start + len(name))


@pytest.mark.parametrize(
    "text", ["我把PDF老师的课件下载了", "对大家说：谢谢", "他认真地对我们全体同学说明了情况"]
)
def test_no_names_from_latin_words_or_plain_speech(
    recognizer: ChineseNameRecognizer, text: str
) -> None:
    assert spans(recognizer, text) == []


def test_a_doubled_word_thanked_is_a_pet_name(recognizer: ChineseNameRecognizer) -> None:
    text = "感谢兔兔，感谢圆圆，感谢我们的相遇。"
    start = text.index("圆圆")
    assert covered(recognizer, text, start, start + 2)
    assert spans(recognizer, "谢谢大家，谢谢哈哈，好开心。") == []
