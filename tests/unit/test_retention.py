"""Raw-text retention on the real scrubber: old rows keep only scrubbed text (or go),
young rows stay raw, a second run changes nothing, a dry run changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from composition.recipes import Recipe, recipe_hash
from feedback.pii import ScrubberSettings, build_scrubber
from feedback.pii.scrubber import Scrubber
from feedback.retention import SCRUBBED_AT, RetentionPolicy, apply_retention
from feedback.schema import feedback_table, interactions_table, shadow_outputs_table
from feedback.store import FeedbackStore
from flywheel.settings import Settings

LINE = "legal"
NOW = datetime(2026, 12, 10, 3, 0, tzinfo=UTC)
EMAIL = "jane.roe1987@example.org"
PHONE = "+1 (555) 123-4567"


@pytest.fixture(scope="module")
def scrubber() -> Scrubber:
    return build_scrubber(ScrubberSettings(languages=("en",)))


def _interaction(request_id: str, age_days: float) -> dict[str, Any]:
    return {
        "type": "interaction",
        "request_id": request_id,
        "user_id": "alice",
        "business_line": LINE,
        "base_model": "base",
        "messages": [
            {"role": "user", "content": f"Write to {EMAIL} or call {PHONE} about my lease."}
        ],
        "response": f"I will email {EMAIL} today.",
        "metadata": {"output_tokens": 6},
        "created_at": (NOW - timedelta(days=age_days)).isoformat(),
    }


def _edit(request_id: str, age_days: float) -> dict[str, Any]:
    return {
        "type": "edit",
        "request_id": request_id,
        "user_id": "alice",
        "edited_text": f"Please reply to {EMAIL}.",
        "idempotency_key": f"edit:{request_id}",
        "created_at": (NOW - timedelta(days=age_days)).isoformat(),
    }


@pytest.fixture
def store(settings: Settings) -> Any:
    store = FeedbackStore.open(settings)
    store.ingest(
        [
            _interaction("req-old", 40),
            _edit("req-old", 39),
            _interaction("req-young", 2),
            _edit("req-young", 1),
        ],
        source="test",
    )
    shadow = {
        "request_id": "req-old",
        "business_line": LINE,
        "adapter_name": "legal-v2",
        "response": f"Mail {EMAIL}.",
        "status": "ok",
        "created_at": (NOW - timedelta(days=40)).isoformat(),
    }
    assert store.add_shadow_outputs([shadow]).added == 1
    yield store
    store.close()


def _rows(store: FeedbackStore) -> dict[str, dict[str, Any]]:
    with store.engine.connect() as connection:
        rows = {
            r.request_id: dict(r._mapping)
            for r in connection.execute(select(interactions_table)).all()
        }
        for r in connection.execute(select(feedback_table)).all():
            rows[f"edit:{r.request_id}"] = dict(r._mapping)
        for r in connection.execute(select(shadow_outputs_table)).all():
            rows[f"shadow:{r.request_id}"] = dict(r._mapping)
    return rows


def test_old_raw_text_is_scrubbed_young_text_stays_and_a_rerun_changes_nothing(
    store: FeedbackStore, scrubber: Scrubber
) -> None:
    policy = RetentionPolicy(raw_days=30, action="scrub")
    report = apply_retention(store.engine, LINE, policy, scrubber.scrub_records, now=NOW)
    assert (report.interactions, report.feedback_events, report.shadow_outputs) == (1, 1, 1)
    rows = _rows(store)
    old = str(rows["req-old"]["messages"]) + rows["req-old"]["response"]
    for text in (old, rows["edit:req-old"]["edited_text"], rows["shadow:req-old"]["response"]):
        assert EMAIL not in text
        assert "<EMAIL_ADDRESS_1>" in text
    assert "555" not in old
    assert "about my lease" in old  # the words around the PII stay
    assert rows["req-old"]["metadata"]["output_tokens"] == 6
    assert rows["req-old"]["metadata"][SCRUBBED_AT] == NOW.isoformat()
    assert rows["req-old"]["metadata"]["retention_pii"]["EMAIL_ADDRESS"] == 2
    assert EMAIL in rows["req-young"]["response"]
    assert EMAIL in rows["edit:req-young"]["edited_text"]
    assert PHONE in rows["req-young"]["messages"][0]["content"]

    again = apply_retention(store.engine, LINE, policy, _refuse, now=NOW + timedelta(hours=1))
    assert (again.interactions, again.feedback_events, again.shadow_outputs) == (0, 0, 0)
    other = apply_retention(store.engine, "medical", policy, _refuse, now=NOW)
    assert other.interactions == 0


def _refuse(records: list[dict[str, Any]], fields: Any) -> list[dict[str, Any]]:
    raise AssertionError(f"nothing should be scrubbed again: {records}")


def test_a_dry_run_counts_and_changes_nothing(store: FeedbackStore) -> None:
    before = _rows(store)
    for action in ("scrub", "delete"):
        policy = RetentionPolicy(raw_days=30, action=action)
        report = apply_retention(store.engine, LINE, policy, _refuse, now=NOW, dry_run=True)
        assert (report.interactions, report.feedback_events, report.shadow_outputs) == (1, 1, 1)
    assert _rows(store) == before


def test_delete_removes_old_interactions_with_their_feedback(store: FeedbackStore) -> None:
    policy = RetentionPolicy(raw_days=30, action="delete")
    report = apply_retention(store.engine, LINE, policy, _refuse, now=NOW)
    assert (report.interactions, report.feedback_events, report.shadow_outputs) == (1, 1, 1)
    assert sorted(_rows(store)) == ["edit:req-young", "req-young"]


def test_the_command_runs_each_line_by_its_recipe(
    settings: Settings, store: FeedbackStore, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cli.main import app

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "legal.yaml").write_text(
        "business_line: legal\nmethod: dpo\nmax_steps: 2\nretention: {raw_days: 3, action: scrub}\n"
    )
    monkeypatch.setenv("FLYWHEEL_RECIPES_DIR", str(recipes))
    result = CliRunner().invoke(app, ["retention", "run", "--line", LINE, "--dry-run"])
    assert result.exit_code == 0, result.output
    cutoff = datetime.now(UTC) - timedelta(days=3)
    expected = sum(NOW - timedelta(days=age) < cutoff for age in (40, 2))
    assert f"{expected} interactions" in " ".join(result.output.split())
    assert "would be scrubbed" in result.output
    assert EMAIL in _rows(store)["req-old"]["response"]


def test_retention_is_typed_and_does_not_change_the_recipe_hash() -> None:
    recipe = Recipe(business_line=LINE, method="dpo", max_steps=2)
    assert recipe.retention == RetentionPolicy(raw_days=30, action="scrub")
    shorter = recipe.model_copy(update={"retention": RetentionPolicy(raw_days=7)})
    assert recipe_hash(shorter) == recipe_hash(recipe)
    with pytest.raises(ValueError, match="action"):
        RetentionPolicy.model_validate({"raw_days": 7, "action": "archive"})
    with pytest.raises(ValueError, match="raw_days"):
        RetentionPolicy.model_validate({"raw_days": 0})
