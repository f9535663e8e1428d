"""The shadow comparison on hand-made pairs, its query on a real store, and its decision."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest

from feedback.shadow import (
    ShadowPair,
    answer_similarity,
    has_high_risk_pii,
    pair_of,
    shadow_pairs,
)
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from registry.shadow import (
    ShadowAction,
    ShadowPolicy,
    compare_shadow,
    judge_shadow,
    length_ratio_interval,
)

SHADOW = "customer_service-v3"
REFUSAL = "I'm sorry, but I can't help with that."


def _pair(
    champion_tokens: int = 20,
    shadow_tokens: int = 20,
    *,
    ok: bool = True,
    champion_refused: bool = False,
    shadow_refused: bool = False,
    champion_pii: bool = False,
    shadow_pii: bool = False,
    similarity: float = 0.5,
) -> ShadowPair:
    return ShadowPair(
        "req",
        ok,
        champion_tokens,
        shadow_tokens if ok else 0,
        champion_refused,
        shadow_refused and ok,
        champion_pii,
        shadow_pii and ok,
        similarity if ok else 0.0,
    )


def test_the_report_counts_pairs_lengths_refusals_pii_and_difference() -> None:
    pairs = [
        _pair(10, 20, similarity=1.0),
        _pair(20, 40, shadow_refused=True),
        _pair(30, 60, champion_refused=True, shadow_refused=True, shadow_pii=True),
        _pair(40, 80, champion_pii=True, similarity=0.0),
        _pair(ok=False),
    ]
    report = compare_shadow(SHADOW, pairs)
    assert (report.attempts, report.errors, report.pairs) == (5, 1, 4)
    assert report.error_rate == pytest.approx(0.2)
    assert (report.champion_tokens_mean, report.shadow_tokens_mean) == (25.0, 50.0)
    # Every pair doubles: the ratio is exactly 2 with no spread.
    assert report.length_ratio == pytest.approx(2.0)
    assert report.length_ratio_low == pytest.approx(2.0)
    assert report.length_ratio_high == pytest.approx(2.0)
    refusals = report.refusals
    assert (refusals.champion, refusals.shadow, refusals.shadow_only) == (1, 2, 1)
    assert refusals.champion_only == 0
    assert refusals.p_value == pytest.approx(0.5)  # one discordant pair: a coin
    assert (report.pii.shadow_only, report.pii.champion_only) == (1, 1)
    assert report.pii.p_value == pytest.approx(0.75)
    assert report.similarity_mean == pytest.approx(0.5)
    assert report.identical == 1
    assert report.as_dict()["refusals"]["shadow"] == 2


def test_the_exact_mcnemar_p_value_is_the_binomial_tail() -> None:
    pairs = [_pair(shadow_refused=True)] * 6 + [_pair()] * 94
    assert compare_shadow(SHADOW, pairs).refusals.p_value == pytest.approx(0.5**6)
    pairs += [_pair(champion_refused=True)] * 2
    # P(X >= 6), X ~ Binomial(8, 1/2) = (28 + 8 + 1) / 256
    assert compare_shadow(SHADOW, pairs).refusals.p_value == pytest.approx(37 / 256)


def test_the_length_ratio_interval_covers_the_truth_about_95_percent() -> None:
    rng = random.Random(7)
    covered = 0
    for _ in range(400):
        champion = [rng.lognormvariate(3, 0.5) for _ in range(80)]
        shadow = [c * rng.lognormvariate(0.1, 0.3) for c in champion]
        # The shadow is the champion times an independent factor: the ratio of the means
        # is the factor's mean, exp(0.1 + 0.3²/2).
        truth = math.exp(0.1 + 0.3**2 / 2)
        interval = length_ratio_interval(champion, shadow)
        assert interval is not None
        covered += interval[0] <= truth <= interval[1]
    assert 0.91 <= covered / 400 <= 0.99
    assert length_ratio_interval([1.0], [2.0]) is None
    assert length_ratio_interval([0.0, 0.0], [1.0, 2.0]) is None


def test_one_pair_is_read_for_refusal_pii_and_similarity() -> None:
    pair = pair_of(
        "req-1",
        "Sure: write to help@example.com.",
        {"output_tokens": 9},
        REFUSAL,
        None,
        "ok",
    )
    assert (pair.champion_refused, pair.shadow_refused) == (False, True)
    assert (pair.champion_pii, pair.shadow_pii) == (True, False)
    assert pair.champion_tokens == 9
    assert pair.shadow_tokens == (len(REFUSAL) + 3) // 4
    assert 0 < pair.similarity < 0.2
    failed = pair_of("req-2", "fine", None, "", None, "error")
    assert (failed.shadow_ok, failed.shadow_tokens, failed.shadow_refused) == (False, 0, False)
    assert has_high_risk_pii("call me at +1-903-140-4508 or 13812345678")
    assert not has_high_risk_pii("The meeting is on 2024-05-01 for 3 hours.")
    assert answer_similarity("Hello, World", "world hello") == 1.0
    assert answer_similarity("", "") == 1.0
    assert answer_similarity("a b", "c d") == 0.0


POLICY = ShadowPolicy(fraction=0.1, min_pairs=100, max_pairs=400)


def test_below_the_minimum_it_waits_even_for_a_shadow_that_refuses_everything() -> None:
    report = compare_shadow(SHADOW, [_pair(shadow_refused=True)] * 99)
    decision = judge_shadow(report, POLICY)
    assert decision.action is ShadowAction.WAIT
    assert "100 pairs needed" in decision.reasons[0]
    assert judge_shadow(compare_shadow(SHADOW, []), POLICY).action is ShadowAction.WAIT


def test_a_shadow_that_refuses_more_is_rejected() -> None:
    pairs = [_pair(shadow_refused=True)] * 12 + [_pair(champion_refused=True)] * 2
    pairs += [_pair()] * 86
    decision = judge_shadow(compare_shadow(SHADOW, pairs), POLICY)
    assert decision.action is ShadowAction.REJECT
    assert decision.reasons[0].startswith("refusal: shadow 12.0% vs champion 2.0%")
    assert [c.verdict for c in decision.checks if c.metric == "refusal"] == ["WORSE"]


def test_a_good_shadow_advances() -> None:
    rng = random.Random(3)
    pairs = []
    for _ in range(150):
        tokens = rng.randint(10, 60)
        pairs.append(_pair(tokens, tokens + rng.randint(-5, 5)))
    pairs += [_pair(champion_refused=True, shadow_refused=True)]
    decision = judge_shadow(compare_shadow(SHADOW, pairs), POLICY)
    assert decision.action is ShadowAction.ADVANCE, decision.reasons
    assert {c.verdict for c in decision.checks} == {"OK"}


def test_errors_pii_and_length_each_reject() -> None:
    failing = [_pair(ok=False)] * 10 + [_pair()] * 90
    assert judge_shadow(compare_shadow(SHADOW, failing), POLICY).action is ShadowAction.REJECT
    # A broken shadow is rejected before it has min_pairs answered pairs.
    broken = judge_shadow(compare_shadow(SHADOW, [_pair(ok=False)] * 100), POLICY)
    assert broken.action is ShadowAction.REJECT
    assert "100 of 100 shadow answers failed" in broken.reasons[0]
    leaking = [_pair(shadow_pii=True)] * 8 + [_pair()] * 92
    decision = judge_shadow(compare_shadow(SHADOW, leaking), POLICY)
    assert decision.action is ShadowAction.REJECT
    assert decision.reasons[0].startswith("pii:")
    rambling = [_pair(20, 70 + i % 7) for i in range(100)]
    decision = judge_shadow(compare_shadow(SHADOW, rambling), POLICY)
    assert decision.action is ShadowAction.REJECT
    assert decision.reasons[0].startswith("length:")


def test_an_unproven_worse_count_waits_then_runs_out_of_patience() -> None:
    # 4 more refusals in 100: above the 2% margin, p = 1/16 > 0.05.
    unsure = [_pair(shadow_refused=True)] * 4 + [_pair()] * 96
    assert judge_shadow(compare_shadow(SHADOW, unsure), POLICY).action is ShadowAction.WAIT
    later = [_pair(shadow_refused=True)] * 4 + [_pair()] * 396
    patient = ShadowPolicy(fraction=0.1, min_pairs=100, max_pairs=400, refusal_margin=0.005)
    decision = judge_shadow(compare_shadow(SHADOW, later), patient)
    assert decision.action is ShadowAction.REJECT
    assert "not sure either way after 400 pairs" in decision.reasons[-1]


def test_the_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="band"):
        ShadowPolicy(length_ratio_band=(1.2, 2.0))
    with pytest.raises(ValueError, match="max_pairs"):
        ShadowPolicy(min_pairs=500, max_pairs=100)


def test_pairs_are_read_from_the_store_for_one_adapter_and_window(settings: Settings) -> None:
    store = FeedbackStore.open(settings)
    now = datetime.now(UTC)

    def interaction(request_id: str, response: str, status: str = "ok") -> dict[str, object]:
        return {
            "type": "interaction",
            "request_id": request_id,
            "business_line": "customer_service",
            "adapter_name": "customer_service-v1",
            "adapter_version": 1,
            "base_model": "base",
            "messages": [{"role": "user", "content": "q"}],
            "response": response,
            "status": status,
            "metadata": {"output_tokens": 4},
            "created_at": now.isoformat(),
        }

    store.ingest(
        [interaction("r1", "An answer."), interaction("r2", "Another."), interaction("r3", "x")],
        source="test",
    )

    def shadow(request_id: str, adapter: str = SHADOW, **extra: object) -> dict[str, object]:
        return {
            "request_id": request_id,
            "business_line": "customer_service",
            "adapter_name": adapter,
            "response": REFUSAL,
            "output_tokens": 11,
            "status": "ok",
            "created_at": now.isoformat(),
        } | extra

    old = (now - timedelta(days=2)).isoformat()
    store.add_shadow_outputs(
        [
            shadow("r1"),
            shadow("r2", status="error", response="", output_tokens=None),
            shadow("r3", created_at=old),
            shadow("r1", adapter="customer_service-v4"),
        ]
    )
    pairs = shadow_pairs(
        store.engine, "customer_service", SHADOW, now - timedelta(hours=1), now + timedelta(1)
    )
    store.close()
    by_id = {p.request_id: p for p in pairs}
    assert set(by_id) == {"r1", "r2"}
    assert (by_id["r1"].champion_tokens, by_id["r1"].shadow_tokens) == (4, 11)
    assert by_id["r1"].shadow_refused
    assert not by_id["r1"].champion_refused
    assert not by_id["r2"].shadow_ok
