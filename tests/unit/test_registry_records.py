"""What the registry writes to MLflow, checked without a tracking store."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from composition.recipes import Recipe, recipe_hash, recipe_params
from eval.reports import EvalReport, GateCheck, GateDecision, GenerationSample
from flywheel.errors import FlywheelError
from registry.names import adapter_name, experiment_name, model_name
from registry.records import (
    MAX_RUN_TAG_CHARS,
    RUN_COLUMNS,
    TAG_GATE_DECISION,
    TAG_GATE_REASONS,
    TAG_LINE,
    TAG_REGISTERED_VERSION,
    TRUNCATION_MARK,
    MetricPoint,
    checked_lineage,
    dataset_digest,
    flatten_params,
    gate_tags,
    gate_text,
    history_metrics,
    metrics_table,
    samples_table,
    summarize_run,
    truncate,
)
from registry.tracking import tracking_uri_for


def _recipe(**overrides: object) -> Recipe:
    values: dict[str, object] = {"business_line": "medical", "method": "dpo", "max_steps": 20}
    return Recipe.model_validate(values | overrides)


def _report(model: str, accuracy: float | None, answers: dict[str, str]) -> EvalReport:
    return EvalReport(
        model=model,
        pairs=12,
        preference_accuracy=accuracy,
        mean_margin=0.4,
        preferred_loss=1.2,
        general_loss=2.0,
        refusal_rate=0.0,
        mean_answer_length=40.0,
        pii_in_generations=0,
        canaries_in_generations=0,
        samples=tuple(
            GenerationSample(prompt=p, answer=a, refused=False) for p, a in answers.items()
        ),
    )


def test_recipe_flattens_to_dotted_string_params() -> None:
    params = recipe_params(_recipe(lora={"rank": 8, "target_modules": ["q_proj", "v_proj"]}))

    assert params["business_line"] == "medical"
    assert params["lora.rank"] == "8"
    assert params["lora.target_modules"] == "q_proj,v_proj"
    assert params["gate.min_eval_pairs"] == "50"
    assert params["gate.preference_test"] == "superior"
    assert params["epochs"] == "None"
    assert params["canary_steps"] == "0.05,0.25,0.5,1.0"
    assert all(isinstance(v, str) for v in params.values())


def test_flatten_params_nests_any_depth() -> None:
    assert flatten_params({"a": {"b": {"c": 1}}, "d": [1, 2]}) == {"a.b.c": "1", "d": "1,2"}


def test_recipe_hash_is_stable_and_sensitive() -> None:
    assert recipe_hash(_recipe()) == recipe_hash(_recipe())
    assert recipe_hash(_recipe()) != recipe_hash(_recipe(learning_rate=1e-4))
    assert len(recipe_hash(_recipe())) == 64


def test_a_later_field_at_its_default_leaves_the_hash_alone() -> None:
    """Recipes hashed before ``dpo_loss``, ``continue_learning_rate``, the gate's
    ``max_general_loss_drift`` and the canary's ``satisfaction`` existed keep their hash (the
    satisfaction model's block never enters it); setting any of the others changes it."""
    recipe = _recipe()
    dumped = recipe.model_dump(mode="json", exclude={"retention", "review", "satisfaction_model"})
    dumped.pop("dpo_loss")
    dumped.pop("continue_learning_rate")
    dumped["gate"].pop("max_general_loss_drift")
    dumped["canary"].pop("satisfaction")
    before = hashlib.sha256(
        json.dumps(dumped, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    assert recipe_hash(recipe) == before
    assert recipe_hash(_recipe(dpo_loss="sigmoid_norm")) != before
    assert recipe_hash(_recipe(continue_learning_rate=1e-4)) != before
    assert recipe_hash(_recipe(gate={"max_general_loss_drift": 0.5})) != before
    with_reviews = {"review": {"rubric": ["ok", "wrong"]}}
    assert recipe_hash(_recipe(canary={"satisfaction": {"margin": 0.1}}, **with_reviews)) != before
    assert recipe_hash(_recipe(satisfaction_model={"enabled": True})) == before


def test_truncate_keeps_short_text_and_marks_cut_text() -> None:
    assert truncate("short") == "short"
    cut = truncate("x" * (MAX_RUN_TAG_CHARS + 10))
    assert len(cut) == MAX_RUN_TAG_CHARS
    assert cut.endswith(TRUNCATION_MARK)
    assert truncate("abcdefghijklmnopqrstuvwxyz", 20).endswith(TRUNCATION_MARK)


def test_truncation_limit_is_mlflows() -> None:
    from mlflow.utils.validation import MAX_DATASET_DIGEST_SIZE, MAX_TAG_VAL_LENGTH

    assert MAX_RUN_TAG_CHARS == MAX_TAG_VAL_LENGTH
    assert len(dataset_digest("f" * 64)) == MAX_DATASET_DIGEST_SIZE


def test_names_follow_the_line() -> None:
    assert experiment_name("customer_service") == "flywheel/customer_service"
    assert model_name("legal") == "flywheel-legal"
    assert adapter_name("legal", 3) == "legal-v3"
    with pytest.raises(FlywheelError, match="business line"):
        model_name("Legal Team")


def test_lineage_needs_every_key() -> None:
    lineage = {"base_model": "m", "dataset_hash": "d", "recipe_hash": "r", "code_version": "c"}
    assert checked_lineage(lineage | {"extra": 1})["extra"] == "1"
    with pytest.raises(FlywheelError, match="code_version"):
        checked_lineage(lineage | {"code_version": ""})


def test_history_becomes_metric_points_at_their_steps() -> None:
    history = [
        {"loss": 0.69, "rewards/accuracies": 0.5, "epoch": 0.1, "step": 5},
        {"eval_loss": 0.6, "eval_rewards/accuracies": 0.75, "step": 10},
        {"train_runtime": 12.0, "step": 10, "note": "text", "done": True},
        {"loss": float("nan"), "step": 11},
        {"loss": 0.1},
    ]

    points = history_metrics(history)

    assert MetricPoint("loss", 0.69, 5) in points
    assert MetricPoint("rewards/accuracies", 0.5, 5) in points
    assert MetricPoint("eval_rewards/accuracies", 0.75, 10) in points
    assert MetricPoint("train_runtime", 12.0, 10) in points
    assert {p.key for p in points} == {
        "loss",
        "rewards/accuracies",
        "eval_loss",
        "eval_rewards/accuracies",
        "train_runtime",
    }


def test_metric_table_pairs_candidate_and_champion() -> None:
    table = metrics_table(_report("c", 0.8, {}), _report("p", None, {}))
    row = table["metric"].index("preference_accuracy")

    assert table["candidate"][row] == 0.8
    assert table["champion"][row] is None
    assert table["delta"][row] is None
    assert table["delta"][table["metric"].index("general_loss")] == 0.0


def test_samples_sit_side_by_side_by_prompt() -> None:
    candidate = _report("c", 0.8, {"q1": "new 1", "q2": "new 2"})
    champion = _report("p", 0.6, {"q2": "old 2", "q3": "old 3"})

    table = samples_table(candidate, champion)

    assert table["prompt"] == ["q1", "q2", "q3"]
    assert table["candidate_answer"] == ["new 1", "new 2", None]
    assert table["champion_answer"] == [None, "old 2", "old 3"]


def test_gate_tags_and_text() -> None:
    decision = GateDecision(
        promote=False,
        checks=(
            GateCheck("preference_gain", True, "+0.10 >= 0.00"),
            GateCheck("general_loss", False, "x" * 9_000),
        ),
    )

    tags = gate_tags(decision)

    assert tags[TAG_GATE_DECISION] == "reject"
    assert tags[TAG_GATE_REASONS].startswith("FAIL general_loss")
    assert len(tags[TAG_GATE_REASONS]) == MAX_RUN_TAG_CHARS
    assert gate_text(decision).splitlines()[0] == "reject (general_loss)"


def test_run_summary_reads_metrics_and_tags() -> None:
    started = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    summary = summarize_run(
        "0123456789abcdef",
        "flywheel/legal",
        int(started.timestamp() * 1000),
        "FINISHED",
        {"candidate.preference_accuracy": 0.75, "champion.preference_accuracy": 0.5},
        {TAG_LINE: "legal", TAG_GATE_DECISION: "promote", TAG_REGISTERED_VERSION: "4"},
    )

    assert summary.started_at == started
    assert summary.cells() == (
        "0123456789ab",
        "legal",
        "2026-01-02 03:04",
        "finished",
        "75.0%",
        "50.0%",
        "promote",
        "v4",
    )
    assert len(summary.cells()) == len(RUN_COLUMNS)


def test_run_summary_of_an_unfinished_run() -> None:
    summary = summarize_run("r", "flywheel/medical", 0, "RUNNING", {}, {})

    assert summary.line == "medical"
    assert summary.cells()[4:] == ("-", "-", "-", "-")


def test_tracking_uri_defaults_to_sqlite_under_home(tmp_path: Path) -> None:
    assert tracking_uri_for(tmp_path, None) == f"sqlite:///{tmp_path}/mlflow/mlflow.db"
    assert tracking_uri_for(tmp_path, "http://mlflow:5000") == "http://mlflow:5000"
    assert not (tmp_path / "mlflow").exists()
