"""Chinese recognizers: phone numbers, resident IDs, person names and addresses.

Numbers are plain patterns with check digits. Names and addresses need word
boundaries, which come from jieba (loaded on first use, never at import).
jieba's own person tag (``nr``) finds only about half of the names people
write on social media, so names are also taken from @-mentions, from a
surname followed or preceded by a cue (a title, ``叫``, ``感谢``…), from
familiar forms (``老王``, ``小李``, ``芳姐``) and pet names (``兔兔``, ``王菲菲``).
A frequent ordinary word inside a dictionary "name" (``银行卡``) vetoes it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from presidio_analyzer import EntityRecognizer, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts

from feedback.pii.checksums import cn_resident_id_valid
from feedback.pii.recognizers import (
    ANY_DIGIT,
    CompiledPatternRecognizer,
    fuse_overlaps,
    has_context,
)
from feedback.pii.surnames_zh import COMPOUND_SURNAMES, GIVEN_NAME_CHARS, SINGLE_SURNAMES

_PHONE_CONTEXT = re.compile(r"电话|手机|座机|联系|致电|打给|拨打|号码|tel|phone|mobile|call", re.I)


class ChineseMobileRecognizer(CompiledPatternRecognizer):
    """Mainland mobile numbers (1[3-9]x xxxx xxxx), optionally with +86."""

    ENTITY = "PHONE_NUMBER"
    LANGUAGE = "zh"
    PREFILTER = ANY_DIGIT
    PATTERN = re.compile(
        r"(?<![0-9A-Za-z+])(?:(?:\+|00)86[ -]?)?1[3-9]\d(?:[ -]?\d{4}){2}(?![0-9A-Za-z])"
    )
    SCORE = 0.9


class ChineseLandlineRecognizer(CompiledPatternRecognizer):
    """Mainland landlines: area code 0xx or 0xxx (bracketed or not), 7 or 8 digits, extension."""

    ENTITY = "PHONE_NUMBER"
    LANGUAGE = "zh"
    PREFILTER = ANY_DIGIT
    PATTERN = re.compile(
        r"(?<![0-9A-Za-z])(?:(?:\+|00)86[ -]?)?(?:[(（]0?\d{2,3}[)）]|0\d{2,3})[ -]?"
        r"[2-9]\d{2,3}[ -]?\d{4}(?:-\d{1,5})?(?![0-9A-Za-z])"
    )
    SCORE = 0.7

    def score_match(self, match: re.Match[str], text: str) -> float | None:
        """Higher with a cue such as ``电话`` just before the number."""
        return 0.9 if has_context(text, match.start(), _PHONE_CONTEXT, window=12) else self.SCORE


class ChineseResidentIdRecognizer(CompiledPatternRecognizer):
    """18-character resident identity numbers with a real birth date and a valid check char."""

    ENTITY = "CN_RESIDENT_ID"
    LANGUAGE = "zh"
    PREFILTER = ANY_DIGIT
    PATTERN = re.compile(
        r"(?<![0-9A-Za-z])[1-9]\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])"
        r"\d{3}[0-9Xx](?![0-9A-Za-z])"
    )
    SCORE = 1.0

    def score_match(self, match: re.Match[str], text: str) -> float | None:
        """Keep only numbers whose check character (GB 11643) is right."""
        return self.SCORE if cn_resident_id_valid(match.group()) else None


@dataclass(frozen=True, slots=True)
class Token:
    """One jieba word with its part-of-speech flag and character offsets."""

    word: str
    flag: str
    start: int
    end: int


_SEGMENTED_BLOCKS = 50_000
"""Blocks whose segmentation a segmenter keeps (per kind; cleared when full)."""


class ChineseSegmenter:
    """jieba's part-of-speech segmenter, loaded on first use.

    The HMM that guesses unknown words is off: it is ten times slower, and
    unknown names are caught by the surname rules instead.

    jieba cuts a text into blocks (runs of Han characters, letters and digits, and what
    lies between them) and segments each block on its own, so the segmentation of a
    text is the concatenation of its blocks' segmentations. A block seen before (a
    greeting, a sentence of a template, the system prompt's clauses) is not segmented
    again: its words are kept by block, at most ``_SEGMENTED_BLOCKS`` of each kind.
    """

    def __init__(self) -> None:
        self._tokenizer: Any = None
        self._tagged: dict[str, tuple[tuple[str, str], ...]] = {}
        self._hmm_words: dict[str, tuple[str, ...]] = {}

    def _load(self) -> Any:
        if self._tokenizer is None:
            import jieba
            import jieba.posseg

            jieba.setLogLevel(logging.WARNING)
            self._tokenizer = _tagger(jieba.Tokenizer())
            self._tokenizer.tokenizer.initialize()
        return self._tokenizer

    def load(self) -> None:
        """Load jieba's dictionary now rather than on the first text."""
        self._load()

    def frequency(self, word: str) -> int:
        """How often ``word`` occurs in jieba's dictionary (0 when it is not a word)."""
        return int(self._load().tokenizer.FREQ.get(word, 0))

    def flag(self, word: str) -> str:
        """The dictionary's part-of-speech tag for ``word`` ("" when it has none)."""
        return str(self._load().word_tag_tab.get(word, ""))

    def is_common_word(self, word: str) -> bool:
        """A frequent dictionary word that the dictionary does not tag as a name or a place."""
        return self.frequency(word) >= _COMMON_PREFIX and self.flag(word) not in _PROPER_FLAGS

    def new_words(self, text: str) -> list[Token]:
        """Words jieba's HMM proposes that are not in its dictionary (often names)."""
        import jieba

        tokenizer = self._load().tokenizer
        known = self._hmm_words
        out: list[Token] = []
        position = 0
        for block in jieba.re_han_default.split(text):
            words = known.get(block)
            if words is None:
                words = tuple(tokenizer.cut(block, HMM=True))
                _remember(known, block, words)
            for word in words:
                end = position + len(word)
                if len(word) > 1 and word not in tokenizer.FREQ:
                    out.append(Token(word, "new", position, end))
                position = end
        return out

    def tokens(self, text: str) -> list[Token]:
        """Segment ``text`` into tagged tokens with offsets."""
        import jieba.posseg

        tagger = self._load()
        known = self._tagged
        out: list[Token] = []
        position = 0
        for block in jieba.posseg.re_han_internal.split(text):
            pairs = known.get(block)
            if pairs is None:
                pairs = tuple((pair.word, pair.flag) for pair in tagger.cut(block, HMM=False))
                _remember(known, block, pairs)
            for word, flag in pairs:
                end = position + len(word)
                out.append(Token(word, flag, position, end))
                position = end
        return out


