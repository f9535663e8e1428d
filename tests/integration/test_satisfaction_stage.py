"""The nightly satisfaction-model stage for real: the base model reads the answers, the head is
fitted, judged on held-out answers and recorded in a local MLflow.

The labelled answers are what simulated customer-service users said of answers of
four kinds (their own edit, the same without its apology, a polite non-answer, a
vacuous one), through the product's own signal rules and dataset writer. A second
run on the same answers with labels drawn by a coin must be refused.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from composition.clients import build_clients
from composition.satisfaction import train_satisfaction_model
from feedback.datasets import split_by_time, write_dataset
from feedback.examples import build_examples
from feedback.records import FeedbackRecord
from flywheel.settings import load_settings
from flywheel.settings.cleaning import DatasetSettings
from lab.simulation.prompts import builtin_prompts, topic_of
from lab.simulation.users import CustomerServiceUsers
from registry.tracking import Registry

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LINE = "customer_service"
RECIPE = f"""
business_line: {LINE}
method: sft
max_steps: 1
min_new_examples: 1
satisfaction_model:
  enabled: true
"""


def _records(coin: bool) -> list[FeedbackRecord]:
    users, rng = CustomerServiceUsers(), random.Random(4)
    records = []
    for index, prompt in enumerate(builtin_prompts(LINE, 160, 9)):
        topic = topic_of(LINE, prompt)
        good = users.rewrite(prompt, "", topic)
        answer = rng.choice(
            [
                good,
                good.replace("I'm sorry for the trouble. ", ""),
                f"Thank you for reaching out about this. {topic.fix if topic else ''}",
                "Thank you for your question, it is a very interesting one to think about.",
            ]
        )
        happy = users.satisfied(LINE, prompt, answer) if not coin else rng.random() < 0.5
        records.append(
            FeedbackRecord.from_dict(
                {
                    "request_id": f"r{index}",
                    "user_id": f"u{index % 40}",
                    "business_line": LINE,
                    "adapter_name": None,
                    "base_model": "base",
                    "messages": [{"role": "user", "content": prompt}],
                    "response": answer,
                    "prompt_hash": f"p{index}",
                    "created_at": f"2026-11-{1 + index // 24:02d}T{index % 24:02d}:00:00Z",
                    "feedback": [
                        {"id": index, "rank": None, "type": "thumbs_up" if happy else "thumbs_down"}
                    ],
                    "edit": None,
                }
            )
        )
    return records


@pytest.mark.parametrize(
    ("coin", "eval_fraction"),
    [(False, 0.3), (True, 0.3), (False, 0.02)],
    ids=["users", "coin", "thin-later-split"],
)
def test_the_stage_accepts_a_model_that_learnt_the_taste_and_refuses_a_coin(
    coin: bool,
    eval_fraction: float,
    tmp_path: Path,
    base_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Judged on the dataset's later split when it holds enough of each class, else by
    cross-validation over every labelled answer (the thin-later-split case)."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / f"{LINE}.yaml").write_text(RECIPE)
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLYWHEEL_RECIPES_DIR", str(recipes))
    monkeypatch.setenv("FLYWHEEL_BASE_MODEL", str(base_model_dir))
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    monkeypatch.delenv("FLYWHEEL_MLFLOW_TRACKING_URI", raising=False)
    settings = load_settings()
    examples = build_examples(_records(coin))
    splits = {k: split_by_time(v, eval_fraction) for k, v in examples.by_kind().items()}
    build = write_dataset(
        settings.datasets_dir, LINE, splits, funnel={}, source={}, settings=DatasetSettings()
    )
    messages: list[str] = []
    with build_clients(settings) as clients:
        outcome = train_satisfaction_model(
            settings, clients, LINE, build.content_hash, log=messages.append
        )
    # Each distinct (prompt, answer) once: a repeated question got the same vacuous answer.
    assert 140 <= outcome["train_examples"] + outcome["heldout_examples"] <= 160
    registry = Registry.for_home(settings.home)
    run = registry.client.get_run(outcome["mlflow_run"])
    # The answers it was judged on: the later split, or all of them out of fold.
    judged_on = outcome["heldout_examples"]
    if eval_fraction < 0.1:
        judged_on += outcome["train_examples"]
    assert run.data.metrics["satisfaction.heldout_examples"] == judged_on
    assert "satisfaction.auc" in run.data.metrics
    if coin:
        assert outcome["status"] == "refused", outcome
        assert "not shown better than chance" in outcome["reason"]
        assert outcome["version"] is None
        assert run.data.tags["flywheel.satisfaction.verdict"] == "refused"
    else:
        assert outcome["status"] == "accepted", outcome
        assert outcome["auc"] > 0.8
        assert outcome["version"] == 1
        version = registry.client.get_model_version(f"flywheel-{LINE}-satisfaction", "1")
        assert version.tags["flywheel.satisfaction.verdict"] == "accepted"
    assert any("satisfaction model of customer_service" in m for m in messages)
    judged = "cross-validation" if eval_fraction < 0.1 else "held-out answers"
    assert judged in outcome["judged_on"]
