"""The sticky canary split: share, stickiness, monotone ramp-up."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry.routing import RoutingTable, choose_arm, split_point

TABLE = RoutingTable(
    business_line="customer_service",
    champion="customer_service-v3",
    canary="customer_service-v4",
)
USERS = [f"user-{i}" for i in range(100_000)]


def test_five_percent_of_100k_users_go_to_the_canary() -> None:
    arms = [choose_arm(TABLE, user)[0] for user in USERS]
    share = arms.count("canary") / len(USERS)
    assert abs(share - 0.05) <= 0.003, share
    assert set(arms) == {"canary", "champion"}


def test_every_user_sees_one_arm_across_repeated_requests() -> None:
    first = {user: choose_arm(TABLE, user) for user in USERS[:20_000]}
    for _ in range(3):
        assert all(choose_arm(TABLE, user) == arm for user, arm in first.items())


def test_ramping_up_only_moves_users_to_the_canary() -> None:
    before = {u for u in USERS[:20_000] if choose_arm(TABLE, u)[0] == "canary"}
    wider = TABLE.model_copy(update={"canary_fraction": 0.30})
    after = {u for u in USERS[:20_000] if choose_arm(wider, u)[0] == "canary"}
    assert before < after
    assert abs(len(after) / 20_000 - 0.30) < 0.02


def test_rollback_to_zero_and_no_champion() -> None:
    off = TABLE.model_copy(update={"canary_fraction": 0.0})
    assert {choose_arm(off, u) for u in USERS[:5_000]} == {("champion", "customer_service-v3")}
    fresh = RoutingTable(business_line="legal")
    assert choose_arm(fresh, "anyone") == ("base", None)


def test_a_new_canary_samples_other_users() -> None:
    other = TABLE.model_copy(update={"canary": "customer_service-v5"})
    a = {u for u in USERS[:20_000] if choose_arm(TABLE, u)[0] == "canary"}
    b = {u for u in USERS[:20_000] if choose_arm(other, u)[0] == "canary"}
    assert len(a & b) < 0.2 * len(a)


def test_the_canary_must_differ_from_the_champion() -> None:
    with pytest.raises(ValueError, match="must differ"):
        RoutingTable(business_line="legal", champion="legal-v1", canary="legal-v1")


@given(st.text(max_size=40), st.text(min_size=1, max_size=20))
def test_split_points_are_stable_and_in_range(key: str, salt: str) -> None:
    point = split_point(key, salt)
    assert 0.0 <= point < 1.0
    assert point == split_point(key, salt)