def _tagger(tokenizer: Any) -> Any:
    """jieba's part-of-speech tagger over ``tokenizer`` (a fresh one, default dictionary).

    Importing ``jieba.posseg`` already read the default dictionary's tags for its own
    tagger (half a second); while jieba's default tokenizer is untouched (never loaded,
    so no word added), those are the default dictionary's tags and are copied.
    """
    import jieba
    import jieba.posseg

    default = jieba.dt
    if default.dictionary is not None or default.initialized:
        return jieba.posseg.POSTokenizer(tokenizer)
    tagger = jieba.posseg.POSTokenizer.__new__(jieba.posseg.POSTokenizer)
    tagger.tokenizer = tokenizer
    tagger.word_tag_tab = dict(jieba.posseg.dt.word_tag_tab)
    return tagger


def _remember(known: dict[str, Any], block: str, words: Any) -> None:
    if len(known) >= _SEGMENTED_BLOCKS:
        known.clear()
    known[block] = words


_HAN = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_HAN_CHAR = re.compile(f"[{_HAN}]")
_MENTION = re.compile(r"@([^\s@:：,，。.!！?？/\\()（）\[\]【】#“”\"'、;；~～〜|]{1,24})")
_SPEAK_TO = re.compile(f"对([{_HAN}]{{2,6}}?)说")
_TRANSLITERATION_CHARS = (
    "阿埃艾爱安巴贝比波伯布达丹德迪蒂杜多厄尔法菲费夫弗盖戈格古哈海汉赫亨胡华霍基吉加杰卡凯科克库"
    "拉莱兰劳勒雷里丽利莉连林琳卢鲁路伦罗洛马玛迈麦曼梅米敏莫姆默穆娜纳奈内尼妮诺帕佩皮普奇乔切萨塞"
    "桑瑟森沙莎尚舍施什史斯索塔泰汤特提托瓦威维温沃乌西希谢辛休雅亚扬伊因英尤约泽扎詹朱兹佐东朗茨"
)
"""Characters that transliterations of foreign names are written with."""
_TRANSLITERATION = re.compile(f"[{_TRANSLITERATION_CHARS}]{{3,8}}")
_DOTTED_NAME = re.compile(f"([{_TRANSLITERATION_CHARS}]{{2,5}})[·．・•]([{_HAN}]{{2,6}})")
"""比尔．盖茨, 迈克尔·翁达杰: the middle dot that joins the parts of a transliterated name."""
_SPECIFIC_TRANSLITERATION = frozenset(
    "埃贝蒂厄弗赫亨杰凯莱勒玛迈姆默娜纳奈妮诺帕佩瑟莎舍兹佐斯尔曼克"
)

_TITLES = frozenset(
    {
        "先生", "女士", "小姐", "老师", "医生", "大夫", "教授", "同学", "师傅", "师父", "阿姨",
        "叔叔", "大叔", "大爷", "爷爷", "奶奶", "姥姥", "外婆", "哥哥", "姐姐", "妹妹", "弟弟",
        "经理", "主任", "书记", "局长", "院长", "校长", "律师", "警官", "总监", "老板", "董事长",
        "总", "哥", "姐", "叔", "姨", "嫂", "童鞋", "君", "医师", "掌门", "大侠", "先森",
        "女神", "男神", "老公", "老婆", "姑娘", "欧巴", "妹子", "大神", "亲爱的",
    }
)  # fmt: skip
_NICKNAME_SUFFIXES = frozenset("哥姐子君叔")
_ADDRESS_FORMS = ("哥哥", "姐姐", "大人", "老师", "先生", "哥", "姐", "君", "叔", "总")
"""Forms of address said right after a name, longest first."""
_SIBLING_SUFFIXES = frozenset("哥姐")
_SURNAME_DOUBLED = re.compile(f"([{''.join(sorted(SINGLE_SURNAMES))}])(?=([{_HAN}])\\2)..")
_NAME_SUFFIXES = frozenset("哥姐君")
_NOUN_LIKE_FLAGS = frozenset({"n", "nr", "nrt", "ns", "nz", "ng", "g", "zg", "ag", "a", "j"})
_LATIN_NICKNAME = re.compile(r"(?<![A-Za-z])[小老阿][A-Z](?![A-Za-z0-9])")
_LATIN_BEFORE_TITLE = re.compile(
    r"(?<![A-Za-z0-9_@/.])([A-Za-z][a-z]{1,14})"
    r"(?=先生|女士|小姐|老师|同学|童鞋|医生|教授|欧巴|姐姐|哥哥)"
)
"""A name in Latin letters before a title; capitalised or all lower case, as chats write it."""
_FAMILIAR_PREFIXES = frozenset("小老阿")
_SPEECH_VERBS = ("说", "表示", "透露", "称", "指出", "认为", "告诉", "介绍", "回忆", "坦言")
_NEWS_VERBS = (
    *_SPEECH_VERBS, "强调", "宣布", "会见", "会晤", "出席", "访问", "拟", "涉嫌", "当选", "担任",
    "出任", "获得", "荣获", "回应", "证实", "承认", "否认", "呼吁", "发表", "接受", "率领", "辞职",
    "去世", "逝世", "称赞", "批评", "指责", "主演", "执导", "演唱", "夺得", "获",
)  # fmt: skip
"""Verbs that follow a person's full name in news and reports (李明宣布, 王芳当选)."""
_ROLES_BEFORE_NAMES = (
    "国家主席", "总书记", "委员长", "副总理", "总理", "总统", "主席", "首相",
    "部长", "省长", "市长", "县长", "区长", "镇长", "村长", "书记", "记者",
    "通讯员", "编辑", "委员", "议员", "大使", "发言人", "秘书长", "司令", "将军",
    "董事长", "总经理", "总裁", "经理", "主任", "局长", "院长", "校长", "厅长",
    "处长", "科长", "教练", "主教练", "导演", "演员", "歌手", "作家", "教授",
    "博士", "院士", "法官", "检察官", "律师", "医生", "警官", "民警", "队长",
    "选手", "球员", "主持人", "创始人", "嫌疑人", "患者", "村民", "市民", "网友",
    "同学", "老师", "作者", "摄影",
)  # fmt: skip
"""Roles written right before a full name in news (总理李克强, 记者王小明, 网友张三)."""
_CONNECTORS = ("和", "与", "、", "&", "＆", "及", "跟", "同")
"""Between two names of a list: 张三和李四, 炎亞綸＆郭雪芙."""
_NAMING_CUES = ("叫做", "名叫", "叫", "姓名", "名字是")
_NAMING_CUE = re.compile(r"(?:叫做|名叫|叫|名字是|名字叫|姓名)[:：]?\s*")
_FUNCTION_CHARS = frozenset(
    "的了是在我你他她它们这那个就也都说和与及或把被给对向从到为很太最还又再不没有吗呢吧啊呀哦哈嘿么"
    "着过得地上下里中来去会能要一二三四五六七八九十百千万亿第"
)
"""Particles, pronouns, prepositions, adverbs and numerals: never the given name after a cue."""
_THANKING_CUES = ("感谢", "谢谢", "致")
_AMBIGUOUS_SURNAMES = frozenset(
    "都来和那时但祝于元成花路白牛连万米干哈信安钱包熊华车乐向管冷官盘由甘强留温原帅国羊康容全边關修"
)
"""Surnames that are far more often ordinary words; they need stronger evidence."""
_NOT_DOUBLED = frozenset("心哈嘻呵嘿啦呜哇嗯哦啊嘛呀咯嘎哼噢喔泪爱棒笑赞萌汗亲衰顶頂晕怒困酷耶")
"""Interjections and the words of Weibo's emoticons ([汗], [亲亲], [衰]): doubled, no name."""


