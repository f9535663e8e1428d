"""Scrubbing in the cleaning stage: the detection cache, and the two scrub orders, with the
real scrubber (loading it takes about a second, once for the module)."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from feedback.cleaning import DetectionCache, clean_records, dedup_text, scrub_with
from feedback.dedup import estimated_similarity, sign_texts
from feedback.pii import ScrubberSettings, build_scrubber
from feedback.pii.scrubber import Scrubber
from feedback.records import FeedbackRecord
from flywheel.settings.cleaning import CleaningSettings, DedupSettings
from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator


@pytest.fixture(scope="module")
def scrubber() -> Scrubber:
    return build_scrubber(ScrubberSettings())


def test_the_cache_analyses_each_text_once_and_forgets_the_oldest() -> None:
    analysed: list[str] = []

    def detect(texts: Sequence[str]) -> list[list[Any]]:
        analysed.extend(texts)
        return [[len(text)] for text in texts]

    cache = DetectionCache(detect, max_texts=2)
    assert cache(["aa", "b", "aa"]) == [[2], [1], [2]]
    assert analysed == ["aa", "b"]
    assert cache(["b", "ccc"]) == [[1], [3]]  # "aa" is now the oldest, and goes
    assert analysed == ["aa", "b", "ccc"]
    assert cache(["aa", "ccc", ""]) == [[2], [3], [0]]
    assert analysed == ["aa", "b", "ccc", "aa", ""]
    assert (cache.texts, cache.analysed) == (8, 5)
    found = cache(["ccc"])
    found[0].append("changed by a caller")
    assert cache(["ccc"]) == [[3]]


def simulated_records(requests: int) -> list[FeedbackRecord]:
    simulation = SimulationSettings(
        requests=requests, seed=7, start=datetime(2026, 11, 1, tzinfo=UTC), pii_share=0.6
    )
    interactions = [e for e in TrafficSimulator(simulation).events() if e["type"] == "interaction"]
    return [FeedbackRecord.from_dict({**event, "edit": None}) for event in interactions]


@pytest.mark.parametrize("cache_texts", [40, 50_000])
def test_cached_scrubbing_gives_the_uncached_records(scrubber: Scrubber, cache_texts: int) -> None:
    records = simulated_records(300)
    batches = [records[start : start + 64] for start in range(0, len(records), 64)]
    uncached = scrub_with(scrubber, cache_texts=0)
    expected = [record for batch in batches for record in uncached(batch)]
    assert any(record.pii for record in expected)

    # The cache works through the scrubber's public detect(): count what reaches it.
    counted = copy.copy(scrubber)
    reached: list[str] = []

    def detect(texts: Sequence[str]) -> list[list[Any]]:
        reached.extend(texts)
        return scrubber.detect(texts)

    counted.detect = detect  # type: ignore[method-assign]
    cached = scrub_with(counted, cache_texts=cache_texts)
    assert [record for batch in batches for record in cached(batch)] == expected
    texts = sum(len(r.messages) + 1 for r in records)
    assert len(reached) < texts * (0.9 if cache_texts < 100 else 0.5)
    assert scrubber.detect.__func__ is Scrubber.detect  # type: ignore[attr-defined]


# The same complaint from two customers: only names, emails and phone numbers differ, and
# they are a large share of the text, so the raw texts are not near duplicates.
COMPLAINTS = [
    (
        "I am John Smith, john.smith@gmail.com, call +1 415 555 0134. Where is my refund?",
        "Sorry, John Smith: your refund is on its way.",
    ),
    (
        "I am Maria Garcia, maria.garcia@yahoo.com, call +1 212 555 0199. Where is my refund?",
        "Sorry, Maria Garcia: your refund is on its way.",
    ),
]
# The phone numbers by their digit groups: a bare "555" can also turn up in the written files'
# hex ids and timestamps (it did once, in a run of the unit tier).
RAW_PII = (
    "John", "Smith", "john.smith", "Maria", "Garcia", "maria.garcia",
    "415 555", "555 0134", "212 555", "555 0199",
)  # fmt: skip


def complaint(index: int, prompt: str, response: str) -> FeedbackRecord:
    return FeedbackRecord.from_dict(
        {
            "request_id": f"req-{index}",
            "session_id": f"s-{index}",
            "user_id": f"user-{index}",
            "business_line": "customer_service",
            "adapter_name": None,
            "adapter_version": None,
            "base_model": "base",
            "messages": [
                {"role": "system", "content": "You are a helpful support agent."},
                {"role": "user", "content": prompt},
            ],
            "response": response,
            "prompt_hash": f"p-{index}",
            "status": "ok",
            "source": "test",
            "created_at": f"2026-11-01T00:0{index}:00Z",
            "feedback": [{"id": index, "type": "thumbs_up", "rank": None}],
            "edit": None,
            "signal": "thumbs_up",
        }
    )


def dataset_text(path: Path) -> str:
    if path.suffix == ".parquet":
        return json.dumps(pq.read_table(path).to_pylist(), default=str, ensure_ascii=False)
    return path.read_text() if path.is_file() else ""


@pytest.mark.parametrize("order", ["scrub_first", "dedup_first"])
def test_texts_that_differ_only_in_pii_stay_near_duplicates(
    scrubber: Scrubber, tmp_path: Path, order: str
) -> None:
    records = [complaint(i, *texts) for i, texts in enumerate(COMPLAINTS)]
    records.append(complaint(2, "Can I change the address of an order?", "Yes, within a day."))
    dedup = DedupSettings()
    raw = sign_texts([dedup_text(r) for r in records[:2]], dedup)
    assert estimated_similarity(raw.fingerprints[:1], raw.fingerprints[1:])[0] < dedup.threshold

    result = clean_records(
        records,
        "customer_service",
        scrub=scrub_with(scrubber),
        settings=CleaningSettings(scrub_order=order),  # type: ignore[arg-type]
        dataset_root=tmp_path,
        source={"records": len(records)},
    )
    funnel = result.funnel.as_dict()
    assert funnel["steps"]["deduplicated"] == {"thumbs_up": 2}
    assert sum(funnel["dropped"].values()) == 1
    assert funnel["pii"]["EMAIL_ADDRESS"] == 2
    assert result.dataset is not None
    written = "".join(dataset_text(path) for path in sorted(result.dataset.path.rglob("*")))
    assert "Where is my refund" in written
    assert [value for value in RAW_PII if value in written] == []
