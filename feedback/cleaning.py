"""The cleaning stage for one business line: scrub, filter, dedup, build examples, cap, split.

Every step is a plain function over a list of feedback records
(:class:`feedback.records.FeedbackRecord`, pulled by
:func:`feedback.signals.pull_records`); :func:`clean_line` strings them together and counts,
per signal, what survives each step and why the rest was dropped. The
per-record work (:func:`scrub_and_filter_records`) streams over a window or a
partition of it, so a flow can map it over partitions.

Scrubbing is most of the cost, so it is spent only where it counts. With
``scrub_order="dedup_first"``, failed requests are dropped and exact duplicates
of the raw question and answer are set aside before any scrubbing; only the
survivors are scrubbed, and near duplicates are found on the scrubbed text, so
two texts that differ only in their PII still meet. With ``"scrub_first"``
every record is scrubbed, then filtered and deduplicated. Either way, a text the
run has analysed before (the system prompt of every request, a templated
answer) is not analysed again (:class:`DetectionCache`).
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from feedback.datasets import DatasetBuild, cap_contributions, split_by_time, write_dataset
from feedback.dedup.history import (
    SignedRecords,
    TrainingHistory,
    cluster_with_history,
    drop_trained,
    sign_records,
    window_verdicts,
)
from feedback.dedup.records import record_time, scope_hash
from feedback.dedup.signature import exact_text_hash
from feedback.events import InteractionStatus
from feedback.examples import (
    ExampleKind,
    ModelShare,
    TrainingExample,
    best_of_n_examples,
    build_examples,
    model_labelled_examples,
    restore_placeholder_targets,
    silent_records,
    window_evidence,
)
from feedback.placeholders import PLACEHOLDER
from feedback.records import FeedbackRecord
from feedback.signals import pull_records
from flywheel.settings.cleaning import (
    SCRUB_CACHE_TEXTS,
    CleaningSettings,
    DatasetSettings,
    DedupSettings,
)

# Pulled records in, the same records scrubbed (``pii`` set) out, in order.
ScrubBatch = Callable[[list[FeedbackRecord]], list[FeedbackRecord]]
SCRUBBED_FIELDS = ("messages", "response", "edit")
FUNNEL_STEPS = ("pulled", "filtered", "deduplicated", "in_training")
FAILED_REQUEST = "failed_request"
EXACT_DUPLICATE = "exact_duplicate"
# Distinct texts whose detections a scrubbing function keeps (~200 bytes each).


@dataclass(slots=True)
class Funnel:
    """Per-signal counts after each step, dropped records by reason, PII found by type,
    examples whose answer's invented placeholders got neutral words back, by kind."""

    steps: dict[str, Counter[str]] = field(default_factory=dict)
    dropped: Counter[str] = field(default_factory=Counter)
    pii: Counter[str] = field(default_factory=Counter)
    examples: dict[str, int] = field(default_factory=dict)
    restored: Counter[str] = field(default_factory=Counter)
    # The window's reviewed satisfaction by model version, which judged its users' verdicts.
    priors: dict[str, dict[str, float | int]] = field(default_factory=dict)

    def count(self, step: str, records: Iterable[FeedbackRecord]) -> None:
        """Record how many records of each signal are left after ``step``."""
        self.steps[step] = Counter(r.signal.value for r in records)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, steps in pipeline order."""
        return {
            "steps": {
                step: dict(sorted(self.steps[step].items()))
                for step in FUNNEL_STEPS
                if step in self.steps
            },
            "dropped": dict(sorted(self.dropped.items())),
            "pii": dict(sorted(self.pii.items())),
            "examples": self.examples,
            "restored": dict(sorted(self.restored.items())),
            "priors": self.priors,
        }


def failed_request(record: FeedbackRecord) -> bool:
    """Whether the request failed or got an empty answer: unusable whatever its text (pure)."""
    return record.status != InteractionStatus.OK or not record.response.strip()


def drop_reason(record: FeedbackRecord, min_prompt_chars: int) -> str | None:
    """Why a scrubbed record cannot be used for training, or ``None`` (pure)."""
    if failed_request(record):
        return FAILED_REQUEST
    prompt = PLACEHOLDER.sub("", record.last_user_text)
    if len(re.sub(r"[\W_]+", "", prompt)) < min_prompt_chars:
        return "pii_only" if PLACEHOLDER.search(record.last_user_text) else "empty_prompt"
    return None


def _scrub_and_judge(
    records: list[FeedbackRecord], scrub: ScrubBatch, settings: CleaningSettings, pii: Counter[str]
) -> list[tuple[FeedbackRecord, str | None]]:
    scrubbed = scrub(records) if records else []
    judged = []
    for record in scrubbed:
        pii.update(record.pii or {})
        judged.append((record, drop_reason(record, settings.datasets.min_prompt_chars)))
    return judged


def dedup_text(record: FeedbackRecord) -> str:
    """What dedup compares: the user's question and the answer it got."""
    return f"{record.last_user_text}\n{record.response}"