def _onomatopoeic(char: str) -> bool:
    """A character with the mouth radical 口 (哒, 咔, 噜, 哟) that no name list knows.

    Unicode orders CJK ideographs by radical: U+53E3 to U+56D6 is radical 30.
    Sound words are written with it; 吴, 周, 君, 哲 are too, so names are spared.
    """
    return (
        "\u53e3" <= char <= "\u56d6"
        and char not in GIVEN_NAME_CHARS
        and char not in SINGLE_SURNAMES
    )


def _doubled_name_char(char: str) -> bool:
    """A character that, doubled, can be a pet name (兔兔, 佳佳): no interjection or particle."""
    return (
        _is_han(char)
        and char not in _NOT_DOUBLED
        and char not in _NOT_GIVEN_NAME
        and not _onomatopoeic(char)
    )


def _repeated_on(text: str, start: int, end: int) -> bool:
    """True when the character doubled at ``start:end`` also stands right before or after it."""
    char = text[start]
    return text[start - 1 : start] == char or text[end : end + 1] == char


_NOT_GIVEN_NAME = frozenset(
    "的了是在我你他她它们这那个就也都说和与及或把被给对向从到为很太最还又再不没有吗呢吧啊呀哦哈嘿么"
    "着过得地上下里中来去会能要想看做年月日时分秒元块个位次天号一二三四五六七八九十百千万亿第"
)
_FUNCTION_FLAGS = frozenset(
    {"uj", "ul", "uz", "uv", "ud", "ug", "u", "y", "e", "o", "m", "eng", "r"}
)
_BOUND_FLAGS = frozenset(
    {"nr", "nrt", "g", "ng", "zg", "z", "x", "ag", "vg", "tg", "dg", "rg", "mg"}
)
"""Tags of characters the dictionary cannot place alone: a hint that they belong to a name."""
_NAME_CHAR_FLAGS = frozenset({"nr", "nrt", "ng", "g"})
_COMMON_WORD = 300
"""Dictionary frequency above which a word is an ordinary word rather than a name."""
_COMMON_PREFIX = 1000
"""Frequency from which a word inside a longer one shows that one to be a compound (银行+卡)."""
_PROPER_FLAGS = frozenset({"nr", "nrfg", "nrt", "ns", "nz", "nt"})
_RARE_WORD = 10
"""Dictionary frequency under which a word is too rare to be read as an ordinary one."""
_REPEATED_ALONE = 3
"""Times a given-name character must stand alone in one text to be taken as a name."""


def _is_han(text: str) -> bool:
    return bool(text) and all(_HAN_CHAR.match(ch) for ch in text)


def _likely_given(token: Token) -> bool:
    return token.word in GIVEN_NAME_CHARS or token.flag in _BOUND_FLAGS


def _noun_like(token: Token) -> bool:
    """A lone character tagged as a noun, an adjective or a bound morpheme (兔, 舟, 東)."""
    return token.flag in _NOUN_LIKE_FLAGS


def _name_capable(token: Token) -> bool:
    """A lone character that could sit inside a name."""
    return (
        len(token.word) == 1
        and token.flag not in _FUNCTION_FLAGS
        and token.word not in _NOT_GIVEN_NAME
        and _is_han(token.word)
    )


class _NameSpans(dict[tuple[int, int], float]):
    """Candidate name spans with the best score seen for each."""

    def add(self, start: int, end: int, score: float) -> None:
        if end > start and self.get((start, end), 0.0) < score:
            self[(start, end)] = score


