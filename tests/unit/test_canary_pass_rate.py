"""The human pass rate in the canary decision: its own worse / non-inferior test, a
recipe minimum of reviews before a promotion, a share of the rollback budget, and the
same decision read from review events in a real store."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from composition.recipes import Recipe
from feedback.online import adapter_windows
from feedback.store import FeedbackStore
from flywheel.settings import load_settings
from registry.canary import (
    PASS_RATE,
    RATES,
    WORSE_TESTS,
    ArmStats,
    CanaryAction,
    CanaryPolicy,
    ReviewTest,
    decide_canary,
)
from registry.canary import _arm as arm_of_window

# Users say the same of both arms: every user rate is shown non-inferior on its own.
USERS = ArmStats(adapter="x", requests=4000, thumbs_down=200, regenerate=120, dissatisfied=400)


def _reviewed(reviews: int, pass_rate: float) -> ArmStats:
    return replace(USERS, reviews=reviews, review_failures=round(reviews * (1 - pass_rate)))


def _policy(min_reviews: int = 0, margin: float = 0.05) -> CanaryPolicy:
    return CanaryPolicy(
        min_requests=200, alpha=0.05, reviews=ReviewTest(min_reviews=min_reviews, margin=margin)
    )


def _check(decision: object) -> object:
    return next(c for c in decision.checks if c.metric == PASS_RATE)  # type: ignore[attr-defined]


def test_users_alone_promote_the_canary() -> None:
    decision = decide_canary(USERS, USERS, CanaryPolicy(min_requests=200), look=1)
    assert decision.action is CanaryAction.PROMOTE
    assert all(c.metric != PASS_RATE for c in decision.checks)


def test_a_canary_reviewers_fail_is_rolled_back_though_users_rate_it_the_same() -> None:
    champion, canary = _reviewed(300, 0.92), _reviewed(300, 0.70)
    decision = decide_canary(champion, canary, _policy(), look=1)
    assert decision.action is CanaryAction.ROLLBACK
    check = _check(decision)
    assert check.verdict == "WORSE"  # type: ignore[attr-defined]
    assert check.champion == pytest.approx(0.92)  # type: ignore[attr-defined]
    assert check.canary == pytest.approx(0.70)  # type: ignore[attr-defined]
    assert any(
        "pass rate: canary 70.0% vs champion 92.0% (300 canary" in r for r in decision.reasons
    )
    # The same numbers with equal pass rates: promoted.
    same = decide_canary(champion, _reviewed(300, 0.92), _policy(), look=1)
    assert same.action is CanaryAction.PROMOTE
    assert any("pass rate" in r for r in same.reasons)


def test_a_minimum_of_reviews_holds_a_promotion_until_it_is_met() -> None:
    policy = _policy(min_reviews=100)
    few = decide_canary(_reviewed(400, 0.9), _reviewed(60, 0.9), policy, look=1)
    assert few.action is CanaryAction.WAIT
    assert _check(few).verdict == "UNPROVEN"  # type: ignore[attr-defined]
    assert any("fewer than 100 reviews" in r for r in few.reasons)
    none = decide_canary(USERS, USERS, policy, look=1)
    assert none.action is CanaryAction.WAIT
    assert any("waiting for reviews" in r for r in none.reasons)
    # Still waiting at the last look: given up, never promoted on too few.
    assert decide_canary(USERS, USERS, policy, look=policy.max_looks).action == "rollback"
    enough = decide_canary(_reviewed(2000, 0.9), _reviewed(2000, 0.9), policy, look=1)
    assert enough.action is CanaryAction.PROMOTE
    # Enough reviews but not enough to show non-inferiority within the margin: waits.
    close = decide_canary(_reviewed(150, 0.9), _reviewed(150, 0.88), policy, look=1)
    assert close.action is CanaryAction.WAIT
    # Without a minimum the pass rate is a guardrail: no reviews hold nothing.
    guard = decide_canary(USERS, USERS, _policy(), look=1)
    assert guard.action is CanaryAction.PROMOTE


def test_the_pass_rate_takes_its_share_of_the_rollback_budget() -> None:
    assert CanaryPolicy().worse_alpha == pytest.approx(0.05 / WORSE_TESTS)
    assert _policy().worse_alpha == pytest.approx(0.05 / (WORSE_TESTS + 1))


def test_equal_pass_rates_rarely_roll_back_over_many_looks() -> None:
    """Reviews accrue look by look on two arms with the same pass rate: the share of
    canaries the pass rate rolls back stays under its level (anytime-valid)."""
    rng = np.random.default_rng(5)
    policy = _policy()
    canaries, wrong = 300, 0
    for _ in range(canaries):
        fails = [0, 0]
        for look in range(1, 21):
            fails = [f + int(rng.binomial(20, 0.15)) for f in fails]
            champion = replace(USERS, reviews=20 * look, review_failures=fails[0])
            canary = replace(USERS, reviews=20 * look, review_failures=fails[1])
            check = _check(decide_canary(champion, canary, policy, look=look))
            if check.verdict == "WORSE":  # type: ignore[attr-defined]
                wrong += 1
                break
    assert wrong / canaries <= policy.worse_alpha + 0.01, wrong


def test_the_recipe_review_block_sets_the_canary_policy() -> None:
    recipe = Recipe.model_validate(
        {
            "business_line": "medical",
            "method": "sft",
            "epochs": 1,
            "review": {"rubric": ["correct", "unsafe"], "min_reviews": 30, "margin": 0.04},
        }
    )
    policy = recipe.canary_policy()
    assert policy.reviews == ReviewTest(min_reviews=30, margin=0.04)
    assert recipe.review is not None
    assert recipe.review.share_of("canary") == 0.2
    plain = Recipe.model_validate({"business_line": "medical", "method": "sft", "epochs": 1})
    assert plain.canary_policy().reviews is None
    with pytest.raises(ValueError, match="rubric reasons must be distinct"):
        Recipe.model_validate(
            {"business_line": "m", "method": "sft", "epochs": 1, "review": {"rubric": ["a", "a"]}}
        )
    with pytest.raises(ValueError, match="review share of canary"):
        Recipe.model_validate(
            {
                "business_line": "m",
                "method": "sft",
                "epochs": 1,
                "review": {"rubric": ["a"], "share": {"canary": 1.5}},
            }
        )


def _store_with_reviews(home: Path, canary_pass: float) -> tuple[ArmStats, ArmStats]:
    """Both arms answered 400 requests with the same user feedback; reviewers judged 150 of
    each arm's answers, passing the champion's 90% of the time and the canary's
    ``canary_pass``. The arms' numbers as the canary flow reads them from the store."""
    settings = load_settings(home=home, database_url=f"sqlite:///{home / 'flywheel.db'}")
    store = FeedbackStore.open(settings)
    start = datetime(2026, 12, 1, tzinfo=UTC)
    rng = random.Random(3)
    records: list[dict[str, object]] = []
    for adapter, pass_rate in (("line-v1", 0.9), ("line-v2", canary_pass)):
        for n in range(400):
            request_id = f"{adapter}-{n}"
            when = start + timedelta(seconds=n)
            records.append(
                {
                    "type": "interaction",
                    "request_id": request_id,
                    "business_line": "medical",
                    "adapter_name": adapter,
                    "base_model": "tiny",
                    "messages": [{"role": "user", "content": f"question {n}"}],
                    "response": f"answer {n}",
                    "created_at": when.isoformat(),
                }
            )
            if n % 10 == 0:
                records.append(
                    {
                        "type": "thumbs_down",
                        "request_id": request_id,
                        "created_at": when.isoformat(),
                    }
                )
            if n < 150:
                records.append(
                    {
                        "type": "review",
                        "request_id": request_id,
                        "outcome": "pass" if rng.random() < pass_rate else "fail",
                        "metadata": {"reason": "checked", "reviewer": f"r{n % 3}"},
                        "created_at": (when + timedelta(minutes=5)).isoformat(),
                    }
                )
    report = store.ingest(records, source="test")
    assert report.quarantined == 0, report.rejections
    windows = adapter_windows(
        store.engine, "medical", ["line-v1", "line-v2"], start, start + timedelta(hours=1)
    )
    store.close()
    return arm_of_window(windows, "line-v1"), arm_of_window(windows, "line-v2")


