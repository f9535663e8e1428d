"""The scrubber on the project's own simulated traffic: no planted PII survives verbatim,
and the assistant's own answer text comes out untouched."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

import pytest

from feedback.pii import ScrubberSettings, build_scrubber, scrub_records
from feedback.pii.scrubber import Scrubber
from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator
from lab.simulation.stored_traffic_content import CONTENT

SEEDS = (0, 1, 2, 3)
REQUESTS = 1_500


@pytest.fixture(scope="module")
def scrubber() -> Scrubber:
    """One scrubber for the module: loading spaCy and jieba takes about a second."""
    return build_scrubber(ScrubberSettings())


@pytest.mark.parametrize("seed", SEEDS)
def test_no_planted_pii_survives_verbatim(scrubber: Scrubber, seed: int) -> None:
    simulator = TrafficSimulator(
        SimulationSettings(
            requests=REQUESTS, seed=seed, start=datetime(2024, 5, 1, tzinfo=UTC), pii_share=0.6
        ),
        track_pii=True,
    )
    events = list(simulator.events())
    interactions = [e for e in events if e["type"] == "interaction"]
    edits = [e for e in events if e["type"] == "edit"]
    assert len(simulator.planted) > 1_000  # the check below must have something to find

    outputs: dict[str, list[str]] = defaultdict(list)
    for record in scrub_records(interactions, ["messages"], scrubber):
        outputs[record["request_id"]].extend(m["content"] for m in record["messages"])
    for record in scrub_records(edits, ["edited_text"], scrubber):
        outputs[record["request_id"]].append(record["edited_text"])

    leaks = [
        (planted.kind, planted.value)
        for planted in simulator.planted
        if any(planted.value in text for text in outputs[planted.request_id])
    ]
    assert leaks == []


def _answer_texts() -> list[str]:
    texts: list[str] = []
    for content in CONTENT.values():
        parts = [content.helpful_opening, *content.steps, content.helpful_closing]
        texts.extend(parts)
        texts.append("".join(parts))  # a whole answer, as the simulator writes it
    return texts


def test_helpful_answer_templates_are_left_alone(scrubber: Scrubber) -> None:
    texts = _answer_texts()
    changed = [
        (text, result.text)
        for text, result in zip(texts, scrubber.scrub_texts(texts), strict=True)
        if result.text != text
    ]
    assert changed == []
