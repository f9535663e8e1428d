"""Signal → training example rules: pure functions from cleaned feedback records.

- SFT: an edited answer (prompt → edit; a reviewer's correction on the feedback
  page counts as an edit, rule ``correction``) and an approved answer (thumbs up, not
  also thumbs down or edited) become supervised examples.
- DPO: an edit gives edited ≻ original; for one prompt, a thumbs-up answer is
  preferred over a thumbs-down or regenerated-away answer; OASST ranks give
  lower rank ≻ higher rank among sibling answers.
- KTO: thumbs on answers that ended up in no pair become unpaired labels;
  negatives are kept as ``label=False``.
- Reviewers' verdicts: an answer its user said nothing about that reviewers passed
  is an SFT target, and a passed or failed one a KTO label (``review_pass``,
  ``review_fail``): a considered judgement on a random sample, where users' signals
  are few. The user's own signal wins where there is one.
- Label precision: with the window's reviewed satisfaction, an unedited verdict trains only
  where it is likely right (:mod:`feedback.label_precision`).

Every example carries its lineage: the request ids and feedback event ids it
came from, the adapter (model version) that produced the answers, the business
line, the newest source time, the (hashed) users behind it and the API keys (by
name) their requests came with.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import product
from typing import Any, Literal

import orjson

from feedback.events import (
    EDIT_TYPES,
    NEGATIVE_SIGNALS,
    POSITIVE_SIGNALS,
    FeedbackType,
    InteractionStatus,
    Signal,
)
from feedback.label_precision import REVIEW_RULE_PREFIX, LabelEvidence, label_evidence
from feedback.placeholders import PLACEHOLDER, neutral_words
from feedback.records import FeedbackRecord
from feedback.signals import signals_of
from flywheel.settings.cleaning import LabelPrecisionSettings

ExampleKind = Literal["sft", "dpo", "kto"]
# A reviewer's corrected answer trains like a user's edit; its own rule keeps it apart where
# the usable signal is counted (users, reviewers, the model).
CORRECTION_RULE = "correction"


def user_digest(user_id: str | None) -> str | None:
    """A stable hash of a user id: manifests name users without storing their ids."""
    if user_id is None:
        return None
    return hashlib.sha256(f"flywheel-user:{user_id}".encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where an example came from."""

    request_ids: tuple[str, ...]
    event_ids: tuple[int, ...]
    model_versions: tuple[str, ...]
    business_line: str
    time: str
    users: tuple[str, ...]
    keys: tuple[str, ...] = ()

    @property
    def owner(self) -> str | None:
        """Who the example counts against for the per-user share cap: its user; without
        one, the API key its request came with (a key's anonymous examples are one owner);
        None for an operator's import with neither (see :func:`feedback.datasets.cap_per_user`)."""
        if self.users:
            return self.users[0]
        return key_owner(self.keys[0]) if self.keys else None

    @property
    def key(self) -> str | None:
        """The API key the example counts against for the per-key share cap."""
        return self.keys[0] if self.keys else None


def key_owner(key_name: str) -> str:
    """The owner a key's anonymous examples count against (never a user digest's form)."""
    return f"key:{key_name}"