def test_the_decision_read_from_the_store_follows_the_pass_rates(tmp_path: Path) -> None:
    policy = CanaryPolicy(min_requests=200, margins=dict.fromkeys(RATES, 0.08)).model_copy(
        update={"reviews": ReviewTest(min_reviews=100, margin=0.1)}
    )
    same_champion, same_canary = _store_with_reviews(tmp_path / "same", 0.9)
    worse_champion, worse_canary = _store_with_reviews(tmp_path / "worse", 0.55)
    assert same_champion.reviews == same_canary.reviews == 150
    assert same_canary.thumbs_down == worse_canary.thumbs_down == 40
    assert worse_canary.review_failures > 2 * worse_champion.review_failures
    same = decide_canary(same_champion, same_canary, policy, look=1)
    worse = decide_canary(worse_champion, worse_canary, policy, look=1)
    assert same.action is CanaryAction.PROMOTE, same.reasons
    assert worse.action is CanaryAction.ROLLBACK, worse.reasons
    assert [c.metric for c in worse.checks if c.verdict == "WORSE"] == [PASS_RATE]


def test_each_answer_carries_its_users_signals_and_a_review_is_not_one(tmp_path: Path) -> None:
    """What the canary's satisfaction estimate folds into each answer's score: the user's
    own signals (a task outcome by its result), never a reviewer's verdict or correction."""
    from feedback.events import Signal
    from feedback.online import arm_answers

    settings = load_settings(home=tmp_path, database_url=f"sqlite:///{tmp_path / 'f.db'}")
    store = FeedbackStore.open(settings)
    start = datetime(2026, 12, 1, tzinfo=UTC)
    events: dict[str, list[dict[str, object]]] = {
        "r-0": [{"type": "thumbs_down"}, {"type": "regenerate"}],
        "r-1": [{"type": "task_outcome", "outcome": "success"}],
        "r-2": [
            {
                "type": "review",
                "outcome": "fail",
                "edited_text": "a better answer",
                "metadata": {"reason": "wrong fix", "reviewer": "r1"},
            }
        ],
        "r-3": [],
    }
    records: list[dict[str, object]] = []
    for n, (request_id, feedback) in enumerate(events.items()):
        when = (start + timedelta(seconds=n)).isoformat()
        records.append(
            {
                "type": "interaction", "request_id": request_id, "business_line": "medical",
                "adapter_name": "line-v1", "base_model": "tiny", "created_at": when,
                "messages": [{"role": "user", "content": f"question {n}"}],
                "response": f"answer {n}",
            }
        )  # fmt: skip
        records.extend({**e, "request_id": request_id, "created_at": when} for e in feedback)
    report = store.ingest(records, source="test")
    assert report.quarantined == 0, report.rejections
    answers = arm_answers(store.engine, "medical", "line-v1", start, start + timedelta(hours=1))
    store.close()
    found = {a.request_id: (a.signals, a.passed) for a in answers}
    assert found == {
        "r-0": (frozenset({Signal.THUMBS_DOWN, Signal.REGENERATE}), None),
        "r-1": (frozenset({Signal.TASK_SUCCESS}), None),
        "r-2": (frozenset(), False),
        "r-3": (frozenset(), None),
    }
