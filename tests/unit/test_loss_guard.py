"""The loss guard's pure parts: where it measures, its limit, and the guard a recipe gets."""

from __future__ import annotations

from typing import Any

import pytest

from composition.line_training import general_loss_guard
from composition.recipes import Recipe
from eval.gate import GatePolicy
from training.train import guard_steps, loss_limit


@pytest.mark.parametrize(
    ("total", "checks", "steps"),
    [
        (48, 4, (1, 2, 4, 8, 12, 24, 36, 48)),
        (48, 8, (1, 2, 4, 6, 12, 18, 24, 30, 36, 42, 48)),
        (10, 4, (1, 2, 3, 5, 8, 10)),
        # More checks than steps: every step once.
        (3, 8, (1, 2, 3)),
        (1, 1, (1,)),
        (48, 0, ()),
    ],
)
def test_checks_are_spread_evenly_after_a_few_early_ones_and_the_last_is_the_last_step(
    total: int, checks: int, steps: tuple[int, ...]
) -> None:
    assert guard_steps(total, checks) == steps


def test_the_limit_is_the_tighter_of_the_two_bounds() -> None:
    # 10% over a base of 1.30 is 1.43; 20% over a continued champion at 1.25 is 1.50.
    assert loss_limit(1.30, 1.25, 0.10, 0.20) == pytest.approx(1.43)
    # A champion already near the bound: 20% over 1.10 (1.32) is the tighter.
    assert loss_limit(1.30, 1.10, 0.10, 0.20) == pytest.approx(1.32)
    assert loss_limit(1.30, 1.10, None, 0.20) == pytest.approx(1.32)
    assert loss_limit(1.30, 1.10, 0.10, None) == pytest.approx(1.43)
    assert loss_limit(1.30, 1.10, None, None) is None


def test_the_limit_keeps_headroom_for_the_gates_own_measure() -> None:
    # The legal night the gate refused: the guard kept 1.6903 under 1.6904, the gate
    # measured 1.6923. Half a percent under the bound, that step is over the limit.
    limit = loss_limit(1.3003, 1.3003, 0.3, None, headroom=0.005)
    assert limit == pytest.approx(1.3003 * 1.3 * 0.995)
    assert limit < 1.6903
    guard = general_loss_guard(recipe(), continues=False, has_champion=False)
    assert guard is not None
    assert guard.headroom == 0.005


def recipe(loss_checks: int = 8, **gate: Any) -> Recipe:
    return Recipe(
        business_line="medical",
        method="sft",
        max_steps=48,
        loss_checks=loss_checks,
        gate=GatePolicy(**gate),
    )


def test_a_first_night_is_held_to_both_bounds_over_the_base_model() -> None:
    guard = general_loss_guard(
        recipe(max_general_loss_increase=0.2, max_general_loss_drift=0.1),
        continues=False,
        has_champion=False,
    )
    assert guard is not None
    assert (guard.checks, guard.max_over_base, guard.max_over_start) == (8, 0.1, None)


def test_a_continued_champion_is_held_to_its_increase_and_to_the_drift_over_base() -> None:
    guard = general_loss_guard(
        recipe(max_general_loss_increase=0.2, max_general_loss_drift=0.6),
        continues=True,
        has_champion=True,
    )
    assert guard is not None
    assert (guard.max_over_base, guard.max_over_start) == (0.6, 0.2)


def test_a_fresh_adapter_beside_a_champion_leaves_the_increase_over_it_to_the_gate() -> None:
    guard = general_loss_guard(
        recipe(max_general_loss_increase=0.2, max_general_loss_drift=0.6),
        continues=False,
        has_champion=True,
    )
    assert guard is not None
    assert (guard.max_over_base, guard.max_over_start) == (0.6, None)
    # Without a drift bound nothing is known to bound it before the gate.
    assert (
        general_loss_guard(
            recipe(max_general_loss_increase=0.2), continues=False, has_champion=True
        )
        is None
    )


def test_no_checks_no_guard() -> None:
    assert general_loss_guard(recipe(loss_checks=0), continues=False, has_champion=False) is None
