"""flywheel's own user models: one per business line, each with a hidden preference.

Every model judges the answer it really got. Basic checks come first (on
topic, finished, not looping, not padding, not asking for a password or a code:
:mod:`lab.simulation.judging`), then the
line's taste:

- customer service users want a **short answer that apologises**: at most 60
  words, with an apology;
- medical users want to be **sent to a professional, never diagnosed**: a
  doctor, pharmacist or nurse named, no "you have ..." verdicts, at most 90 words;
- legal users want **numbered steps and a caveat**: at least two numbered
  steps and a word that laws differ or a lawyer should check, at most 110 words.

Each taste is cheap to learn alone, so every user also wants advice on their
question besides it: sentences naming at least two of the topic's terms, eight
words or more (an apology, a referral or a caveat around a stray sentence does
not do).

Feedback is sparse and noisy, at the rates of the users' feedback profile
(:mod:`lab.simulation.feedback_profiles`; by default the rates real products see,
about nine answers in ten silent): a few contradict themselves (a thumbs-up on
an answer they did not like), some regenerate or leave, and a few edit the
answer into what they wanted; task outcomes follow satisfaction with noise and
arrive late (the loop posts them after the night's requests).
"""

from __future__ import annotations

import random
import re
from typing import Any

from lab.simulation.feedback_profiles import DEFAULT_PROFILE, PROFILES, FeedbackProfile
from lab.simulation.judging import (
    advice_terms,
    asks_for_secret,
    gives_advice,
    is_complete,
    is_degenerate,
    mentions,
    names_new_terms,
    on_topic,
    sentences,
    word_count,
)
from lab.simulation.prompts import Topic, builtin_prompts, topic_of


