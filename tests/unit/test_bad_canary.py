"""`flywheel loop --bad-canary`: the night's canary is the inverted adapter, whatever the
nightly's own candidate did (the lifecycle, the training and the deploy are faked; what the
inverted night asks of them, in order, is the logic under test; the lifecycle's own handling
of a canary stopped by hand is tests/unit/test_lifecycle.py's)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import composition.line_training
import composition.rollout
import flywheel.settings
from lab.simulation.live import _deploy_inverted


class _Rollout:
    """The lifecycle's parts as the inverted night uses them: the line's live canary (None:
    none) and the event it is sent."""

    def __init__(self, calls: list[str], line: str, actor: str, canary: str | None) -> None:
        self.calls, self.line, self.actor, self.canary = calls, line, actor, canary

    def state(self) -> Any:
        return SimpleNamespace(table=SimpleNamespace(canary=self.canary))

    def advance(self, state: Any, event: Any) -> Any:
        return (type(event).__name__, event.reason)

    def apply(self, state: Any, transition: Any) -> None:
        name, reason = transition
        self.calls.append(f"{name} {self.line} by {self.actor}: {reason}")


@pytest.fixture
def live_canary() -> list[str | None]:
    """The canary live on the line when the inverted night starts (set by a test)."""
    return [None]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, live_canary: list[str | None]) -> list[str]:
    made: list[str] = []

    def train_line(settings: Any, clients: Any, line: str, **kwargs: Any) -> Any:
        made.append(f"train {line} inverted={kwargs.get('invert_preferences')}")
        return SimpleNamespace(version=3, reason="trained")

    def deploy_canary(settings: Any, clients: Any, line: str, version: int, upstreams: Any) -> Any:
        made.append(f"deploy {line}-v{version}")
        return SimpleNamespace(status="canary", reason="on 5%", adapter=f"{line}-v{version}")

    def rollout(settings: Any, clients: Any, line: str, upstreams: Any, *, actor: str) -> Any:
        return _Rollout(made, line, actor, live_canary[0])

    monkeypatch.setattr(composition.rollout, "rollout", rollout)
    monkeypatch.setattr(composition.line_training, "train_line", train_line)
    monkeypatch.setattr(composition.rollout, "deploy_canary", deploy_canary)
    monkeypatch.setattr(
        flywheel.settings,
        "load_settings",
        lambda: SimpleNamespace(gateway=SimpleNamespace(upstreams=("http://vllm",))),
    )
    return made


def test_the_nightly_s_own_canary_is_cleared_before_the_inverted_one_is_deployed(
    calls: list[str], live_canary: list[str | None]
) -> None:
    live_canary[0] = "cs-v2"
    result = _deploy_inverted(SimpleNamespace(), "cs")  # type: ignore[arg-type]
    assert calls == [
        "CanaryStoppedByHand cs by loop --bad-canary: "
        "cs-v2 replaced by an adapter trained on inverted preferences",
        "train cs inverted=True",
        "deploy cs-v3",
    ]
    assert (result.status, result.version, result.adapter) == ("deployed", 3, "cs-v3")
    assert "inverted preferences" in result.reason


def test_a_canary_still_undecided_from_an_earlier_day_is_cleared_too(
    calls: list[str], live_canary: list[str | None]
) -> None:
    """With a canary live from an earlier day the nightly keeps it and deploys nothing; the
    inverted adapter must still be the one the day's users meet (it was not: the undecided
    canary stayed and the inverted one's deploy was refused)."""
    live_canary[0] = "cs-v2"
    _deploy_inverted(SimpleNamespace(), "cs")  # type: ignore[arg-type]
    assert calls == [
        "CanaryStoppedByHand cs by loop --bad-canary: "
        "cs-v2 replaced by an adapter trained on inverted preferences",
        "train cs inverted=True",
        "deploy cs-v3",
    ]


def test_no_live_canary_leaves_the_routes_alone(calls: list[str]) -> None:
    _deploy_inverted(SimpleNamespace(), "cs")  # type: ignore[arg-type]
    assert calls == ["train cs inverted=True", "deploy cs-v3"]