class ChineseNameRecognizer(EntityRecognizer):
    """Chinese person names, @-mentions, nicknames and familiar forms (``老王``)."""

    ENTITY = "PERSON"

    def __init__(self, segmenter: ChineseSegmenter | None = None) -> None:
        self.segmenter = segmenter or ChineseSegmenter()
        super().__init__(supported_entities=[self.ENTITY], supported_language="zh")

    def load(self) -> None:
        """Load jieba's dictionary."""
        self.segmenter.load()

    def analyze(
        self,
        text: str,
        entities: list[str] | None = None,
        nlp_artifacts: NlpArtifacts | None = None,
    ) -> list[RecognizerResult]:
        """Find person names in ``text`` (Presidio's recognizer interface)."""
        if entities and self.ENTITY not in entities:
            return []
        return self.find(text, self.segmenter.tokens(text), self.segmenter.new_words(text))

    def find(
        self, text: str, tokens: list[Token], new_words: list[Token]
    ) -> list[RecognizerResult]:
        """Find person names given jieba's dictionary tokens and new (unknown) words."""
        found = _NameSpans()
        char_flags = {t.start: t.flag for t in tokens if len(t.word) == 1}
        for new_word in new_words:
            self._new_word(new_word, char_flags, found)
        self._mentions(text, found)
        self._patterns(text, tokens, found)
        self._latin_nicknames(text, found)
        for cue in _NAMING_CUE.finditer(text):
            # On characters: jieba often glues 叫 to the surname (叫屈, 叫安).
            self._surname_after_cue(text, cue.end(), found)
        for index, token in enumerate(tokens):
            word = token.word
            self._dictionary_name(token, found)
            if word in COMPOUND_SURNAMES or (len(word) == 1 and word in SINGLE_SURNAMES):
                self._after_surname(tokens, index, found)
            elif 2 <= len(word) <= 3 and (
                word[0] in SINGLE_SURNAMES or word[:2] in COMPOUND_SURNAMES
            ):
                self._surname_word(token, found)
            if len(word) == 1 and index + 1 < len(tokens):
                self._nickname(text, tokens, index, found)
                self._given_name_pair(tokens, index, found)
            elif len(word) == 2 and word[0] in _FAMILIAR_PREFIXES:
                self._familiar_word(token, found)
            elif token.flag not in {"a", "d", "v", "o", "y", "e"} or (
                self.segmenter.frequency(word) < _RARE_WORD and word[0] not in _AMBIGUOUS_SURNAMES
            ):
                # A doubled verb the dictionary barely knows (解解) is a pet name.
                self._doubled_word(text, token, found)
            if word in _TITLES and len(word) > 1 and index > 0:
                self._before_title(tokens, index, found)
            elif word in _NAME_SUFFIXES and index > 1:
                self._before_suffix(tokens, index, found)
            if word.endswith(_NAMING_CUES) and index + 1 < len(tokens):
                self._after_cue(tokens, index, found)
            elif word in _THANKING_CUES and index + 1 < len(tokens):
                self._after_thanks(text, tokens, index, found)
        self._surnames_before_pet_names(text, found)
        self._before_speech(text, found)
        self._after_roles(text, found)
        self._before_news_verbs(text, found)
        self._coordinated(text, found)
        self._repeated_single_names(text, tokens, found)
        self._forms_of_address(text, found)
        self._other_mentions(text, found)
        return [RecognizerResult(self.ENTITY, s, e, score) for (s, e), score in found.items()]

    def _before_speech(self, text: str, found: _NameSpans) -> None:
        """杜长其透露: a surname and one character found, one more before a verb of saying.

        News give a person's full name right before what they said; the given
        name's second character (其) is often a word of its own to the dictionary.
        """
        for (start, end), score in list(found.items()):
            following = text[end : end + 1]
            if (
                end - start == 2
                and text[start] in SINGLE_SURNAMES
                and _is_han(following)
                and following not in _NOT_GIVEN_NAME
                and text.startswith(_SPEECH_VERBS, end + 1)
            ):
                found.add(start, end + 1, score)

    def _full_name_at(
        self, text: str, start: int, lengths: tuple[int, ...] = (3, 2), *, cued: bool = False
    ) -> int:
        """End of a full name starting at ``start`` (a surname, then one or two given-name
        characters), trying ``lengths`` in order; ``start`` when there is none.

        The given name holds no particle, pronoun or numeral, nor is it a common noun
        (母狮子); the name is no common word of the dictionary, nor does it start with one
        (黄金, 方面, 高度).
        """
        surname = 2 if text[start : start + 2] in COMPOUND_SURNAMES else 1
        if surname == 1 and text[start : start + 1] not in SINGLE_SURNAMES:
            return start
        first_two = text[start : start + 2]
        if surname == 1 and (
            self.segmenter.is_common_word(first_two)
            or self.segmenter.flag(first_two) in {"ns", "nt", "nz"}
        ):
            return start
        # A surname that is more often a word (温, 和) needs given-name characters, unless a
        # role just before makes the person plain (总理温家宝).
        ambiguous = not cued and surname == 1 and text[start] in _AMBIGUOUS_SURNAMES
        for length in lengths:
            end = start + surname + length - 1
            name, given = text[start:end], text[start + surname : end]
            if (
                len(name) == end - start
                and _is_han(name)
                and not any(ch in _NOT_GIVEN_NAME or ch in _FUNCTION_CHARS for ch in given)
                and (not ambiguous or all(ch in GIVEN_NAME_CHARS for ch in given))
                and (
                    self.segmenter.frequency(name) < _COMMON_WORD
                    or self.segmenter.flag(name) in {"nr", "nrfg"}
                )
                and self.segmenter.flag(name) not in {"ns", "nt", "nz"}
                and not (self.segmenter.is_common_word(given) and self.segmenter.flag(given) == "n")
                and self._name_ends_at(text, end)
            ):
                return end
        return start

    def _name_ends_at(self, text: str, end: int) -> bool:
        """A name can end at ``end``: a verb of the news follows; or the name's last
        character makes no word with the next one (邬童获得: 获得) and what follows is no
        Han character, a particle, or a word of its own (报道, 今天)."""
        following = text[end : end + 1]
        if text.startswith(_NEWS_VERBS, end):
            return True
        if self.segmenter.is_common_word(text[end - 1 : end + 1]):
            return False
        return (
            not _is_han(following)
            or following in _NOT_GIVEN_NAME
            or following in _FUNCTION_CHARS
            or self.segmenter.is_common_word(text[end : end + 2])
        )

    def _after_roles(self, text: str, found: _NameSpans) -> None:
        """总理李克强, 记者王小明报道: a full name right after a role, as news write it."""
        for role in _ROLES_BEFORE_NAMES:
            position = text.find(role)
            while position >= 0:
                start = position + len(role)
                end = self._full_name_at(text, start, cued=True)
                if end > start:
                    found.add(start, end, 0.5)
                position = text.find(role, position + 1)

    def _before_news_verbs(self, text: str, found: _NameSpans) -> None:
        """陈光标拟筹, 王芳当选: a full name of three characters right before a verb that news
        write after a person, where a clause starts (the text's start, punctuation, a
        bracket, a space)."""
        for verb in _NEWS_VERBS:
            position = text.find(verb, 3)
            while position >= 0:
                start = position - 3
                before = text[start - 1 : start]
                if (start == 0 or not _is_han(before)) and (
                    self._full_name_at(text, start, (3,)) == position
                ):
                    found.add(start, position, 0.5)
                position = text.find(verb, position + 1)

    def _coordinated(self, text: str, found: _NameSpans) -> None:
        """张三和李四, 炎亞綸＆郭雪芙: a full name joined to a name already found.

        Lists name alike: the other name is taken at the found one's length first.
        """
        for (start, end), score in list(found.items()):
            length = end - start
            if not 2 <= length <= 3 or not _is_han(text[start:end]):
                continue
            lengths = (length, 5 - length)
            for connector in _CONNECTORS:
                if text.startswith(connector, end):
                    other = end + len(connector)
                    other_end = self._full_name_at(text, other, lengths)
                    if other_end > other:
                        found.add(other, other_end, min(score, 0.5))
                if text[:start].endswith(connector):
                    for size in lengths:
                        other = start - len(connector) - size
                        if other >= 0 and self._full_name_at(text, other, (size,)) == (
                            start - len(connector)
                        ):
                            found.add(other, start - len(connector), min(score, 0.5))
                            break

    def _other_mentions(self, text: str, found: _NameSpans) -> None:
        """嘉欣就系嘉欣: a name found once is the same name wherever else it is written.

        A post that names someone usually names them again, and the second
        mention often lacks the cue (a title, 叫, 感谢) that gave the first away.
        """
        for (start, end), score in list(found.items()):
            name = text[start:end]
            if not 2 <= len(name) <= 4 or not _is_han(name):
                continue
            position = text.find(name)
            while position >= 0:
                found.add(position, position + len(name), score)
                position = text.find(name, position + 1)

    def _repeated_single_names(self, text: str, tokens: list[Token], found: _NameSpans) -> None:
        """盈讨厌婷…婷抢了泽: a given-name character standing alone again and again.

        Stories call people by one character; the dictionary cannot join it to
        a word three times over unless it is used as a name. The character must
        be a typical given-name one, rare as a word on its own, and met beside
        different neighbours: always before the same character it is half of an
        unknown word (微博 split as 微/博, 強/大), not a name.
        """
        alone: dict[str, list[Token]] = {}
        for token in tokens:
            if (
                len(token.word) == 1
                and token.word in GIVEN_NAME_CHARS
                and _name_capable(token)
                and self.segmenter.frequency(token.word) < _COMMON_PREFIX
            ):
                alone.setdefault(token.word, []).append(token)
        for char, occurrences in alone.items():
            before = {text[t.start - 1 : t.start] for t in occurrences}
            after = {text[t.end : t.end + 1] for t in occurrences}
            if (
                len(occurrences) >= _REPEATED_ALONE
                and len(before) > 1
                and len(after) > 1
                and char not in before | after
            ):
                for token in occurrences:
                    found.add(token.start, token.end, 0.45)

    def _forms_of_address(self, text: str, found: _NameSpans) -> None:
        """宋茜姐姐, 阿明哥, 卫庄大人: the form of address right after a name goes with it.

        Said together they are how the person is called; leaving the suffix
        would keep half of a nickname (明哥) next to the placeholder.
        """
        for (start, end), score in list(found.items()):
            for form in _ADDRESS_FORMS:
                if text.startswith(form, end):
                    found.add(start, end + len(form), score)
                    break

    def _surnames_before_pet_names(self, text: str, found: _NameSpans) -> None:
        """陈芭芭, 王菲菲: a surname right before a doubled given name belongs to the name.

        Found on characters too, since jieba rarely keeps the pair together
        (宋/晚/晚起). Not when the surname character ends a word (感谢兔兔: 谢
        belongs to 感谢) nor inside a longer reduplication (高高兴兴).
        """
        for match in _SURNAME_DOUBLED.finditer(text):
            start, end = match.span()
            if (
                match.group(1) not in _AMBIGUOUS_SURNAMES
                and _doubled_name_char(match.group(2))
                and text[start - 1 : start] != match.group(1)
                and not _repeated_on(text, start + 1, end)
                and (start < 1 or self.segmenter.frequency(text[start - 1 : start + 1]) == 0)
                and self.segmenter.frequency(text[start + 1 : end]) < 100
            ):
                found.add(start, end, 0.45)
        for (start, end), score in list(found.items()):
            before = text[start - 1 : start]
            if (
                start >= 1
                and end - start == 2
                and text[start] == text[start + 1]
                and before in SINGLE_SURNAMES
                and before not in _AMBIGUOUS_SURNAMES
                and (start < 2 or self.segmenter.frequency(text[start - 2 : start]) == 0)
            ):
                found.add(start - 1, end, score)

    def _mentions(self, text: str, found: _NameSpans) -> None:
        """@handles identify a user; a long all-Chinese run keeps only its first word."""
        for match in _MENTION.finditer(text):
            start, end = match.span(1)
            handle = match.group(1)
            delimited = text[end : end + 1] in ("", " ", "@", ":", "：", "\n")
            if _is_han(handle) and len(handle) > 4 and not (delimited and len(handle) <= 8):
                first = self.segmenter.tokens(handle)[0].word
                end = start + (len(first) if 2 <= len(first) <= 4 else 3)
            found.add(start, end, 0.7)

    def _patterns(self, text: str, tokens: list[Token], found: _NameSpans) -> None:
        """对X说 (said to X) and transliterated foreign names (弗里曼, 兰德里).

        A run of transliteration characters counts when it holds a character
        used almost only in transliterations, or a word jieba's dictionary tags
        as a transliterated name (``nrt``: 兰德, 扎克).
        """
        for match in _SPEAK_TO.finditer(text):
            name = match.group(1)
            start, end = match.span(1)
            if len(name) > 4:
                # 对南海杨知明说: a place or a group before the person, who starts at a surname.
                start = next((end - n for n in (3, 2) if text[end - n] in SINGLE_SURNAMES), start)
                name = text[start:end]
                if len(name) > 4:
                    continue
            if self.segmenter.frequency(name) < _COMMON_WORD and name[0] not in "我你他她您大自":
                found.add(start, end, 0.5)
        transliterated = [t for t in tokens if t.flag == "nrt" and len(t.word) > 1]
        for match in _TRANSLITERATION.finditer(text):
            name = match.group()
            start, end = match.span()
            if (
                any(ch in _SPECIFIC_TRANSLITERATION for ch in name)
                or any(start <= t.start and t.end <= end for t in transliterated)
            ) and (
                self.segmenter.frequency(name) < _COMMON_WORD
                # A well-known foreign name is frequent and still a name (詹姆斯).
                or self.segmenter.flag(name) in {"nr", "nrt"}
            ):
                found.add(start, end, 0.45)
        for match in _DOTTED_NAME.finditer(text):
            start, end = match.span()
            parts = (match.group(1), match.group(2))
            if any(ch in _SPECIFIC_TRANSLITERATION for ch in match.group()) or any(
                start <= t.start and t.end <= end for t in transliterated
            ):
                found.add(start, end, 0.5)
            elif all(_TRANSLITERATION.fullmatch(part) for part in parts):
                found.add(start, end, 0.45)

    def _after_surname(self, tokens: list[Token], index: int, found: _NameSpans) -> None:
        """A lone surname followed by a title, a given name of loose characters, or a rare word."""
        surname = tokens[index]
        following = tokens[index + 1 : index + 3]
        if not following:
            return
        first = following[0]
        if first.word in _TITLES:
            found.add(surname.start, first.end, 0.6)
            return
        ambiguous = surname.word in _AMBIGUOUS_SURNAMES
        if _name_capable(first) and first.word != surname.word:
            second = following[1] if len(following) > 1 else None
            if second is not None and _name_capable(second):
                given = (first, second)
                if all(t.word in GIVEN_NAME_CHARS for t in given) or (
                    not ambiguous and any(_likely_given(t) for t in given)
                ):
                    found.add(surname.start, second.end, 0.55)
            elif first.word in GIVEN_NAME_CHARS or not ambiguous:
                found.add(surname.start, first.end, 0.5)
            return
        if (
            not ambiguous
            and len(first.word) == 2
            and _is_han(first.word)
            and (
                all(ch in GIVEN_NAME_CHARS for ch in first.word)
                or first.flag in {"ns", "nr", "nrt", "nz"}
            )
            and self.segmenter.frequency(first.word) < _COMMON_WORD
        ):
            found.add(surname.start, first.end, 0.5)

    def _new_word(self, token: Token, char_flags: dict[int, str], found: _NameSpans) -> None:
        """An unknown word that starts with a surname (杨素晗), or looks like a given name."""
        word = token.word
        surname = 2 if word[:2] in COMPOUND_SURNAMES else int(word[0] in SINGLE_SURNAMES)
        if not _is_han(word) or len(word) > 4:
            return
        if surname and word[0] not in _AMBIGUOUS_SURNAMES and 2 <= len(word) - surname + 1 <= 3:
            given = word[surname:]
            if given[0] != word[0] and not any(ch in _NOT_GIVEN_NAME for ch in given):
                found.add(token.start, token.end, 0.5)
        elif (len(word) == 2 and word[0] in GIVEN_NAME_CHARS and word[1] in _NICKNAME_SUFFIXES) or (
            len(word) == 2
            and all(
                ch in GIVEN_NAME_CHARS or char_flags.get(token.start + i) in _NAME_CHAR_FLAGS
                for i, ch in enumerate(word)
            )
        ):
            found.add(token.start, token.end, 0.45)

    def _dictionary_name(self, token: Token, found: _NameSpans) -> None:
        """金庸, 杨澜: a word jieba's dictionary lists as a full personal name (``nrfg``).

        Its plain ``nr`` and ``nrt`` tags are not used alone: they cover as many
        ordinary words (胡萝卜, 双子座, 威武) as names.
        """
        if token.flag == "nrfg" and len(token.word) >= 2 and _is_han(token.word):
            found.add(token.start, token.end, 0.5)

    def _surname_word(self, token: Token, found: _NameSpans) -> None:
        """A word tagged as a name that starts with a surname and is not a common word."""
        given = token.word[2:] if token.word[:2] in COMPOUND_SURNAMES else token.word[1:]
        if not given or token.flag not in {"nr", "nrfg"} or token.word[0] in _AMBIGUOUS_SURNAMES:
            return
        if self.segmenter.frequency(token.word) >= _COMMON_WORD or self._compound(token.word):
            return
        found.add(token.start, token.end, 0.5)

    def _compound(self, word: str) -> bool:
        """银行卡, 申请书: a common noun the dictionary mistags as a name.

        Its first two characters already make a frequent ordinary word, which
        a surname and a given-name character seldom do.
        """
        return len(word) == 3 and self.segmenter.is_common_word(word[:2])

    def _nickname(self, text: str, tokens: list[Token], index: int, found: _NameSpans) -> None:
        """小玲, 老王, 泽哥, 雯子, 兔兔: a familiar prefix, a suffix, or a doubled character.

        After 小/老/阿, a surname or a given-name character makes a name unless
        the pair is a common word (小时, 老师). Otherwise the pair must be rare
        in the dictionary (under 100), and before 哥/姐 any character will do
        when the pair is no dictionary word at all (舟哥); doubled, a given-name
        or noun-like character, or again a pair the dictionary lacks (兔兔),
        but no interjection or sound word (哒哒, 汗汗汗).
        """
        token, nxt = tokens[index], tokens[index + 1]
        if len(nxt.word) != 1:
            return
        pair = token.word + nxt.word
        if token.word in _FAMILIAR_PREFIXES:
            if (nxt.word in SINGLE_SURNAMES or nxt.word in GIVEN_NAME_CHARS) and not (
                self.segmenter.is_common_word(pair)
            ):
                found.add(token.start, nxt.end, 0.5)
            return
        if self.segmenter.frequency(pair) >= 100 or not _name_capable(token):
            return
        if (
            nxt.word in _NICKNAME_SUFFIXES
            and (
                token.word in GIVEN_NAME_CHARS
                or (nxt.word in _SIBLING_SUFFIXES and self.segmenter.frequency(pair) == 0)
            )
        ) or (
            nxt.word == token.word
            and _doubled_name_char(token.word)
            and (
                token.word in GIVEN_NAME_CHARS
                or _noun_like(token)
                or self.segmenter.frequency(pair) == 0
            )
            and not _repeated_on(text, token.start, nxt.end)
        ):
            found.add(token.start, nxt.end, 0.5)

    def _familiar_word(self, token: Token, found: _NameSpans) -> None:
        """老王, 小张: a familiar form the dictionary lists as one word, if not a common one."""
        word = token.word
        if word in _TITLES:
            return
        frequency = self.segmenter.frequency(word)
        if (
            word[1] in SINGLE_SURNAMES
            and word[1] not in _AMBIGUOUS_SURNAMES
            and frequency < _COMMON_WORD
        ) or (token.flag in {"nr", "nrfg", "nrt"} and frequency < 100):
            found.add(token.start, token.end, 0.5)

    def _given_name_pair(self, tokens: list[Token], index: int, found: _NameSpans) -> None:
        """嘉欣, 锦荣: exactly two loose characters, both typical of given names.

        The dictionary could not join them to a word or to their neighbours,
        which stand apart (a longer word, punctuation, a particle).
        """
        first, second = tokens[index], tokens[index + 1]
        if not all(
            len(t.word) == 1
            and _name_capable(t)
            and (t.word in GIVEN_NAME_CHARS or t.flag in _NAME_CHAR_FLAGS)
            for t in (first, second)
        ):
            return
        if first.word == second.word or not (
            first.word in GIVEN_NAME_CHARS and second.word in GIVEN_NAME_CHARS
        ):
            return
        neighbours = tokens[max(0, index - 1) : index] + tokens[index + 2 : index + 3]
        if any(len(t.word) == 1 and _name_capable(t) for t in neighbours):
            return
        if self.segmenter.frequency(first.word + second.word) < 100:
            found.add(first.start, second.end, 0.45)

    def _doubled_word(self, text: str, token: Token, found: _NameSpans) -> None:
        """圆圆, 佳佳, 猪猪: a doubled character that the dictionary does not know as a word."""
        word = token.word
        if (
            len(word) == 2
            and word[0] == word[1]
            and _doubled_name_char(word[0])
            and (word[0] in GIVEN_NAME_CHARS or word[0] in SINGLE_SURNAMES or token.flag == "n")
            and self.segmenter.frequency(word) < 100
            and not _repeated_on(text, token.start, token.end)
        ):
            found.add(token.start, token.end, 0.45)

    def _latin_nicknames(self, text: str, found: _NameSpans) -> None:
        """小V, 老K, 阿J: a familiar prefix before a single Latin capital; coco小姐,
        Amy老师: a Latin name right before a title of address."""
        for match in _LATIN_NICKNAME.finditer(text):
            found.add(*match.span(), 0.45)
        for match in _LATIN_BEFORE_TITLE.finditer(text):
            found.add(*match.span(1), 0.45)

    def _before_suffix(self, tokens: list[Token], index: int, found: _NameSpans) -> None:
        """逸桦君, 信琦哥: two loose given-name characters before 君, 哥 or 姐."""
        pair = tokens[index - 2 : index]
        if (
            all(
                len(t.word) == 1
                and _name_capable(t)
                and (t.word in GIVEN_NAME_CHARS or t.flag in _NAME_CHAR_FLAGS)
                for t in pair
            )
            and self.segmenter.frequency(pair[0].word + pair[1].word) < 100
        ):
            found.add(pair[0].start, tokens[index].end, 0.45)

    def _before_title(self, tokens: list[Token], index: int, found: _NameSpans) -> None:
        """倩萍小姐, 小丸子童鞋: two or three uncommon characters right before a title."""
        run: list[Token] = []
        for token in reversed(tokens[max(0, index - 3) : index]):
            if not _is_han(token.word) or token.word in _NOT_GIVEN_NAME:
                break
            if token.flag in _FUNCTION_FLAGS or self.segmenter.frequency(token.word) >= 100:
                break
            run.insert(0, token)
            if sum(len(t.word) for t in run) >= 2:
                break
        if 2 <= sum(len(t.word) for t in run) <= 3:
            found.add(run[0].start, run[-1].end, 0.5)

    def _after_thanks(self, text: str, tokens: list[Token], index: int, found: _NameSpans) -> None:
        """感谢兔兔，: after a thank-you, two or three rare characters closed by punctuation."""
        run: list[Token] = []
        for token in tokens[index + 1 : index + 4]:
            if not _is_han(token.word) or token.flag in _FUNCTION_FLAGS:
                break
            run.append(token)
        while run:
            length = sum(len(t.word) for t in run)
            closed = text[run[-1].end : run[-1].end + 1] in (
                "",
                "，",
                ",",
                "。",
                "！",
                "!",
                "、",
                " ",
            )
            if 2 <= length <= 3 and closed:
                doubled = len(run) == 1 and length == 2 and run[0].word[0] == run[0].word[1]
                if all(self.segmenter.frequency(t.word) < 100 for t in run) or (
                    # 感谢圆圆，: a doubled word thanked is a pet name even when it is a word.
                    doubled
                    and _doubled_name_char(run[0].word[0])
                    and self.segmenter.frequency(run[0].word) < _COMMON_PREFIX
                ):
                    found.add(run[0].start, run[-1].end, 0.45)
                return
            run.pop()

    def _surname_after_cue(self, text: str, start: int, found: _NameSpans) -> None:
        """我叫郭想。我叫黄桂花。: after 叫, a surname and one or two characters, then punctuation.

        The given name may be an ordinary word (桂花, 想); the surname, the cue
        and the punctuation that closes the name are evidence enough. A common
        word as a whole (司机) is still not a name.
        """
        if text[start : start + 2] in COMPOUND_SURNAMES:
            surname = 2
        elif text[start : start + 1] in SINGLE_SURNAMES:
            surname = 1
        else:
            return
        for given in (2, 1):
            end = start + surname + given
            chars = text[start + surname : end]
            if len(chars) != given or not _is_han(chars) or not _closes_name(text, end):
                continue
            if any(ch in _FUNCTION_CHARS for ch in chars):
                return
            name = text[start:end]
            if self.segmenter.frequency(name) >= _COMMON_WORD and (
                self.segmenter.flag(name) not in _PROPER_FLAGS
            ):
                return
            found.add(start, end, 0.55)
            return

    def _after_cue(self, tokens: list[Token], index: int, found: _NameSpans) -> None:
        """After 叫 or 名叫, a short run of uncommon words is taken as a name."""
        run: list[Token] = []
        for token in tokens[index + 1 : index + 4]:
            if not _is_han(token.word) or token.word in _NOT_GIVEN_NAME:
                break
            if token.flag in _FUNCTION_FLAGS:
                break
            run.append(token)
            if sum(len(t.word) for t in run) >= 3:
                break
        length = sum(len(t.word) for t in run)
        if 2 <= length <= 3 and all(self.segmenter.frequency(t.word) < _COMMON_WORD for t in run):
            found.add(run[0].start, run[-1].end, 0.5)


