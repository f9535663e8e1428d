"""The traffic simulator: deterministic, varied, with planted PII and floods."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest

from feedback.events import validate_event
from lab.simulation.stored_traffic import SignalRates, SimulationSettings, TrafficSimulator

START = datetime(2026, 11, 29, tzinfo=UTC)


def simulate(**overrides: object) -> tuple[list[dict[str, object]], TrafficSimulator]:
    settings = SimulationSettings(**{"requests": 3_000, "seed": 11, "start": START, **overrides})
    simulator = TrafficSimulator(settings, track_pii=True)
    return list(simulator.events()), simulator


def test_same_seed_same_traffic_other_seed_other_traffic() -> None:
    first, _ = simulate()
    again, _ = simulate()
    other, _ = simulate(seed=12)
    assert first == again
    assert first != other


def test_every_event_is_valid_and_feedback_follows_its_interaction() -> None:
    events, _ = simulate()
    seen: set[object] = set()
    for event in events:
        validate_event(event)
        if event["type"] == "interaction":
            seen.add(event["request_id"])
        else:
            assert event["request_id"] in seen


def test_traffic_mix() -> None:
    events, simulator = simulate()
    interactions = [e for e in events if e["type"] == "interaction"]
    assert len(interactions) in {3_000, 3_001}
    lines = Counter(e["business_line"] for e in interactions)
    assert set(lines) == {"customer_service", "medical", "legal"}
    chinese = sum(
        1 for e in interactions if "的" in str(e["messages"]) or "我" in str(e["messages"])
    )
    assert 0.2 < chinese / len(interactions) < 0.5
    kinds = Counter(e["type"] for e in events)
    for signal in ("thumbs_up", "thumbs_down", "regenerate", "edit", "abandon", "task_outcome"):
        assert kinds[signal] > 20, signal
    prompts = Counter(e["prompt_hash"] for e in interactions)
    assert prompts.most_common(1)[0][1] > 30  # template floods repeat
    lengths = sorted(len(str(e["messages"][-1]["content"])) for e in interactions)  # type: ignore[index]
    assert lengths[-1] > 10 * lengths[len(lengths) // 2]  # heavy tail
    kinds_planted = Counter(p.kind for p in simulator.planted)
    assert set(kinds_planted) == {"name", "phone", "email", "id_number", "card", "address"}
    texts = " ".join(str(e.get("messages", "")) + str(e.get("edited_text", "")) for e in events)
    assert all(p.value in texts for p in simulator.planted)


def test_rates_shape_feedback() -> None:
    quiet, _ = simulate(
        rates=SignalRates(
            thumbs_up=0, thumbs_down=0, regenerate=0, edit=0, abandon=0, task_outcome=0
        )
    )
    assert {e["type"] for e in quiet} <= {"interaction", "abandon"}


def test_bad_business_line_is_refused() -> None:
    with pytest.raises(ValueError, match="business line"):
        simulate(business_lines=("Bad Line",))