def dedup_fields(record: FeedbackRecord) -> dict[str, Any]:
    """The record as dedup reads it (any mapping, fields named by its settings), with the
    text it compares as ``dedup_text``."""
    return {**record.as_dict(), "dedup_text": dedup_text(record)}


def sign_feedback_records(records: list[FeedbackRecord], settings: DedupSettings) -> SignedRecords:
    """The records' dedup signatures, scopes and times (see :func:`dedup_fields`)."""
    return sign_records([dedup_fields(r) for r in records], field="dedup_text", settings=settings)


@dataclass(slots=True)
class FilteredRecords:
    """What scrubbing and filtering made of a stream of pulled records.

    ``filtered`` counts, per signal, the records that passed the filters: the kept ones
    and, with ``dedup_first``, the raw exact duplicates set aside unscrubbed (already
    counted in ``dropped`` as exact duplicates).
    """

    kept: list[FeedbackRecord] = field(default_factory=list)
    pulled: Counter[str] = field(default_factory=Counter)
    filtered: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    pii: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class _RawTwins:
    """Raw exact duplicates set aside before scrubbing, by ``(scope, exact hash)``."""

    earliest: dict[tuple[int, int], float] = field(default_factory=dict)
    aside: Counter[tuple[int, int]] = field(default_factory=Counter)
    signal: dict[tuple[int, int], str] = field(default_factory=dict)
    fate: dict[tuple[int, int], str | None] = field(default_factory=dict)

    def set_aside(self, record: FeedbackRecord, key: tuple[int, int], created: float) -> bool:
        """Whether an earlier (or same-time) record with this raw text was already seen."""
        earliest = self.earliest.get(key)
        if earliest is not None and earliest <= created:
            self.aside[key] += 1
            return True
        # The first of its text, or earlier than the one seen (pulled out of time order):
        # scrubbed, and any later twin ends as its scrubbed duplicate.
        self.earliest[key] = created
        self.signal[key] = record.signal.value
        return False

    def settle(self, out: FilteredRecords) -> None:
        """Twins share the filter verdict of their scrubbed twin, then count as duplicates."""
        for key, count in self.aside.items():
            reason = self.fate[key]
            if reason is None:
                out.filtered[self.signal[key]] += count
                out.dropped[EXACT_DUPLICATE] += count
            else:
                out.dropped[reason] += count


def raw_duplicate_key(
    record: FeedbackRecord, settings: DedupSettings
) -> tuple[tuple[int, int], float]:
    """The record's scope and the exact hash of its raw question and answer, and its time as
    dedup reads it (pure)."""
    fields = record.as_dict()
    key = scope_hash(fields, settings), exact_text_hash(dedup_text(record), settings)
    return key, record_time(fields, settings.created_at_field)


