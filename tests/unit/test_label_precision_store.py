"""Label precision through the embedded store: reviews stored as the review queue stores them,
pulled with the window, judge the users' thumbs before they train."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from feedback.cleaning import clean_line
from feedback.records import FeedbackRecord
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from flywheel.settings.cleaning import CleaningSettings

LINE = "legal"
DAY = datetime(2026, 11, 1, 9, tzinfo=UTC)


def _no_scrub(batch: list[FeedbackRecord]) -> list[FeedbackRecord]:
    return [replace(record, pii={}) for record in batch]


_LETTERS = str.maketrans("0123456789", "ghijklmnop")


def _text(i: int, kind: str) -> str:
    """A text no other index shares words with (dedup keeps every answer)."""
    # Letters only: dedup reads every digit as 0.
    digest = hashlib.sha256(f"{kind}-{i}".encode()).hexdigest().translate(_LETTERS)
    return f"{kind} " + " ".join(digest[k : k + 8] for k in range(0, 48, 8))


def _day(passes: int, fails: int) -> list[dict[str, Any]]:
    """A day of answers: ``passes + fails`` reviewed, one thumbed up, one edited."""
    events: list[dict[str, Any]] = []
    verdicts = ["pass"] * passes + ["fail"] * fails
    for i, verdict in enumerate([*verdicts, "thumb", "edit"]):
        rid = f"req-{i}"
        at = DAY + timedelta(minutes=i)
        events.append(
            {
                "type": "interaction",
                "request_id": rid,
                "user_id": f"user-{i}",
                "business_line": LINE,
                "base_model": "base",
                "messages": [{"role": "user", "content": _text(i, "question")}],
                "response": _text(i, "answer"),
                "created_at": at.isoformat(),
            }
        )
        done = at + timedelta(seconds=30)
        if verdict == "thumb":
            events.append({"type": "thumbs_up", "request_id": rid, "created_at": done.isoformat()})
        elif verdict == "edit":
            events.append(
                {
                    "type": "edit",
                    "request_id": rid,
                    "edited_text": "Write to your landlord first, then see the tenancy board.",
                    "created_at": done.isoformat(),
                }
            )
        else:
            events.append(
                {
                    "type": "review",
                    "request_id": rid,
                    "outcome": verdict,
                    "metadata": {"reason": "solves the problem", "reviewer": "reviewer-1"},
                    "created_at": done.isoformat(),
                }
            )
    return events


def _sft_rules(settings: Settings, tmp_path: Path, passes: int, fails: int) -> tuple[Any, ...]:
    store = FeedbackStore.open(settings)
    report = store.ingest(_day(passes, fails), source="test")
    assert not report.rejections, report.rejections
    result = clean_line(
        store.engine,
        LINE,
        scrub=_no_scrub,
        settings=CleaningSettings(),
        dataset_root=tmp_path,
        until=DAY + timedelta(days=1),
    )
    assert result.dataset is not None
    manifest = result.dataset.manifest
    rules = sorted({e["rule"] for e in manifest["examples"] if e["kind"] == "sft"})
    return tuple(rules), manifest["funnel"]["priors"], manifest["funnel"]["dropped"]


def test_a_thumb_on_a_line_its_reviews_fail_stays_out(settings: Settings, tmp_path: Path) -> None:
    rules, priors, dropped = _sft_rules(settings, tmp_path, passes=3, fails=37)
    assert rules == ("edit",)
    assert priors["base"]["reviews"] == 40
    assert dropped["unlikely_positive:sft"] == 4  # the thumb and three reviewers' passes


def test_a_thumb_on_a_line_its_reviews_pass_trains(settings: Settings, tmp_path: Path) -> None:
    rules, priors, _ = _sft_rules(settings, tmp_path, passes=32, fails=8)
    assert rules == ("edit", "review_pass", "thumbs_up")
    assert priors["base"]["low"] > 0.5
