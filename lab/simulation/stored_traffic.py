"""Realistic synthetic traffic: conversations and feedback for several business lines.

Deterministic for a seed and a start time: request ids come from the seed and
the request's index, so running the same simulation twice stores nothing twice.
Traffic mixes English and Chinese, has heavy-tailed prompt lengths, plants PII
(Faker ``en_US`` and ``zh_CN``) in a share of prompts and edits, floods the
store with near-identical template messages, and draws feedback at configured
rates. Answers come in a helpful and a poor style, and feedback leans the way a
real user's would (thumbs up on helpful answers, down, regenerate or edit on
poor ones) so later stages have a signal to learn.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from faker import Faker
from pydantic import BaseModel, ConfigDict, Field, field_validator

from feedback.events import BUSINESS_LINE, prompt_hash
from lab.simulation.stored_traffic_content import CONTENT, FLOODS, LineContent

SOURCE = "simulate"
DEFAULT_BASE_MODEL = "SmolLM2-135M-Instruct"


class SignalRates(BaseModel):
    """Base probability of each signal per answer (before the answer's quality tilts it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    thumbs_up: float = Field(default=0.15, ge=0, le=1)
    thumbs_down: float = Field(default=0.08, ge=0, le=1)
    regenerate: float = Field(default=0.06, ge=0, le=1)
    edit: float = Field(default=0.05, ge=0, le=1)
    abandon: float = Field(default=0.05, ge=0, le=1)
    task_outcome: float = Field(default=0.10, ge=0, le=1)


class SimulationSettings(BaseModel):
    """What traffic to generate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: int = Field(ge=1, le=100_000_000)
    seed: int = 0
    start: datetime
    span: timedelta = Field(default=timedelta(days=1))
    business_lines: tuple[str, ...] = Field(
        default=("customer_service", "medical", "legal"), min_length=1
    )
    chinese_share: float = Field(default=0.35, ge=0, le=1)
    pii_share: float = Field(default=0.2, ge=0, le=1)
    flood_share: float = Field(default=0.1, ge=0, le=1)
    poor_answer_share: float = Field(default=0.35, ge=0, le=1)
    users: int | None = Field(default=None, ge=1)
    rates: SignalRates = Field(default_factory=SignalRates)
    base_model: str = DEFAULT_BASE_MODEL

    @field_validator("business_lines")
    @classmethod
    def _known_shape(cls, lines: tuple[str, ...]) -> tuple[str, ...]:
        for line in lines:
            if re.fullmatch(BUSINESS_LINE, line) is None:
                raise ValueError(f"business line {line!r} must match {BUSINESS_LINE}")
        return lines

    def user_count(self) -> int:
        """Distinct users: about one per five requests unless set."""
        return self.users or max(1, self.requests // 5)


@dataclass(frozen=True, slots=True)
class PlantedPii:
    """A PII value the simulator put in the traffic, for tests that check it never leaks."""

    request_id: str
    kind: str
    value: str


@dataclass(slots=True)
class TrafficSimulator:
    """Generates events; keeps the planted PII values when ``track_pii`` is set."""

    settings: SimulationSettings
    track_pii: bool = False
    planted: list[PlantedPii] = field(default_factory=list)

    def events(self) -> Iterator[dict[str, Any]]:
        """Interactions and feedback, each interaction before the events that name it."""
        s = self.settings
        rng = random.Random(s.seed)
        fakers = {"en": Faker("en_US"), "zh": Faker("zh_CN")}
        for offset, faker in enumerate(fakers.values()):
            faker.seed_instance(s.seed * 7919 + offset)
        lines = list(s.business_lines)
        step = s.span / max(s.requests, 1)
        index = 0
        while index < s.requests:
            created = s.start + step * index
            request = self._request(rng, fakers, lines, index, created)
            yield from request
            index += sum(1 for e in request if e["type"] == "interaction")

    def _request(
        self,
        rng: random.Random,
        fakers: dict[str, Faker],
        lines: list[str],
        index: int,
        created: datetime,
    ) -> list[dict[str, Any]]:
        s = self.settings
        line = lines[index % len(lines)] if rng.random() < 0.3 else rng.choice(lines)
        language = "zh" if rng.random() < s.chinese_share else "en"
        faker = fakers[language]
        content = CONTENT.get((line, language)) or CONTENT[("customer_service", language)]
        user = f"user-{_zipf_user(rng, s.user_count())}"
        session = f"sess-{s.seed}-{index:09d}"
        request_id = f"sim-{s.seed}-{index:09d}"
        if rng.random() < s.flood_share:
            # Order-number floods in customer service; elsewhere the same question verbatim.
            if line == "customer_service":
                prompt = rng.choice(FLOODS[language]).format(
                    n=rng.randint(10_000, 99_999), day=rng.randint(1, 28)
                )
            else:
                prompt = content.questions[0]
        else:
            prompt = self._prompt(rng, faker, content, language, request_id)
        messages = [{"role": "system", "content": content.system}]
        messages.append({"role": "user", "content": prompt})
        poor = rng.random() < s.poor_answer_share
        response = self._answer(rng, content, poor)
        events = [
            self._interaction(rng, request_id, session, user, line, messages, response, created)
        ]
        events.extend(
            self._feedback(rng, faker, content, events[0], poor, language, index, created)
        )
        return events

    def _prompt(
        self, rng: random.Random, faker: Faker, content: LineContent, language: str, request_id: str
    ) -> str:
        sentences = [rng.choice(content.questions)]
        # Pareto tail: most prompts are a sentence or two, a few are long stories.
        extra = min(int(rng.paretovariate(1.3)) - 1, 60)
        sentences.extend(rng.choice(content.context) for _ in range(extra))
        if rng.random() < self.settings.pii_share:
            sentences.append(self._pii_sentence(rng, faker, language, request_id))
        separator = "" if language == "zh" else " "
        return separator.join(sentences)

    def _pii_sentence(
        self, rng: random.Random, faker: Faker, language: str, request_id: str
    ) -> str:
        kinds = ["name", "phone", "email", "id_number", "card", "address"]
        chosen = rng.sample(kinds, k=rng.randint(1, 3))
        values = {kind: _fake_value(faker, kind, language) for kind in chosen}
        if self.track_pii:
            self.planted.extend(PlantedPii(request_id, k, v) for k, v in values.items())
        templates = PII_TEMPLATES[language]
        return ("" if language == "zh" else " ").join(
            templates[k].format(v=values[k]) for k in chosen
        )

    def _answer(self, rng: random.Random, content: LineContent, poor: bool) -> str:
        if poor:
            return rng.choice(content.poor_answers)
        steps = rng.sample(content.steps, k=min(len(content.steps), rng.randint(2, 4)))
        return content.helpful_opening + "".join(steps) + content.helpful_closing

    def _interaction(
        self,
        rng: random.Random,
        request_id: str,
        session: str,
        user: str,
        line: str,
        messages: list[dict[str, str]],
        response: str,
        created: datetime,
    ) -> dict[str, Any]:
        latency = round(rng.lognormvariate(6.0, 0.5), 2)
        status = "error" if rng.random() < 0.01 else "ok"
        return {
            "type": "interaction",
            "request_id": request_id,
            "session_id": session,
            "user_id": user,
            "business_line": line,
            "base_model": self.settings.base_model,
            "arm": "base",
            "messages": messages,
            "response": response if status == "ok" else "",
            "prompt_hash": prompt_hash(messages),
            "latency_ms": latency,
            "ttft_ms": round(latency * rng.uniform(0.05, 0.3), 2),
            "status": status,
            "source": SOURCE,
            "created_at": _iso(created),
        }

    def _feedback(
        self,
        rng: random.Random,
        faker: Faker,
        content: LineContent,
        interaction: dict[str, Any],
        poor: bool,
        language: str,
        index: int,
        created: datetime,
    ) -> list[dict[str, Any]]:
        rates = self.settings.rates
        request_id = interaction["request_id"]
        tilt_good, tilt_bad = (0.4, 2.2) if poor else (1.6, 0.4)
        events: list[dict[str, Any]] = []
        later = created + timedelta(seconds=rng.randint(5, 300))

        def add(kind: str, when: datetime, **extra: Any) -> None:
            events.append(
                {
                    "type": kind,
                    "request_id": request_id,
                    "user_id": interaction["user_id"],
                    "idempotency_key": f"{request_id}:{kind}",
                    "created_at": _iso(when),
                    **extra,
                }
            )

        if interaction["status"] != "ok":
            if rng.random() < 0.5:
                add("abandon", later)
            return events
        if rng.random() < min(1.0, rates.regenerate * tilt_bad):
            retry_id = f"{request_id}-r"
            retry = dict(interaction)
            retry_created = created + timedelta(seconds=rng.randint(3, 60))
            retry.update(
                request_id=retry_id,
                response=self._answer(rng, content, poor=False),
                created_at=_iso(retry_created),
            )
            add("regenerate", retry_created, replaced_by=retry_id)
            events.insert(0, retry)
            return events
        if rng.random() < min(1.0, rates.thumbs_up * tilt_good):
            add("thumbs_up", later)
        elif rng.random() < min(1.0, rates.thumbs_down * tilt_bad):
            add("thumbs_down", later)
        if rng.random() < min(1.0, rates.edit * tilt_bad):
            edited = self._answer(rng, content, poor=False)
            if rng.random() < self.settings.pii_share:
                edited += ("" if language == "zh" else " ") + self._pii_sentence(
                    rng, faker, language, request_id
                )
            add("edit", later + timedelta(seconds=30), edited_text=edited)
        if rng.random() < min(1.0, rates.abandon * (tilt_bad if poor else 0.5)):
            add("abandon", later)
        if rng.random() < rates.task_outcome:
            success_odds = 0.35 if poor else 0.8
            outcome = "success" if rng.random() < success_odds else "failure"
            add("task_outcome", created + timedelta(days=rng.randint(1, 5)), outcome=outcome)
        return events


PII_TEMPLATES = {
    "en": {
        "name": "My name is {v}.",
        "phone": "You can call me at {v}.",
        "email": "My email is {v}.",
        "id_number": "My SSN is {v}.",
        "card": "The card I used was {v}.",
        "address": "I live at {v}.",
    },
    "zh": {
        "name": "我叫{v}。",
        "phone": "我的手机号是{v}。",
        "email": "我的邮箱是{v}。",
        "id_number": "我的身份证号是{v}。",
        "card": "我的银行卡号是{v}。",
        "address": "我的地址是{v}。",
    },
}


def _fake_value(faker: Faker, kind: str, language: str) -> str:
    if kind == "name":
        return str(faker.name())
    if kind == "phone":
        return str(faker.phone_number())
    if kind == "email":
        return str(faker.email())
    if kind == "id_number":
        return str(faker.ssn())
    if kind == "card":
        return str(faker.credit_card_number())
    return str(faker.address()).replace("\n", ", " if language == "en" else "")


def _zipf_user(rng: random.Random, users: int) -> int:
    # A few users are very active, most come once or twice.
    return min(int(rng.paretovariate(1.1)), users) if rng.random() < 0.3 else rng.randrange(users)


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