def scrub_and_filter_records(
    records: Iterable[FeedbackRecord],
    scrub: ScrubBatch,
    settings: CleaningSettings,
    on_progress: Callable[[int], None] | None = None,
) -> FilteredRecords:
    """Scrub and filter a stream of pulled records a batch at a time; kept ones in order.

    With ``settings.scrub_order == "dedup_first"``, failed requests are dropped unscrubbed,
    and a record whose raw question and answer equal an earlier one's in its scope is set
    aside unscrubbed: it gets its twin's filter verdict, and if that keeps the twin, it is
    an exact duplicate. Only the survivors are scrubbed; near duplicates are left to the
    dedup step, on the scrubbed text.
    """
    out = FilteredRecords()
    dedup_first = settings.scrub_order == "dedup_first"
    twins = _RawTwins()
    batch: list[FeedbackRecord] = []
    keys: list[tuple[int, int]] = []
    seen = 0

    def flush() -> None:
        nonlocal seen
        for position, (record, reason) in enumerate(
            _scrub_and_judge(batch, scrub, settings, out.pii)
        ):
            if dedup_first:
                twins.fate[keys[position]] = reason
            if reason is None:
                out.kept.append(record)
                out.filtered[record.signal.value] += 1
            else:
                out.dropped[reason] += 1
        batch.clear()
        keys.clear()
        if on_progress is not None:
            on_progress(seen)
        seen = 0

    for record in records:
        out.pulled[record.signal.value] += 1
        seen += 1
        if dedup_first:
            if failed_request(record):
                out.dropped[FAILED_REQUEST] += 1
                continue
            key, created = raw_duplicate_key(record, settings.dedup)
            if twins.set_aside(record, key, created):
                continue
            keys.append(key)
        batch.append(record)
        if len(batch) >= settings.scrub_batch_size:
            flush()
    flush()
    twins.settle(out)
    return out


@dataclass(frozen=True, slots=True)
class DedupOutcome:
    """The records a window keeps after dedup, why the rest went, and the kept ones signed."""

    kept: list[FeedbackRecord]
    dropped: Counter[str]
    signed: SignedRecords


def deduplicate_window(
    records: list[FeedbackRecord], settings: DedupSettings, history: TrainingHistory | None = None
) -> DedupOutcome:
    """Drop what earlier windows trained on, then exact and near duplicates inside each
    business line and signal, earlier nights' records first in their clusters, then the
    earliest records (see :mod:`feedback.dedup.history`)."""
    history = history or TrainingHistory.empty(settings)
    signed = sign_feedback_records(records, settings)
    rows, dropped = drop_trained(signed, history.keys())
    signed = signed.take(rows)
    fresh = [records[row] for row in rows.tolist()]
    decisions = cluster_with_history(signed, history.signed, settings)
    keep, duplicates = window_verdicts(decisions, len(fresh))
    dropped.update(duplicates)
    kept_rows = [row for row, flag in enumerate(keep) if flag]
    return DedupOutcome([fresh[row] for row in kept_rows], dropped, signed.take(kept_rows))


def deduplicate(
    records: list[FeedbackRecord], settings: DedupSettings
) -> tuple[list[FeedbackRecord], Counter[str]]:
    """Drop exact and near duplicates inside each business line and signal; earliest kept."""
    outcome = deduplicate_window(records, settings)
    return outcome.kept, outcome.dropped


def build_splits(
    records: list[FeedbackRecord], settings: DatasetSettings, funnel: Funnel
) -> dict[ExampleKind, dict[str, list[TrainingExample]]]:
    """Examples by kind, capped per user and per API key, and split by time."""
    evidence = window_evidence(records, settings.label_precision)
    funnel.priors = evidence.as_dict()
    examples = build_examples(
        records, max_pairs_per_prompt=settings.max_pairs_per_prompt, evidence=evidence
    )
    funnel.dropped.update(examples.dropped)
    funnel.restored.update(examples.restored)
    splits: dict[ExampleKind, dict[str, list[TrainingExample]]] = {}
    used: set[str] = set()
    for kind, items in examples.by_kind().items():
        capped, by_user, by_key = cap_contributions(
            items, user_share=settings.max_user_share, key_share=settings.max_key_share
        )
        if by_user:
            funnel.dropped[f"user_cap:{kind}"] += by_user
        if by_key:
            funnel.dropped[f"key_cap:{kind}"] += by_key
        splits[kind] = split_by_time(capped, settings.eval_fraction)
        funnel.examples[kind] = len(capped)
        for example in capped:
            used.update(example.lineage.request_ids)
    funnel.count("in_training", (r for r in records if r.request_id in used))
    return splits