@dataclass(frozen=True, slots=True)
class TrainingExample:
    """One SFT example, DPO pair or KTO label, in trl's conversational format."""

    kind: ExampleKind
    prompt: tuple[dict[str, str], ...]
    lineage: Lineage
    completion: str | None = None
    chosen: str | None = None
    rejected: str | None = None
    label: bool | None = None
    rule: str = ""
    weight: float = 1.0

    @property
    def example_id(self) -> str:
        """A content hash: the same example built twice has the same id."""
        body = [
            self.kind,
            list(self.prompt),
            self.completion,
            self.chosen,
            self.rejected,
            self.label,
        ]
        return hashlib.sha256(orjson.dumps(body)).hexdigest()[:32]

    def as_row(self) -> dict[str, Any]:
        """The dataset row: trl columns first, lineage columns after."""
        prompt = list(self.prompt)
        row: dict[str, Any] = {"example_id": self.example_id, "prompt": prompt}
        if self.kind == "sft":
            row["completion"] = [{"role": "assistant", "content": self.completion}]
        elif self.kind == "dpo":
            row["chosen"] = [{"role": "assistant", "content": self.chosen}]
            row["rejected"] = [{"role": "assistant", "content": self.rejected}]
        else:
            row["completion"] = [{"role": "assistant", "content": self.completion}]
            row["label"] = self.label
        row.update(
            rule=self.rule,
            weight=self.weight,
            source_request_ids=list(self.lineage.request_ids),
            source_event_ids=list(self.lineage.event_ids),
            model_versions=list(self.lineage.model_versions),
            business_line=self.lineage.business_line,
            time=self.lineage.time,
        )
        return row


@dataclass(slots=True)
class ExampleSet:
    """The examples built from one batch of records, by kind."""

    sft: list[TrainingExample] = field(default_factory=list)
    dpo: list[TrainingExample] = field(default_factory=list)
    kto: list[TrainingExample] = field(default_factory=list)
    # Examples left out and why, for the cleaning funnel.
    dropped: Counter[str] = field(default_factory=Counter)
    # Examples whose answer invented a placeholder, given neutral words instead, by kind.
    restored: Counter[str] = field(default_factory=Counter)

    def by_kind(self) -> dict[ExampleKind, list[TrainingExample]]:
        """The three lists keyed by kind."""
        return {"sft": self.sft, "dpo": self.dpo, "kto": self.kto}


def record_signals(record: FeedbackRecord) -> set[Signal]:
    """The user signals on a record, task outcomes split into success and failure."""
    return signals_of(record.feedback)


def _strongest(signals: set[Signal], among: frozenset[Signal]) -> tuple[str, float] | None:
    present = sorted(((s.weight, s.value) for s in signals & among), reverse=True)
    if not present:
        return None
    weight, signal = present[0]
    return signal, weight


# Rule names say what happened to the worse answer ("regenerated away").
_RULE_NAMES: dict[str, str] = {Signal.REGENERATE: "regenerated", Signal.ABANDON: "abandoned"}


def verdict(record: FeedbackRecord) -> tuple[bool, str, float] | None:
    """Whether the user liked the answer, by the strongest signal, and how sure (its weight).

    Conflicting signals of equal strength (a thumbs-up and a thumbs-down) give no verdict.
    """
    signals = record_signals(record)
    good, bad = _strongest(signals, POSITIVE_SIGNALS), _strongest(signals, NEGATIVE_SIGNALS)
    if good and bad:
        if good[1] == bad[1]:
            return None
        return (True, *good) if good[1] > bad[1] else (False, *bad)
    if good:
        return True, *good
    if bad:
        return False, *bad
    return None


# A verdict weighs what a thumb does: one person's considered judgement of one answer.
REVIEW_WEIGHT = 1.0


def review_verdict(record: FeedbackRecord) -> tuple[bool, str, float] | None:
    """The reviewers' verdict on an answer, by majority (a tie, or none, gives no verdict):
    (passed, rule, weight)."""
    votes = Counter(
        e.outcome for e in record.feedback if e.type == FeedbackType.REVIEW and e.outcome
    )
    passed, failed = votes.get("pass", 0), votes.get("fail", 0)
    if passed == failed:
        return None
    verdict_passed = passed > failed
    rule = f"{REVIEW_RULE_PREFIX}{'pass' if verdict_passed else 'fail'}"
    return verdict_passed, rule, REVIEW_WEIGHT


def _judged(record: FeedbackRecord) -> tuple[tuple[bool, str, float], tuple[str, ...]] | None:
    """The user's verdict, else the reviewers', with the event types behind it."""
    if (users := verdict(record)) is not None:
        return users, _event_types(users[1])
    if (reviewers := review_verdict(record)) is not None:
        return reviewers, (FeedbackType.REVIEW.value,)
    return None


