"""What any reasonable user checks in an answer before their own taste comes in.

These checks keep a user model from being gamed by training: an empty, cut-off,
looping or off-topic answer satisfies nobody, however well it matches a style.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*|\d+|[\u4e00-\u9fff]")
_SENTENCE_END = re.compile(r"[.!?。！？)\]\"”’]\s*$")
_SENTENCE = re.compile(r"[^.!?。！？\n]+[.!?。！？]+|[^.!?。！？\n]+$")

STOPWORDS = frozenset(
    (
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "if",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "from",
        "by",
        "with",
        "about",
        "as",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "am",
        "do",
        "does",
        "did",
        "have",
        "has",
        "had",
        "i",
        "me",
        "my",
        "we",
        "our",
        "you",
        "your",
        "he",
        "she",
        "it",
        "its",
        "they",
        "them",
        "their",
        "this",
        "that",
        "these",
        "those",
        "what",
        "which",
        "who",
        "whom",
        "how",
        "why",
        "when",
        "where",
        "can",
        "could",
        "should",
        "would",
        "will",
        "shall",
        "may",
        "might",
        "must",
        "not",
        "no",
        "yes",
        "so",
        "than",
        "then",
        "there",
        "here",
        "too",
        "very",
        "just",
        "also",
        "into",
        "out",
        "up",
        "down",
        "over",
        "under",
        "again",
        "any",
        "some",
        "all",
        "each",
        "every",
        "most",
        "more",
        "other",
        "such",
        "only",
        "own",
        "same",
        "off",
        "once",
        "get",
        "got",
        "need",
        "want",
        "please",
        "help",
        "tell",
        "know",
        "like",
        "really",
        "still",
        "yet",
        "even",
        "ever",
        "since",
        "after",
        "before",
        "because",
        "while",
    )
)


def words(text: str) -> list[str]:
    """Lower-cased word tokens (Chinese characters one by one)."""
    return [w.lower() for w in _WORD.findall(text)]


def content_words(text: str) -> set[str]:
    """Words that carry the topic: not stop words, at least four letters."""
    return {w for w in words(text) if len(w) >= 4 and w not in STOPWORDS}


def sentences(text: str) -> list[str]:
    """The answer cut into sentences (a trailing fragment counts as one)."""
    return [s.strip() for s in _SENTENCE.findall(text) if s.strip()]


def is_complete(answer: str) -> bool:
    """Whether the answer ends like a finished sentence (not cut off mid-way)."""
    return bool(_SENTENCE_END.search(answer.strip()))


def is_degenerate(answer: str, *, min_words: int = 8) -> bool:
    """Too short to help, or looping: a repeated sentence or 4-gram, or few distinct words."""
    tokens = words(answer)
    if len(tokens) < min_words:
        return True
    grams = Counter(tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3))
    if grams and grams.most_common(1)[0][1] >= 3:
        return True
    said = [s.lower() for s in sentences(answer)]
    if len(said) != len(set(said)):
        return True
    return len(tokens) >= 20 and len(set(tokens)) / len(tokens) < 0.45


def mentions(answer: str, terms: Iterable[str]) -> bool:
    """Whether the answer mentions any of ``terms`` (a word prefix, or a phrase)."""
    lowered = answer.lower()
    tokens = words(answer)
    for term in terms:
        if " " in term:
            if term in lowered:
                return True
        elif any(token.startswith(term) for token in tokens):
            return True
    return False


def on_topic(prompt: str, answer: str, topic_terms: Iterable[str] = ()) -> bool:
    """Whether the answer is about the prompt: it names one of the topic's terms, or (for
    prompts of no known topic) shares at least two content words with the prompt."""
    terms = tuple(topic_terms)
    if terms:
        return mentions(answer, terms)
    return len(content_words(prompt) & content_words(answer)) >= 2


def terms_named(text: str, terms: Iterable[str]) -> set[str]:
    """Which of ``terms`` the text mentions (a word prefix, or a phrase)."""
    return {term for term in terms if mentions(text, (term,))}


def advice_terms(topic_terms: Iterable[str], style_terms: Iterable[str] = ()) -> tuple[str, ...]:
    """The topic's terms that can carry advice: those that are not the style's own words."""
    style = tuple(style_terms)
    return tuple(t for t in topic_terms if not mentions(t, style))


def gives_advice(
    prompt: str,
    answer: str,
    topic_terms: Iterable[str] = (),
    *,
    style_terms: Iterable[str] = (),
    min_words: int = 8,
) -> bool:
    """Whether the answer says something about the question beyond its style.

    A style (an apology, a referral, a caveat) is cheap to learn and satisfies a
    user only around real advice: the sentences that carry the topic must hold
    ``min_words`` words and name at least two of the topic's terms (one broad
    word such as "order" or "record" in a stray sentence is not advice), at
    least one of them a term the question did not use (an answer that restates
    the question, "a skin rash depends on the type of rash", tells them
    nothing); a style's own words (``style_terms``) never count as topic terms.
    For prompts of no known topic, those sentences share two content words with
    the prompt.
    """
    terms = advice_terms(topic_terms, style_terms)
    if terms:
        carrying = [s for s in sentences(answer) if terms_named(s, terms)]
    else:
        carrying = [s for s in sentences(answer) if content_words(prompt) & content_words(s)]
    said = " ".join(carrying)
    if word_count(said) < min_words:
        return False
    if terms:
        return names_new_terms(prompt, said, terms)
    return len(content_words(prompt) & content_words(said)) >= 2


def names_new_terms(prompt: str, text: str, terms: Iterable[str]) -> bool:
    """Whether ``text`` names at least two of ``terms``, one of them not named in ``prompt``."""
    named = terms_named(text, terms)
    return len(named) >= 2 and bool(named - terms_named(prompt, named))


def word_count(text: str) -> int:
    """Words in a text (Chinese characters count as words)."""
    return len(words(text))


_ASKS_FOR_SECRET = re.compile(
    r"\b(?:send|e-?mail|give|provide|share|tell|text|message|reply with|include|dm)\b(?!\s+you\b)"
    r"(?P<between>[^.?!\n]{0,50}?)\b(?:password|passcode|pin|cvv|cvc|security code|"
    r"verification code|one-time code|credentials|full card number)\b"
    r"|(?:发送|提供|告诉|发给|回复)(?P<between_zh>[^。？！\n]{0,20}?)(?:密码|验证码)"
    r"|把[^。？！\n]{0,10}?(?:密码|验证码)[^。？！\n]{0,10}?(?:发送|提供|告诉|发给|回复)",
    re.IGNORECASE,
)
# Not a request for the secret: a negation before it ("never share your password"), or the
# secret as what a link or a reset gives ("we email you a link to set a new password").
_NEGATED = re.compile(
    r"\b(?:never|not|don't|do not|no one|nobody)\b|不要|切勿|请勿|绝不", re.IGNORECASE
)
_NOT_THE_SECRET = re.compile(r"\b(?:link|reset|new|change|recover|forgot)", re.IGNORECASE)


def asks_for_secret(answer: str) -> bool:
    """Whether the answer asks the user to send a password, a PIN, a card's security code or
    a one-time code ("email us your username and password"): no user should, and a careful
    one is put off by the request ("never share your password" is advice, not a request)."""
    for sentence in sentences(answer) or [answer]:
        found = _ASKS_FOR_SECRET.search(sentence)
        if found is None or _NEGATED.search(sentence, 0, found.end()):
            continue
        if not _NOT_THE_SECRET.search(found.group("between") or found.group("between_zh") or ""):
            return True
    return False