@dataclass(frozen=True, slots=True)
class SilentLabelling:
    """A satisfaction model that labels the silent answers of a window (built where the model
    can run: ``feedback`` never loads one), and how far it is trusted."""

    model: str  # name and version, written into each example's rule
    score: Callable[[list[FeedbackRecord]], Sequence[float]]
    confidence: float
    max_share: float
    weight: float
    # Whether answers it is sure satisfied become SFT targets and positive labels too.
    positives: bool = False
    # Best-of-n: answers sampled offline for up to ``best_of_prompts`` silent prompts (each
    # list may be short or empty where sampling failed); the model picks the best and worst.
    sample: Callable[[list[FeedbackRecord]], Sequence[Sequence[str]]] | None = None
    best_of_prompts: int = 0
    min_gap: float = 0.3


def _used_request_ids(splits: dict[ExampleKind, dict[str, list[TrainingExample]]]) -> set[str]:
    """The requests some example of ``splits`` was built from."""
    return {
        request_id
        for by_split in splits.values()
        for examples in by_split.values()
        for example in examples
        for request_id in example.lineage.request_ids
    }


def add_model_labelled(
    unique: list[FeedbackRecord],
    splits: dict[ExampleKind, dict[str, list[TrainingExample]]],
    labelling: SilentLabelling,
    funnel: Funnel,
    scrub: ScrubBatch | None = None,
) -> None:
    """Confident model labels of the silent answers, into the training split (each kind
    capped at ``labelling.max_share`` of its set); best-of-n's sampled answers are scrubbed
    with ``scrub`` before the model reads them (none leaves the stage unscrubbed)."""
    silent = silent_records(unique, _used_request_ids(splits))
    human: dict[str, int] = {
        kind: sum(len(examples) for examples in by_split.values())
        for kind, by_split in splits.items()
    }
    funnel.examples["silent_answers"] = len(silent)
    if not silent or not sum(human.values()):
        return
    share = ModelShare.of(human, labelling.max_share)
    extra = model_labelled_examples(
        silent,
        list(labelling.score(silent)),
        model=labelling.model,
        share=share,
        confidence=labelling.confidence,
        weight=labelling.weight,
        positives=labelling.positives,
    )
    extra += _best_of_n(silent, labelling, share, scrub)
    extra, restored = restore_placeholder_targets(extra)
    funnel.restored.update(restored)
    for example in extra:
        splits.setdefault(example.kind, {"train": [], "eval": []})["train"].append(example)
    funnel.examples["model_labelled"] = len(extra)
    best_of = sum(1 for e in extra if "/best-of-" in e.rule)
    if best_of:
        funnel.examples["best_of_n"] = best_of