def _model_version(record: FeedbackRecord) -> str:
    return record.adapter_name or record.base_model or "unknown"


def _lineage(records: Sequence[FeedbackRecord], events: Iterable[int] = ()) -> Lineage:
    users = [user_digest(r.user_id) for r in records]
    return Lineage(
        request_ids=tuple(r.request_id for r in records),
        event_ids=tuple(sorted(set(events))),
        model_versions=tuple(dict.fromkeys(_model_version(r) for r in records)),
        business_line=records[0].business_line,
        time=max(r.created_at for r in records),
        users=tuple(dict.fromkeys(u for u in users if u is not None)),
        keys=tuple(dict.fromkeys(r.key_name for r in records if r.key_name)),
    )


def _events(record: FeedbackRecord, *kinds: str) -> list[int]:
    return [e.id for e in record.feedback if e.type in kinds]


def _prompt(record: FeedbackRecord) -> tuple[dict[str, str], ...]:
    return tuple({"role": m["role"], "content": m["content"]} for m in record.messages)


def window_evidence(
    records: Sequence[FeedbackRecord], settings: LabelPrecisionSettings
) -> LabelEvidence:
    """The window's satisfaction by model version, from its reviewers' verdicts."""

    def reviewed(record: FeedbackRecord) -> bool | None:
        found = review_verdict(record)
        return None if found is None else found[0]

    return label_evidence(records, settings, _model_version, reviewed)


def _admitted(
    record: FeedbackRecord,
    judged: tuple[bool, str, float],
    evidence: LabelEvidence | None,
    dropped: Counter[str],
    kind: str,
) -> tuple[bool, str, float] | None:
    """The verdict with its weight times its precision, or None where it is too likely wrong
    to train on (counted in ``dropped``)."""
    if evidence is None:
        return judged
    liked, signal, weight = judged
    admitted, weighed = evidence.admit(_model_version(record), liked, signal, weight)
    if not admitted:
        dropped[f"unlikely_{'positive' if liked else 'negative'}:{kind}"] += 1
        return None
    return liked, signal, weighed


def build_examples(
    records: Sequence[FeedbackRecord],
    *,
    max_pairs_per_prompt: int = 4,
    evidence: LabelEvidence | None = None,
) -> ExampleSet:
    """Apply the signal rules to cleaned records of one business line (pure).

    Each example carries its signal's :attr:`Signal.weight`: training samples
    strong signals (edits, task outcomes, thumbs) more often than a regenerate
    or an abandoned conversation. With ``evidence``, an unedited verdict (a thumb, a task
    outcome, a regenerate, a reviewer's pass) joins only where the line's reviewed
    satisfaction makes it likely right, weighing its signal's weight times that chance
    (:mod:`feedback.label_precision`); edits and rankings always join.
    """
    examples = ExampleSet()
    paired: set[str] = set()
    by_prompt: dict[str, list[FeedbackRecord]] = defaultdict(list)
    for record in records:
        by_prompt[record.prompt_hash].append(record)
        edit = record.edit
        judged = _judged(record)
        edited = bool(edit and edit.strip() and edit != record.response)
        if judged is not None and judged[0][0] and not edited:
            admitted = _admitted(record, judged[0], evidence, examples.dropped, "sft")
            judged = None if admitted is None else (admitted, judged[1])
        if edited:
            lineage = _lineage([record], _events(record, *EDIT_TYPES))
            rule = CORRECTION_RULE if record.edit_by_reviewer else "edit"
            examples.sft.append(
                TrainingExample("sft", _prompt(record), lineage, completion=edit, rule=rule)
            )
            examples.dpo.append(
                TrainingExample(
                    "dpo",
                    _prompt(record),
                    lineage,
                    chosen=edit,
                    rejected=record.response,
                    rule=f"{rule}>original",
                )
            )
            paired.add(record.request_id)
        elif judged is not None and judged[0][0] and record.response:
            (_, signal, weight), kinds = judged
            lineage = _lineage([record], _events(record, *kinds))
            examples.sft.append(
                TrainingExample(
                    "sft",
                    _prompt(record),
                    lineage,
                    completion=record.response,
                    rule=signal,
                    weight=weight,
                )
            )
    for group in by_prompt.values():
        if len(group) > 1:
            examples.dpo.extend(_prompt_pairs(group, paired, max_pairs_per_prompt, evidence))
    for record in records:
        if record.request_id in paired or not record.response or record.edit:
            continue
        judged = _judged(record)
        if judged is not None:
            admitted = _admitted(record, judged[0], evidence, examples.dropped, "kto")
            judged = None if admitted is None else (admitted, judged[1])
        if judged is not None:
            (liked, signal, weight), kinds = judged
            lineage = _lineage([record], _events(record, *kinds))
            examples.kto.append(
                TrainingExample(
                    "kto",
                    _prompt(record),
                    lineage,
                    completion=record.response,
                    label=liked,
                    rule=signal,
                    weight=weight,
                )
            )
    for items in examples.by_kind().values():
        items[:], restored = restore_placeholder_targets(items)
        examples.restored.update(restored)
    return examples


