"""What a line's nightly run does with its window when a stage fails or a canary is live.

The stages are replaced by plain functions (the real ones train for minutes); the
window, the watermark and the routing are the real ones on the embedded store. On main
a failure left the window pending, every later night resumed it and failed the same way.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

import flows.nightly as nightly
from feedback.store import FeedbackStore
from feedback.watermarks import WatermarkStore
from flywheel.errors import FlywheelError
from flywheel.settings import Settings
from registry.routes import RouteStore
from registry.vllm_admin import VllmUnavailableError
from tests.routing import set_canary

LINE = "legal"


@pytest.fixture
def stages(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The window tasks as plain functions; datasets and training recorded, not run."""
    calls: dict[str, Any] = {"datasets": 0, "train": None}
    monkeypatch.setattr(nightly, "open_window", nightly.open_window.fn)
    monkeypatch.setattr(nightly, "close_window", _close_window)

    def datasets(settings: Settings, line: str, window: Any) -> dict[str, Any]:
        calls["datasets"] += 1
        return {"dataset": "abc", "train_examples": {"dpo": 50}, "funnel": {}}

    def train(settings: Settings, line: str, dataset: str | None) -> dict[str, Any]:
        raise calls["train"]

    monkeypatch.setattr(nightly, "build_datasets", datasets)
    monkeypatch.setattr(nightly, "train_and_gate", train)
    return calls


def _close_window(settings: Settings, window: Any, outcome: str, *, consumed: bool) -> None:
    store = FeedbackStore.open(settings)
    marks = WatermarkStore(store.engine)
    now = datetime.now(UTC)
    if consumed:
        marks.close_window(window, run_id=None, outcome=outcome, now=now)
    else:
        marks.release_window(window, outcome=outcome, now=now)
    store.close()


def _mark(settings: Settings) -> dict[str, Any]:
    store = FeedbackStore.open(settings)
    try:
        return WatermarkStore(store.engine).watermarks().get(LINE, {})
    finally:
        store.close()


def test_a_deterministic_failure_closes_the_window_as_failed(
    settings: Settings, stages: dict[str, Any]
) -> None:
    stages["train"] = FlywheelError("the legal recipe's LoRA rank 32 is above --max-lora-rank 16")
    report = nightly.LineReport(LINE)
    nightly._run_line(settings, LINE, report, 1, None)
    assert report.status == "failed"
    assert "rank 32" in report.reason
    mark = _mark(settings)
    assert mark["watermark"] is not None
    assert mark["pending_until"] is None
    # The next night starts clean on a new window instead of resuming the failed one.
    store = FeedbackStore.open(settings)
    following = WatermarkStore(store.engine).open_window(LINE, datetime.now(UTC))
    store.close()
    assert not following.resumed


def test_a_transient_failure_keeps_the_window_for_a_retry(
    settings: Settings, stages: dict[str, Any]
) -> None:
    stages["train"] = VllmUnavailableError("vLLM at http://127.0.0.1:8000 is unreachable")
    report = nightly.LineReport(LINE)
    with pytest.raises(VllmUnavailableError):
        nightly._run_line(settings, LINE, report, 1, None)
    assert "will retry" in report.reason
    assert _mark(settings).get("watermark") is None


def test_a_live_canary_skips_the_line_and_keeps_its_data(
    settings: Settings, stages: dict[str, Any]
) -> None:
    store = FeedbackStore.open(settings)
    set_canary(RouteStore(store.engine), LINE, f"{LINE}-v3", 0.3, actor="test")
    store.close()
    report = nightly.LineReport(LINE)
    nightly._run_line(settings, LINE, report, 1, None)
    assert report.status == "canary_live"
    assert "legal-v3" in report.reason
    assert stages["datasets"] == 0  # no CPU spent on a candidate that could not deploy
    assert _mark(settings).get("watermark") is None