def _closes_name(text: str, end: int) -> bool:
    """True at the end of ``text`` or before punctuation or a space."""
    following = text[end : end + 1]
    return not following or not (following.isalnum() or _HAN_CHAR.match(following))


_ADMIN_SUFFIXES = ("省", "自治区", "市", "区", "县", "州", "旗", "盟", "镇", "乡", "街道")
_STREET_SUFFIXES = (
    "路", "街", "道", "巷", "弄", "胡同", "号", "栋", "幢", "座", "单元", "楼", "室", "院", "村",
    "组", "苑", "园", "大厦", "广场", "公寓", "小区", "段",
)  # fmt: skip
_NUMBER = re.compile(r"[0-9A-Za-z一二三四五六七八九十百零〇-]{1,8}")
_POSTCODE = re.compile(r"\s*\d{6}(?!\d)")
_PROVINCE = (
    "(?:北京|天津|上海|重庆)市?|(?:河北|山西|辽宁|吉林|黑龙江|江苏|浙江|安徽|福建|江西|山东|河南|"
    "湖北|湖南|广东|海南|四川|贵州|云南|陕西|甘肃|青海|台湾)省?|内蒙古(?:自治区)?|"
    "广西(?:壮族自治区)?|西藏(?:自治区)?|宁夏(?:回族自治区)?|新疆(?:维吾尔自治区)?|"
    "(?:香港|澳门)(?:特别行政区)?"
)
_NOT_IN_ADDRESS = "的了是在我你他她它与及或把被给对从到为很也就还又再不没吗呢吧啊呀这那"
_PROVINCE_ADDRESS = re.compile(
    rf"(?:{_PROVINCE})(?:(?![{_NOT_IN_ADDRESS}])[{_HAN}0-9A-Za-z]){{1,24}}?"
    r"(?:路|街|道|巷|弄|胡同|里)"
    r"(?:[0-9A-Za-z一二三四五六七八九十百零〇-]{1,8}(?:号院|号楼|号|座|栋|幢|楼|单元|室|层)){1,4}"
)
"""An address that starts at a province and reaches a numbered building: the shape of a
full postal address, found on characters so that the segmentation of the unusual
names in between (安次关街, 六枝特) cannot break it."""