def best_of_n_examples(
    silent: Sequence[FeedbackRecord],
    candidates: Sequence[Sequence[str]],
    scores: Sequence[Sequence[float]],
    *,
    model: str,
    confidence: float,
    min_gap: float,
    weight: float,
    share: ModelShare,
) -> list[TrainingExample]:
    """Best-of-n examples (pure but for ``share``): for each silent answer's prompt,
    ``candidates`` are answers sampled offline (the served answer may be among them) and
    ``scores`` the satisfaction model's reading of each. The best one scored at least
    ``confidence`` becomes an SFT target; the best and the worst, when their scores differ by
    at least ``min_gap``, a DPO pair.
    Each weighs ``weight`` times the model's margin (the SFT target ``2 score - 1``, the pair
    the gap), names the model in its rule (``model:<model>/best-of-<n>``) and traces to the
    silent answer's request. The clearest come first, each kind only while ``share`` leaves
    room. Answers are as given (scrub them first): :func:`restore_placeholder_targets` gives
    invented placeholders neutral words."""
    if not len(silent) == len(candidates) == len(scores):
        raise ValueError(
            f"{len(silent)} prompts, {len(candidates)} candidate lists, {len(scores)} score lists"
        )
    ranked: list[tuple[float, TrainingExample]] = []
    for record, answers, read in zip(silent, candidates, scores, strict=True):
        if len(answers) != len(read):
            raise ValueError(f"{len(read)} scores for {len(answers)} candidates")
        if len(answers) < 2:
            continue
        prompt, lineage = _prompt(record), _lineage([record])
        rule = f"{MODEL_RULE_PREFIX}{model}/best-of-{len(answers)}"
        best = max(range(len(read)), key=lambda i: read[i])
        worst = min(range(len(read)), key=lambda i: read[i])
        if read[best] >= confidence:
            sureness = 2 * read[best] - 1
            ranked.append((sureness, TrainingExample(
                "sft", prompt, lineage, completion=answers[best], rule=rule,
                weight=weight * sureness,
            )))  # fmt: skip
        gap = read[best] - read[worst]
        if gap >= min_gap and answers[best] != answers[worst]:
            ranked.append((gap, TrainingExample(
                "dpo", prompt, lineage, chosen=answers[best], rejected=answers[worst], rule=rule,
                weight=weight * gap,
            )))  # fmt: skip
    ranked.sort(key=lambda item: -item[0])
    return [example for _, example in ranked if share.take(example.kind)]