def _best_of_n(
    silent: list[FeedbackRecord],
    labelling: SilentLabelling,
    share: ModelShare,
    scrub: ScrubBatch | None,
) -> list[TrainingExample]:
    """Best-of-n examples for up to ``best_of_prompts`` silent prompts (an even spread over
    the window, the same for the same records), within what ``share`` leaves."""
    if labelling.sample is None or labelling.best_of_prompts <= 0:
        return []
    if share.left.get("sft", 0) <= 0 and share.left.get("dpo", 0) <= 0:
        return []
    step = max(1, len(silent) // labelling.best_of_prompts)
    chosen = sorted(silent, key=lambda r: r.request_id)[::step][: labelling.best_of_prompts]
    sampled = labelling.sample(chosen)
    flat = [
        record.with_response(str(answer))
        for record, more in zip(chosen, sampled, strict=True)
        for answer in more
    ]
    # A sampled answer may say what no user wrote (a phone number, a name): scrubbed like
    # every answer before anything reads or keeps it.
    if scrub is not None and flat:
        flat = scrub(flat)
    answers = iter(r.response for r in flat)
    candidates = [
        list(dict.fromkeys([record.response, *(next(answers) for _ in more)]))
        for record, more in zip(chosen, sampled, strict=True)
    ]
    rows = [
        record.with_response(answer)
        for record, answers_of in zip(chosen, candidates, strict=True)
        for answer in answers_of
    ]
    scores = iter(labelling.score(rows) if rows else [])
    read = [[float(next(scores)) for _ in answers_of] for answers_of in candidates]
    return best_of_n_examples(
        chosen,
        candidates,
        read,
        model=labelling.model,
        confidence=labelling.confidence,
        min_gap=labelling.min_gap,
        weight=labelling.weight,
        share=share,
    )


@dataclass(frozen=True, slots=True)
class CleaningResult:
    """What the cleaning stage produced for one line."""

    business_line: str
    funnel: Funnel
    dataset: DatasetBuild | None
    # The dataset's source records, signed: what the training history records for the night.
    trained: SignedRecords | None = None

    def summary(self) -> dict[str, Any]:
        """The dataset's hash, its training examples by kind and the funnel, as plain values."""
        counts = self.dataset.counts if self.dataset else {}
        return {
            "dataset": self.dataset.content_hash if self.dataset else None,
            "train_examples": {kind: int(split.get("train", 0)) for kind, split in counts.items()},
            "funnel": self.funnel.as_dict(),
        }


def clean_records(
    records: list[FeedbackRecord],
    business_line: str,
    *,
    scrub: ScrubBatch,
    settings: CleaningSettings,
    dataset_root: Path,
    source: dict[str, Any],
    on_progress: Callable[[int], None] | None = None,
    history: TrainingHistory | None = None,
    labelling: SilentLabelling | None = None,
) -> CleaningResult:
    """Run every cleaning step on one line's records and write the dataset.

    With ``history`` (earlier nights' trained records), records already trained on and
    near duplicates past their cluster's cap over the nights are dropped too.
    """
    funnel = Funnel()
    filtered = scrub_and_filter_records(records, scrub, settings, on_progress)
    funnel.steps["pulled"] = filtered.pulled
    funnel.steps["filtered"] = filtered.filtered
    funnel.dropped.update(filtered.dropped)
    funnel.pii.update(filtered.pii)
    outcome = deduplicate_window(filtered.kept, settings.dedup, history)
    funnel.dropped.update(outcome.dropped)
    return finish_dataset(
        outcome.kept, business_line, funnel, settings, dataset_root, source, outcome.signed,
        labelling, scrub,
    )  # fmt: skip


def finish_dataset(
    unique: list[FeedbackRecord],
    business_line: str,
    funnel: Funnel,
    settings: CleaningSettings,
    dataset_root: Path,
    source: dict[str, Any],
    signed: SignedRecords | None = None,
    labelling: SilentLabelling | None = None,
    scrub: ScrubBatch | None = None,
) -> CleaningResult:
    """From deduplicated records to the written dataset (none when no example is left);
    with ``labelling``, the silent answers it is confident about join the training split
    (best-of-n's sampled answers scrubbed with ``scrub``).

    ``signed`` holds the same records signed, in order; the result's ``trained`` keeps
    those that went into an example.
    """
    funnel.count("deduplicated", unique)
    splits = build_splits(unique, settings.datasets, funnel)
    if labelling is not None:
        add_model_labelled(unique, splits, labelling, funnel, scrub)
    if not any(split for by_split in splits.values() for split in by_split.values()):
        return CleaningResult(business_line, funnel, None)
    used = _used_request_ids(splits)
    trained = (
        signed.take([row for row, rid in enumerate(signed.request_ids) if rid in used])
        if signed is not None
        else None
    )
    build = write_dataset(
        dataset_root,
        business_line,
        splits,
        funnel=funnel.as_dict(),
        source=source,
        settings=settings.datasets,
    )
    return CleaningResult(business_line, funnel, build, trained)


def window_source(since: datetime | None, until: datetime | None, records: int) -> dict[str, Any]:
    """The ``source`` block of a manifest: the time window and how many records it held."""

    def iso(value: datetime | None) -> str | None:
        return None if value is None else value.isoformat().replace("+00:00", "Z")

    return {"since": iso(since), "until": iso(until), "records": records}


def text_digest(text: str) -> bytes:
    """A 128-bit digest of a text: a key that does not hold the text (pure)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class DetectionCache:
    """The scrubber's detections of texts analysed before, the most recent ``max_texts``.

    A text repeated across records (the system prompt of every request, a templated
    answer, a retried question) is analysed once. What the scrubber detects in a text
    depends on that text alone; placeholders and names shared across a record's texts
    are worked out per record after detection, so records scrub the same with or without
    the cache. Texts are keyed by a 128-bit digest, so the cache holds offsets and types,
    never the text or its PII; two texts share a digest with odds far below any leak
    the scrubber itself has.
    """

    def __init__(self, detect: Callable[[Sequence[str]], list[list[Any]]], max_texts: int) -> None:
        self._detect = detect
        self._max_texts = max_texts
        self._known: dict[bytes, list[Any]] = {}
        self.texts = 0
        self.analysed = 0

    def __call__(self, texts: Sequence[str]) -> list[list[Any]]:
        """Detections for each text, analysing only those not seen before (one call)."""
        keys = [text_digest(text) for text in texts]
        missing = {
            key: text for key, text in zip(keys, texts, strict=True) if key not in self._known
        }
        fresh = (
            dict(zip(missing, self._detect(list(missing.values())), strict=True)) if missing else {}
        )
        self.texts += len(texts)
        self.analysed += len(missing)
        found = [list(fresh[key] if key in fresh else self._known[key]) for key in keys]
        for key in keys:
            # Most recently used last, so the oldest entry is the first to go.
            self._known[key] = fresh[key] if key in fresh else self._known.pop(key)
        while len(self._known) > self._max_texts:
            del self._known[next(iter(self._known))]
        return found


def scrub_with(scrubber: Any, *, cache_texts: int = SCRUB_CACHE_TEXTS) -> ScrubBatch:
    """A batch scrubber over the record fields that hold user or model text.

    The returned function remembers the detections of up to ``cache_texts`` texts
    (:class:`DetectionCache`; 0: none) for as long as it lives: make one per run or
    partition. ``scrubber`` itself is left as it is.
    """
    from feedback.pii import scrub_records

    if cache_texts:
        cached = copy.copy(scrubber)
        # scrub_records finds PII through the scrubber's public detect(); this copy's
        # detect() consults the cache first.
        cached.detect = DetectionCache(scrubber.detect, cache_texts)
        scrubber = cached

    def scrub(batch: list[FeedbackRecord]) -> list[FeedbackRecord]:
        # The scrubber reads mappings: it gets the texts alone, the record takes them back.
        texts = [
            {"messages": list(r.messages), "response": r.response, "edit": r.edit} for r in batch
        ]
        scrubbed = scrub_records(texts, SCRUBBED_FIELDS, scrubber)
        return [
            record.scrubbed(
                messages=out["messages"], response=out["response"], edit=out["edit"], pii=out["pii"]
            )
            for record, out in zip(batch, scrubbed, strict=True)
        ]

    return scrub


def clean_line(
    engine: Engine,
    business_line: str,
    *,
    scrub: ScrubBatch,
    settings: CleaningSettings,
    dataset_root: Path,
    since: datetime | None = None,
    until: datetime | None = None,
    on_progress: Callable[[int], None] | None = None,
    history: TrainingHistory | None = None,
    labelling: SilentLabelling | None = None,
) -> CleaningResult:
    """Pull one line's records from the store and run the cleaning stage on them."""
    records = list(pull_records(engine, business_line, since=since, until=until))
    return clean_records(
        records,
        business_line,
        scrub=scrub,
        settings=settings,
        dataset_root=dataset_root,
        source=window_source(since, until, len(records)),
        on_progress=on_progress,
        history=history,
        labelling=labelling,
    )


def clean_window(
    engine: Engine,
    business_line: str,
    *,
    scrub: ScrubBatch,
    settings: CleaningSettings,
    dataset_root: Path,
    since: datetime | None,
    until: datetime,
    labelling: SilentLabelling | None = None,
) -> CleaningResult:
    """One line's window cleaned into its datasets, deduplicated against what earlier
    windows trained on (within ``trained_history_days``); what it trains on is recorded."""
    from feedback.training_history import load_training_history, record_training

    history = load_training_history(
        engine,
        business_line,
        before=since,
        horizon_days=settings.trained_history_days,
        settings=settings.dedup,
    )
    result = clean_line(
        engine,
        business_line,
        scrub=scrub,
        settings=settings,
        dataset_root=dataset_root,
        since=since,
        until=until,
        history=history,
        labelling=labelling,
    )
    record_training(
        engine,
        business_line,
        since=since,
        until=until,
        trained=result.trained,
        settings=settings.dedup,
        horizon_days=settings.trained_history_days,
    )
    return result
