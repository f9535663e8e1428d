"""Users' unedited verdicts judged by the line's reviewed satisfaction (Bayes' rule)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from feedback.cleaning import Funnel, build_splits
from feedback.examples import build_examples, window_evidence
from feedback.label_precision import satisfaction_prior, signal_precision
from feedback.records import FeedbackRecord
from flywheel.settings.cleaning import DatasetSettings, LabelPrecisionSettings

SETTINGS = LabelPrecisionSettings()


def _record(rid: str, *feedback: dict[str, Any], version: str = "v1", **extra: Any):
    events = [{"id": hash((rid, i)) % 10**9, "rank": None, **f} for i, f in enumerate(feedback)]
    return FeedbackRecord.from_dict(
        {
            "request_id": rid,
            "user_id": extra.pop("user_id", f"u-{rid}"),
            "business_line": "customer_service",
            "adapter_name": version,
            "base_model": "base",
            "messages": [{"role": "user", "content": f"question {rid}"}],
            "response": extra.pop("response", f"answer {rid}"),
            "prompt_hash": f"p-{rid}",
            "created_at": "2026-11-01T00:00:00Z",
            "feedback": events,
            "edit": extra.pop("edit", None),
            **extra,
        }
    )


def _reviewed(prefix: str, passes: int, fails: int, version: str = "v1") -> list[FeedbackRecord]:
    verdicts = ["pass"] * passes + ["fail"] * fails
    return [
        _record(f"{prefix}{i}", {"type": "review", "outcome": v, "user_id": "r"}, version=version)
        for i, v in enumerate(verdicts)
    ]


def test_bayes_rule_on_a_thumb() -> None:
    """One answer in a hundred satisfying: a thumb ten times likelier on a good one is right
    about one time in eleven; at half satisfying, ten times in eleven."""
    assert signal_precision(True, 0.01, 10.0) == pytest.approx(0.1 / 1.09, rel=1e-6)
    assert signal_precision(True, 0.5, 10.0) == pytest.approx(10 / 11, rel=1e-6)
    assert signal_precision(False, 0.01, 10.0) > 0.998
    # A weaker signal is weaker evidence: a regenerate (weight 0.5) moves the odds by sqrt(LR).
    assert signal_precision(False, 0.9, 10.0, 0.5) == pytest.approx(
        0.1 * 10**0.5 / (0.1 * 10**0.5 + 0.9), rel=1e-6
    )
    assert signal_precision(True, 0.0, 10.0) == 0.0


def test_the_reviewed_rate_is_corrected_for_the_reviewers_error() -> None:
    """Reviewers wrong one time in ten pass about 10% of answers none of which satisfy."""
    prior = satisfaction_prior(11, 100, SETTINGS)
    assert prior.low == 0.0
    assert prior.high < 0.1
    better = satisfaction_prior(60, 100, SETTINGS)
    assert 0.54 < better.low < (0.6 - 0.1) / 0.8 < better.high < 0.75


def test_a_thumb_on_a_line_that_rarely_satisfies_is_held_an_edit_is_not() -> None:
    records = [
        *_reviewed("r", passes=10, fails=90),
        _record("up", {"type": "thumbs_up"}),
        _record("down", {"type": "thumbs_down"}),
        _record("edit", {"type": "edit"}, edit="The right answer."),
        _record("pass", {"type": "review", "outcome": "pass", "user_id": "r"}),
    ]
    examples = build_examples(records, evidence=window_evidence(records, SETTINGS))
    assert [e.rule for e in examples.sft] == ["edit"]
    assert {e.rule for e in examples.kto if e.label} == set()
    negatives = [e for e in examples.kto if not e.label]
    assert "thumbs_down" in {e.rule for e in negatives}
    assert all(0.99 < e.weight <= 1.0 for e in negatives if e.rule == "thumbs_down")
    # The thumb and the 11 reviewers' passes (ten of them wrong, by the line's rate).
    assert examples.dropped["unlikely_positive:sft"] == 12
    assert examples.dropped["unlikely_positive:kto"] == 12


def test_a_thumb_on_a_line_that_mostly_satisfies_joins_weighed_by_its_precision() -> None:
    records = [*_reviewed("r", passes=70, fails=30), _record("up", {"type": "thumbs_up"})]
    examples = build_examples(records, evidence=window_evidence(records, SETTINGS))
    (thumb,) = [e for e in examples.sft if e.rule == "thumbs_up"]
    assert 0.85 < thumb.weight < 1.0


def test_each_model_version_is_judged_by_its_own_reviews() -> None:
    """A canary that satisfies where the champion does not: its thumbs join, the champion's
    stay out (the window as a whole would hold both)."""
    records = [
        *_reviewed("c", passes=8, fails=92, version="champion"),
        *_reviewed("k", passes=28, fails=12, version="canary"),
        _record("up-champion", {"type": "thumbs_up"}, version="champion"),
        _record("up-canary", {"type": "thumbs_up"}, version="canary"),
    ]
    examples = build_examples(records, evidence=window_evidence(records, SETTINGS))
    thumbs = [e.lineage.request_ids[0] for e in examples.sft if e.rule == "thumbs_up"]
    assert thumbs == ["up-canary"]


def test_without_enough_reviews_verdicts_are_taken_as_they_are_or_held() -> None:
    records = [*_reviewed("r", passes=1, fails=9), _record("up", {"type": "thumbs_up"})]
    admitted = build_examples(records, evidence=window_evidence(records, SETTINGS))
    assert [e.weight for e in admitted.sft if e.rule == "thumbs_up"] == [1.0]
    hold = LabelPrecisionSettings(without_reviews="hold")
    held = build_examples(records, evidence=window_evidence(records, hold))
    assert [e.rule for e in held.sft if e.rule == "thumbs_up"] == []
    assert [e.rule for e in held.kto if e.label is False] == ["review_fail"] * 9


def test_a_pair_needs_a_likely_right_winner() -> None:
    """Thumbs up over thumbs down on one prompt pairs only where the thumb is likely right."""
    pair = [
        _record("a", {"type": "thumbs_up"}, response="good?"),
        _record("b", {"type": "thumbs_down"}, response="bad"),
    ]
    pair = [FeedbackRecord.from_dict(r.as_dict() | {"prompt_hash": "same"}) for r in pair]
    low = [*_reviewed("r", passes=5, fails=95), *pair]
    high = [*_reviewed("r", passes=60, fails=40), *pair]
    assert build_examples(low, evidence=window_evidence(low, SETTINGS)).dpo == []
    rules = [e.rule for e in build_examples(high, evidence=window_evidence(high, SETTINGS)).dpo]
    assert rules == ["thumbs_up>thumbs_down"]


@pytest.mark.parametrize("satisfied", [0.01, 0.1, 0.5, 0.8])
def test_admitted_thumbs_are_right_as_often_as_asked(satisfied: float) -> None:
    """A simulated line: answers satisfy at ``satisfied``, users thumb up 4% of good answers
    and 0.4% of bad ones (a likelihood ratio of 10), reviewers wrong 10% of the time review
    300 answers at random. The thumbs the rule admits are right at least ``min_precision``
    of the time (up to sampling error), where taking every thumb would not be on a line
    that rarely satisfies."""
    rng = random.Random(7)
    records, truth, thumbed = [], {}, 0
    for i in range(20_000):
        good = rng.random() < satisfied
        feedback: list[dict[str, Any]] = []
        if rng.random() < (0.04 if good else 0.004):
            feedback.append({"type": "thumbs_up"})
            thumbed += 1
        if i < 300:
            right = rng.random() >= 0.1
            feedback.append(
                {"type": "review", "outcome": "pass" if good == right else "fail", "user_id": "r"}
            )
        if feedback:
            records.append(_record(str(i), *feedback))
            truth[str(i)] = good
    examples = build_examples(records, evidence=window_evidence(records, SETTINGS))
    thumbs = [e.lineage.request_ids[0] for e in examples.sft if e.rule == "thumbs_up"]
    if thumbs:
        right = sum(truth[rid] for rid in thumbs) / len(thumbs)
        assert right >= SETTINGS.min_precision - 0.1
    if satisfied <= 0.1:
        assert thumbs == []
    if satisfied >= 0.5:
        assert len(thumbs) == thumbed


def test_the_funnel_records_the_priors_that_judged_the_labels() -> None:
    records = [*_reviewed("r", passes=10, fails=90), _record("up", {"type": "thumbs_up"})]
    funnel = Funnel()
    build_splits(records, DatasetSettings(), funnel)
    assert funnel.as_dict()["priors"]["v1"]["reviews"] == 100
    assert funnel.dropped["unlikely_positive:sft"] == 11  # the thumb and 10 reviewers' passes