class ChineseAddressRecognizer(EntityRecognizer):
    """Chinese postal addresses down to the street: 省/市/区 units, then 路/街/号/栋/室.

    Works on jieba tokens: an address starts at a place name or an
    administrative unit and runs over units, numbers and the short words in
    front of a unit (``永川/罗/街``); it must reach street level. A full
    address that starts at a province and reaches a numbered building is also
    matched on characters, so that odd segmentation in between cannot leave
    the province or the county behind.
    """

    ENTITY = "STREET_ADDRESS"

    def __init__(self, segmenter: ChineseSegmenter | None = None) -> None:
        self.segmenter = segmenter or ChineseSegmenter()
        super().__init__(supported_entities=[self.ENTITY], supported_language="zh")

    def load(self) -> None:
        """Load jieba's dictionary."""
        self.segmenter.load()

    def analyze(
        self,
        text: str,
        entities: list[str] | None = None,
        nlp_artifacts: NlpArtifacts | None = None,
    ) -> list[RecognizerResult]:
        """Find addresses in ``text`` (Presidio's recognizer interface)."""
        if entities and self.ENTITY not in entities:
            return []
        return self.find(text, self.segmenter.tokens(text))

    def find(self, text: str, tokens: list[Token]) -> list[RecognizerResult]:
        """Find addresses given jieba's tokens of ``text``."""
        results: list[RecognizerResult] = []
        for match in _PROVINCE_ADDRESS.finditer(text):
            end = match.end()
            postcode = _POSTCODE.match(text, end)
            results.append(
                RecognizerResult(
                    self.ENTITY, match.start(), postcode.end() if postcode else end, 0.7
                )
            )
        index = 0
        while index < len(tokens):
            token = tokens[index]
            if not _is_place_or_unit(token):
                index += 1
                continue
            end_index, street = self._extend(tokens, index)
            if street and end_index > index:
                end = tokens[end_index].end
                postcode = _POSTCODE.match(text, end)
                if postcode:
                    end = postcode.end()
                results.append(RecognizerResult(self.ENTITY, token.start, end, 0.6))
                index = end_index + 1
            else:
                index += 1
        return fuse_overlaps(results)

    @staticmethod
    def _extend(tokens: list[Token], start: int) -> tuple[int, bool]:
        """The last token of the address starting at ``start``, and whether it reaches a street."""
        last, street, index = start, _ends_with_street(tokens[start].word), start + 1
        while index < len(tokens):
            token = tokens[index]
            if _is_place_or_unit(token):
                street = street or _ends_with_street(token.word)
                last = index
                index += 1
                continue
            if _NUMBER.fullmatch(token.word):
                if index + 1 < len(tokens) and _is_place_or_unit(tokens[index + 1]):
                    index += 1
                    continue
                if street:
                    last = index  # a trailing room or building number
                break
            # Up to four characters of plain words before a unit: 永川/罗/街, 高/港/唐/路.
            filler, chars = index, 0
            while filler < len(tokens) and _is_filler(tokens[filler]):
                chars += len(tokens[filler].word)
                filler += 1
            if filler == index or chars > 4 or filler >= len(tokens):
                break
            if not _is_place_or_unit(tokens[filler]):
                break
            index = filler
        return last, street


_FILLER_FLAGS = frozenset({"n", "nr", "nz", "nrt", "j", "a", "ng", "zg", "b", "s", "t", "l", "g"})


def _is_filler(token: Token) -> bool:
    return token.flag in _FILLER_FLAGS and _is_han(token.word) and not _is_place_or_unit(token)


def _is_place_or_unit(token: Token) -> bool:
    word = token.word
    if token.flag == "ns" and _is_han(word):
        return True
    return _ends_with_unit(word) and (_is_han(word) or _NUMBER.fullmatch(word[:-1]) is not None)


def _ends_with_unit(word: str) -> bool:
    return word.endswith(_ADMIN_SUFFIXES) or word.endswith(_STREET_SUFFIXES)


def _ends_with_street(word: str) -> bool:
    return word.endswith(_STREET_SUFFIXES)