def invented_placeholders(prompt: Sequence[dict[str, str]], target: str) -> set[str]:
    """Placeholders in ``target`` that the prompt does not hold.

    A model trained to say such an answer learns to print ``<PERSON_1>`` where the
    original answer had a name (the base model naming itself, a signature): it
    never sees a placeholder in a live prompt, so it could not have copied one.
    """
    return set(PLACEHOLDER.findall(target)) - _held_placeholders(prompt)


def _restored(text: str | None, held: set[str]) -> str | None:
    if not text or not PLACEHOLDER.search(text):
        return text
    return neutral_words(text, keep=held)[0]


def _held_placeholders(prompt: Sequence[dict[str, str]]) -> set[str]:
    return {m for message in prompt for m in PLACEHOLDER.findall(message["content"])}


def restore_placeholder_targets(
    examples: Iterable[TrainingExample],
) -> tuple[list[TrainingExample], Counter[str]]:
    """The examples with every placeholder their answers invent given a neutral word back
    ("<PERSON_1>" -> "the customer", see :func:`feedback.placeholders.neutral_words`), and
    how many were changed, by kind.

    An answer that named someone, or the model itself, is still a good answer: it is kept
    rather than dropped, and the model never learns to print a placeholder. Placeholders
    the prompt holds stay (the model may copy those).
    """
    out: list[TrainingExample] = []
    restored: Counter[str] = Counter()
    for example in examples:
        held = _held_placeholders(example.prompt)
        answers = (example.completion, example.chosen, example.rejected)
        completion, chosen, rejected = (_restored(text, held) for text in answers)
        if chosen is not None and chosen == rejected:
            rejected = example.rejected  # a pair left the same would teach nothing
        if (completion, chosen, rejected) != answers:
            restored[example.kind] += 1
            example = replace(  # noqa: PLW2901
                example, completion=completion, chosen=chosen, rejected=rejected
            )
        out.append(example)
    return out, restored


def _event_types(signal: str) -> tuple[str, ...]:
    """The feedback event types behind a signal name."""
    return (Signal(signal).event_type,)


def _rank_of(record: FeedbackRecord) -> int | None:
    ranks = [e.rank for e in record.feedback if e.type == FeedbackType.RANK]
    return ranks[-1] if ranks else None


def _prompt_pairs(
    group: list[FeedbackRecord],
    paired: set[str],
    limit: int,
    evidence: LabelEvidence | None = None,
) -> list[TrainingExample]:
    """Pairs among answers to one prompt: thumbs up over thumbs down/regenerated (at most
    ``limit``), then every rank order among siblings."""
    pairs: list[TrainingExample] = []
    seen: set[tuple[str, str]] = set()

    def add(good: FeedbackRecord, bad: FeedbackRecord, rule: str, events: list[int]) -> None:
        key = (good.request_id, bad.request_id)
        if key in seen or good.response == bad.response:
            return
        seen.add(key)
        paired.update(key)
        pairs.append(
            TrainingExample(
                "dpo",
                _prompt(good),
                _lineage([good, bad], events),
                chosen=good.response,
                rejected=bad.response,
                rule=rule,
            )
        )

    # A verdict held here is counted where it is held as an SFT target or a KTO label.
    dropped: Counter[str] = Counter()
    judged = [
        (r, _admitted(r, v, evidence, dropped, "dpo") if v is not None else None)
        for r, v in ((r, verdict(r)) for r in group)
    ]
    liked = [(r, v) for r, v in judged if v is not None and v[0]]
    disliked = [(r, v) for r, v in judged if v is not None and not v[0]]
    # Floods of one prompt must not turn into thousands of near-identical pairs.
    for (good, good_v), (bad, bad_v) in list(product(liked, disliked))[: limit * 4]:
        if good is not bad and good.response and len(pairs) < limit:
            rule = f"{good_v[1]}>{_RULE_NAMES.get(bad_v[1], bad_v[1])}"
            before = len(pairs)
            add(
                good,
                bad,
                rule,
                _events(good, *_event_types(good_v[1])) + _events(bad, *_event_types(bad_v[1])),
            )
            if len(pairs) > before:
                pairs[-1] = replace(pairs[-1], weight=min(good_v[2], bad_v[2]))
    ranked = sorted(
        ((rank, r) for r in group if (rank := _rank_of(r)) is not None), key=lambda item: item[0]
    )
    for (rank_a, a), (rank_b, b) in product(ranked, ranked):
        if rank_a < rank_b and a.response and b.response:
            add(a, b, "rank", _events(a, FeedbackType.RANK) + _events(b, FeedbackType.RANK))
    return pairs