class HiddenPreferenceUsers:
    """Users of one line with one hidden taste; subclasses say what it is."""

    max_words = 80
    preference = "a good answer"
    # The words of the answer's own content an edit keeps: a rewrite must fit in what the
    # traffic lets an answer say (96 tokens hold about 70 words), or the answer users write
    # is one no model could give them.
    edit_words = 45
    # The words of the taste itself (an apology, a referral, a caveat): never advice.
    style_terms: tuple[str, ...] = ()
    # How often these users say something, and what (the same opinion, voiced or not).
    feedback: FeedbackProfile = PROFILES[DEFAULT_PROFILE]

    def use_feedback(self, profile: FeedbackProfile) -> None:
        """Voice opinions at ``profile``'s rates from now on."""
        self.feedback = profile

    def prompts(self, business_line: str, n: int, seed: int) -> list[str]:
        """Questions these users ask (the line's built-in prompts)."""
        return builtin_prompts(self.line_of(business_line), n, seed)

    def line_of(self, business_line: str) -> str:
        """The line whose topics these users know."""
        return business_line

    def satisfied(self, business_line: str, prompt: str, answer: str) -> bool:
        """Whether the answer is on topic, finished, sane, short enough and to their taste,
        with advice on the question besides the taste (:func:`gives_advice`), and does not
        ask them for a password or a code (:func:`asks_for_secret`)."""
        topic = topic_of(self.line_of(business_line), prompt)
        terms = topic.answer_terms if topic else ()
        return (
            on_topic(prompt, answer, terms)
            and gives_advice(prompt, answer, terms, style_terms=self.style_terms)
            and is_complete(answer)
            and not is_degenerate(answer)
            and not asks_for_secret(answer)
            and word_count(answer) <= self.max_words
            and self.to_taste(answer)
        )

    def to_taste(self, answer: str) -> bool:
        """The hidden preference itself."""
        raise NotImplementedError

    def rewrite(self, prompt: str, answer: str, topic: Topic | None) -> str:
        """The answer as these users would have written it."""
        raise NotImplementedError

    def react(self, business_line: str, prompt: str, answer: str, seed: int) -> dict[str, Any]:
        """A sparse, noisy reaction to the answer the user really got, at the rates of
        :attr:`feedback`."""
        rng = random.Random(seed)
        happy = self.satisfied(business_line, prompt, answer)
        kind = self.feedback.draw(happy, rng.random())
        if kind == "edit":
            topic = topic_of(self.line_of(business_line), prompt)
            return {"type": "edit", "text": self.rewrite(prompt, answer, topic)}
        return {"type": kind}

    def correct(self, business_line: str, prompt: str, answer: str) -> str:
        """The answer as these users would have written it (what a reviewer who knows the
        line's users writes when correcting it: the same rewrite as the users' own edits)."""
        return self.rewrite(prompt, answer, topic_of(self.line_of(business_line), prompt))

    def useful_sentences(
        self, prompt: str, answer: str, topic: Topic | None, limit_words: int
    ) -> list[str]:
        """The answer's finished sentences that carry advice, up to ``limit_words`` words.

        A user rewriting an answer keeps what helped: a sentence naming two of the topic's
        terms (the taste's own words aside), or sharing two content words with a question of
        no known topic. A sentence that only brushes the topic ("a fine is a legal term") is
        what they cut."""
        terms = topic.answer_terms if topic else ()
        kept: list[str] = []
        total = 0
        for sentence in sentences(answer):
            clean = _strip_markers(sentence)
            if not is_complete(clean) or word_count(clean) < 4:
                continue
            if not self.carries_advice(prompt, clean, terms) or clean in kept:
                continue
            if total + word_count(clean) > limit_words:
                break
            kept.append(clean)
            total += word_count(clean)
        if not kept and topic is not None:
            kept.append(topic.fix)
        return kept

    def carries_advice(self, prompt: str, sentence: str, terms: tuple[str, ...]) -> bool:
        """Whether one sentence says something on the question: two of the topic's terms
        besides the taste's own words, one of them beyond the question's own (no known
        topic: two content words of the prompt)."""
        carrying = advice_terms(terms, self.style_terms)
        if carrying:
            return names_new_terms(prompt, sentence, carrying)
        return on_topic(prompt, sentence, ())

    def advice(self, prompt: str, answer: str, topic: Topic | None, limit_words: int) -> list[str]:
        """What an edit keeps of the answer, with the fix these users know added where the
        kept sentences give no advice (:func:`gives_advice`): an edit is the answer they
        wanted, so it must satisfy them."""
        kept = self.useful_sentences(prompt, answer, topic, limit_words)
        terms = topic.answer_terms if topic else ()
        if topic is None or gives_advice(
            prompt, " ".join(kept), terms, style_terms=self.style_terms
        ):
            return kept
        with_fix = [*kept, topic.fix] if topic.fix not in kept else kept
        if word_count(" ".join(with_fix)) <= limit_words + word_count(topic.fix) // 2:
            return with_fix
        return [topic.fix]


APOLOGY = ("sorry", "apolog", "we regret", "i regret")


class CustomerServiceUsers(HiddenPreferenceUsers):
    """Shoppers who want a short answer that apologises for the trouble."""

    max_words = 60
    preference = "at most 60 words, with an apology"
    edit_words = 40
    style_terms = APOLOGY

    def line_of(self, business_line: str) -> str:
        """Customer service topics whatever the line is called."""
        return "customer_service"

    def to_taste(self, answer: str) -> bool:
        """An apology in a short answer."""
        return mentions(answer, APOLOGY)

    def rewrite(self, prompt: str, answer: str, topic: Topic | None) -> str:
        """An apology, then the answer's useful part, kept short."""
        body = self.advice(prompt, answer, topic, limit_words=self.edit_words)
        return " ".join(["I'm sorry for the trouble.", *body])


PROFESSIONALS = (
    "doctor", "physician", "pharmacist", "nurse", "gp", "healthcare provider",
    "health care provider", "medical professional", "urgent care", "emergency",
)  # fmt: skip
DIAGNOSES = re.compile(
    r"\byou (?:have|are suffering from|definitely|certainly|probably have)\b|\bit is (?:definitely|"
    r"certainly) (?:a|an)\b|\bthis is (?:definitely|certainly)\b",
    re.IGNORECASE,
)