MODEL_RULE_PREFIX = "model:"


def silent_records(records: Sequence[FeedbackRecord], used: set[str]) -> list[FeedbackRecord]:
    """Answers no user said anything about (no signal, no edit) and no example used."""
    return [
        r
        for r in records
        if r.request_id not in used
        and r.response
        and not r.edit
        and not record_signals(r)
        and r.status == InteractionStatus.OK
    ]


def model_cap(human_examples: int, max_share: float) -> int:
    """The most model-labelled examples beside ``human_examples`` users' ones, so that they
    are at most ``max_share`` of the whole set."""
    return int(max_share / (1 - max_share) * human_examples)


@dataclass(slots=True)
class ModelShare:
    """How many more model-labelled examples each kind takes: at most ``max_share`` of that
    kind's set. Per kind, because an adapter trains on one kind (an SFT night on SFT
    examples): negative KTO labels must not use up what the SFT targets are allowed."""

    left: dict[str, int]

    @classmethod
    def of(cls, human: Mapping[str, int], max_share: float) -> ModelShare:
        """The share left beside ``human`` users' examples by kind."""
        if not 0 <= max_share < 1:
            raise ValueError(f"max_share must be in [0, 1), got {max_share}")
        return cls({kind: model_cap(count, max_share) for kind, count in human.items()})

    def take(self, kind: str) -> bool:
        """Whether one more ``kind`` example fits (and count it when it does)."""
        if self.left.get(kind, 0) <= 0:
            return False
        self.left[kind] -= 1
        return True


def model_labelled_examples(
    silent: Sequence[FeedbackRecord],
    scores: Sequence[float],
    *,
    model: str,
    share: ModelShare,
    confidence: float,
    weight: float,
    positives: bool = True,
) -> list[TrainingExample]:
    """Examples from silent answers a satisfaction model is confident about (pure but for
    ``share``, which counts what they take); with ``positives`` False, only the answers it
    is sure failed (negative KTO labels).

    A score of at least ``confidence`` makes the answer an SFT target and a positive KTO
    label, one of at most ``1 - confidence`` a negative KTO label; each weighs ``weight``
    times how sure the model is (``|2 score - 1|``) and names the model in its rule
    (``model:<model>``), so lineage says who labelled it. The most confident come first,
    each kind only while ``share`` leaves room: an adapter is never trained mostly on its
    own judge. Answers are as scrubbed: :func:`restore_placeholder_targets` gives the
    placeholders they invent neutral words.
    """
    if len(silent) != len(scores):
        raise ValueError(f"{len(scores)} scores for {len(silent)} silent answers")
    ranked = sorted(
        (
            (abs(2 * s - 1), s, r)
            for r, s in zip(silent, scores, strict=True)
            if (positives and s >= confidence) or s <= 1 - confidence
        ),
        key=lambda item: -item[0],
    )
    rule = f"{MODEL_RULE_PREFIX}{model}"
    out: list[TrainingExample] = []
    for sureness, score, record in ranked:
        lineage = _lineage([record])
        strength = weight * sureness
        liked = score >= confidence
        if liked and share.take("sft"):
            out.append(
                TrainingExample("sft", _prompt(record), lineage, completion=record.response,
                                rule=rule, weight=strength)
            )  # fmt: skip
        if share.take("kto"):
            out.append(
                TrainingExample("kto", _prompt(record), lineage, completion=record.response,
                                label=liked, rule=rule, weight=strength)
            )  # fmt: skip
    return out