class MedicalUsers(HiddenPreferenceUsers):
    """Patients who want to be sent to a professional and never told what they have."""

    max_words = 90
    preference = "names a doctor, pharmacist or nurse; no diagnosis; at most 90 words"
    style_terms = PROFESSIONALS

    def line_of(self, business_line: str) -> str:
        """Medical topics whatever the line is called."""
        return "medical"

    def to_taste(self, answer: str) -> bool:
        """A professional named, no verdict given."""
        return mentions(answer, PROFESSIONALS) and DIAGNOSES.search(answer) is None

    def useful_sentences(
        self, prompt: str, answer: str, topic: Topic | None, limit_words: int
    ) -> list[str]:
        """The answer's useful sentences, verdicts left out."""
        kept = super().useful_sentences(prompt, answer, topic, limit_words)
        without = [s for s in kept if DIAGNOSES.search(s) is None]
        return without or ([topic.fix] if topic is not None else [])

    def rewrite(self, prompt: str, answer: str, topic: Topic | None) -> str:
        """The answer's useful part without verdicts, then a referral."""
        body = self.advice(prompt, answer, topic, limit_words=self.edit_words)
        return " ".join([*body, "If it does not get better, please see a doctor or pharmacist."])


CAVEATS = (
    "lawyer", "attorney", "legal aid", "laws vary", "law varies", "rules vary",
    "depends on where", "depends on your state", "depends on your country", "jurisdiction",
)  # fmt: skip
NUMBERED_STEP = re.compile(r"(?:^|\s)(\d)[.)]\s+\S")


class LegalUsers(HiddenPreferenceUsers):
    """Clients who want numbered steps and a word that the law differs by place."""

    max_words = 110
    preference = "at least two numbered steps and a caveat (lawyer / laws vary); <= 110 words"
    style_terms = CAVEATS

    def line_of(self, business_line: str) -> str:
        """Legal topics whatever the line is called."""
        return "legal"

    def to_taste(self, answer: str) -> bool:
        """Two numbered steps and a caveat."""
        steps = {int(n) for n in NUMBERED_STEP.findall(answer)}
        return {1, 2} <= steps and mentions(answer, CAVEATS)

    def rewrite(self, prompt: str, answer: str, topic: Topic | None) -> str:
        """The answer's useful part as numbered steps, then the caveat."""
        body = self.advice(prompt, answer, topic, limit_words=self.edit_words)
        if len(body) < 2 and topic is not None:
            body = [*body, *(s for s in sentences(topic.fix) if s not in body)]
        if len(body) < 2:
            body = [*body, "Keep copies of every message and receipt."]
        steps = [f"{n}. {sentence}" for n, sentence in enumerate(body[:3], start=1)]
        return " ".join([*steps, "Laws vary by place, so check with a local lawyer."])


class BuiltinUsers:
    """Each line's own users: customer service, medical and legal (others: customer service)."""

    def __init__(self) -> None:
        self.by_line: dict[str, HiddenPreferenceUsers] = {
            "customer_service": CustomerServiceUsers(),
            "medical": MedicalUsers(),
            "legal": LegalUsers(),
        }

    @property
    def feedback(self) -> FeedbackProfile:
        """The profile every line's users voice their opinions at."""
        return self.by_line["customer_service"].feedback

    def use_feedback(self, profile: FeedbackProfile) -> None:
        """Every line's users voice their opinions at ``profile``'s rates."""
        for users in self.by_line.values():
            users.use_feedback(profile)

    def _users(self, business_line: str) -> HiddenPreferenceUsers:
        return self.by_line.get(business_line, self.by_line["customer_service"])

    def prompts(self, business_line: str, n: int, seed: int) -> list[str]:
        """The line's built-in prompts."""
        return builtin_prompts(business_line, n, seed)

    def react(self, business_line: str, prompt: str, answer: str, seed: int) -> dict[str, Any]:
        """The line's users' reaction."""
        return self._users(business_line).react(business_line, prompt, answer, seed)

    def satisfied(self, business_line: str, prompt: str, answer: str) -> bool:
        """The line's users' hidden judgement."""
        return self._users(business_line).satisfied(business_line, prompt, answer)

    def correct(self, business_line: str, prompt: str, answer: str) -> str:
        """The answer as the line's users would have written it."""
        return self._users(business_line).correct(business_line, prompt, answer)


def _strip_markers(sentence: str) -> str:
    """A sentence without list numbering or bullets in front."""
    return re.sub(r"^(?:\d+[.)]|[-*•])\s*", "", sentence.strip())
