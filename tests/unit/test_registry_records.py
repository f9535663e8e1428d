"""What the registry writes to MLflow, checked without a tracking store."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from composition.recipes import Recipe, recipe_hash, recipe_params
from eval.paired import compare_paired
from eval.reports import EvalReport, GateCheck, GateDecision, GenerationSample
from flywheel.errors import FlywheelError
from flywheel.intervals import wilson_interval
from registry.names import adapter_name, experiment_name, model_name
from registry.records import (
    MAX_RUN_TAG_CHARS,
    RUN_COLUMNS,
    TAG_GATE_DECISION,
    TAG_GATE_REASONS,
    TAG_GATE_SUMMARY,
    TAG_LINE,
    TAG_REGISTERED_VERSION,
    TRUNCATION_MARK,
    MetricPoint,
    canary_record,
    checked_lineage,
    dataset_digest,
    eval_metrics,
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
    """Recipes hashed before ``dpo_loss``, ``continue_learning_rate``, ``gradient_checkpointing``,
    ``quantization``, the gate's
    ``max_general_loss_drift`` and the canary's ``satisfaction`` existed keep their hash (the
    satisfaction model's block never enters it); setting any of the others changes it."""
    recipe = _recipe()
    dumped = recipe.model_dump(mode="json", exclude={"retention", "review", "satisfaction_model"})
    dumped.pop("dpo_loss")
    dumped.pop("continue_learning_rate")
    dumped.pop("gradient_checkpointing")
    dumped.pop("quantization")
    dumped["gate"].pop("max_general_loss_drift")
    dumped["gate"].pop("predicted_satisfaction_margin")
    dumped["gate"].pop("min_predicted_prompts")
    dumped["gate"].pop("unjudged")
    dumped["canary"].pop("satisfaction")
    dumped["canary"].pop("max_answers_per_user")
    dumped["canary"].pop("max_key_share")
    before = hashlib.sha256(
        json.dumps(dumped, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    assert recipe_hash(recipe) == before
    assert recipe_hash(_recipe(dpo_loss="sigmoid_norm")) != before
    assert recipe_hash(_recipe(continue_learning_rate=1e-4)) != before
    assert recipe_hash(_recipe(gradient_checkpointing=False)) != before
    assert recipe_hash(_recipe(gradient_checkpointing=True)) != before
    assert recipe_hash(_recipe(quantization="4bit")) != before
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
    # A run logged before the eval.* names, n and intervals.
    assert summary.cells() == (
        "0123456789ab",
        "legal",
        "2026-01-02 03:04",
        "finished",
        "-",
        "75.0%",
        "50.0%",
        "promote",
        "v4",
    )
    assert len(summary.cells()) == len(RUN_COLUMNS)


def test_run_summary_of_an_unfinished_run() -> None:
    summary = summarize_run("r", "flywheel/medical", 0, "RUNNING", {}, {})

    assert summary.line == "medical"
    assert summary.cells()[4:] == ("-", "-", "-", "-", "-")


def _paired_reports(
    candidate_wins: list[bool], champion_wins: list[bool], refused: int = 0
) -> tuple[EvalReport, EvalReport]:
    """(candidate, champion) with these per-pair results; the candidate refused ``refused``
    of its 8 generations."""

    def one(model: str, wins: list[bool], refusals: int) -> EvalReport:
        report = _report(model, sum(wins) / len(wins), {f"q{i}": "a" for i in range(8)})
        samples = tuple(
            dataclasses.replace(sample, refused=i < refusals)
            for i, sample in enumerate(report.samples)
        )
        return dataclasses.replace(
            report,
            pairs=len(wins),
            pair_wins=tuple(wins),
            samples=samples,
            refusal_rate=refusals / len(samples),
        )

    return one("medical-dpo-1a2b3c4d", candidate_wins, refused), one("medical-v2", champion_wins, 0)


def test_eval_metrics_put_candidate_beside_champion_with_n_and_95_percent_intervals() -> None:
    candidate, champion = _paired_reports([True] * 45 + [False] * 15, [True] * 33 + [False] * 27, 2)

    metrics = eval_metrics(candidate, champion)

    assert metrics["eval.candidate.preference_accuracy"] == 0.75
    assert metrics["eval.champion.preference_accuracy"] == 0.55
    assert metrics["eval.candidate.preference_accuracy_n"] == 60
    low, high = wilson_interval(45, 60)
    assert (
        metrics["eval.candidate.preference_accuracy_low"],
        metrics["eval.candidate.preference_accuracy_high"],
    ) == (low, high)
    assert metrics["eval.champion.preference_accuracy_low"] == wilson_interval(33, 60)[0]
    assert metrics["eval.candidate.general_loss"] == metrics["eval.champion.general_loss"] == 2.0
    # The refusal rate is a share of the 8 generations.
    assert metrics["eval.candidate.refusal_rate"] == 0.25
    assert metrics["eval.candidate.refusal_rate_n"] == 8
    assert metrics["eval.candidate.refusal_rate_high"] == wilson_interval(2, 8)[1]
    paired = compare_paired(candidate.pair_wins, champion.pair_wins)
    assert metrics["eval.preference_accuracy_difference"] == paired.difference
    assert metrics["eval.preference_accuracy_difference_low"] == paired.low
    assert metrics["eval.preference_accuracy_difference_high"] == paired.high
    assert metrics["eval.preference_accuracy_difference_n"] == 60
    assert metrics["eval.preference_accuracy_p_value"] == paired.p_value
    assert not any(key.startswith(("candidate.", "champion.")) for key in metrics)
    assert all(isinstance(value, float) for value in metrics.values())


def test_the_metric_table_carries_n_and_intervals() -> None:
    candidate, champion = _paired_reports([True] * 4, [False] * 4)

    table = metrics_table(candidate, champion)
    row = table["metric"].index("preference_accuracy")

    assert (table["candidate"][row], table["champion"][row], table["n"][row]) == (1.0, 0.0, 4)
    assert table["candidate_low"][row] == wilson_interval(4, 4)[0]
    assert table["champion_high"][row] == wilson_interval(0, 4)[1]
    assert table["delta_low"][row] is not None
    assert table["n"][table["metric"].index("general_loss")] is None


NOT_JUDGED = GateDecision(
    promote=False,
    checks=(GateCheck("held_out_pairs", False, "too few held-out pairs (4 < 100)"),),
    not_judged="n=4 < 100",
)


def test_a_gate_that_judged_nothing_is_tagged_and_written_so() -> None:
    tags = gate_tags(NOT_JUDGED)

    assert tags[TAG_GATE_DECISION] == "not judged"
    assert tags[TAG_GATE_SUMMARY] == "not judged: n=4 < 100"
    assert gate_text(NOT_JUDGED).splitlines()[0] == "not judged: n=4 < 100"


def test_flywheel_runs_shows_n_and_intervals_and_no_accuracies_for_a_run_not_judged() -> None:
    candidate, champion = _paired_reports([True] * 4, [False] * 4)
    metrics = eval_metrics(candidate, champion)

    not_judged = summarize_run(
        "0123456789abcdef", "flywheel/legal", 0, "FINISHED", metrics, gate_tags(NOT_JUDGED)
    )
    assert not_judged.cells()[4:8] == ("4", "-", "-", "not judged: n=4 < 100")
    assert "100.0%" not in " ".join(not_judged.cells())

    candidate, champion = _paired_reports([True] * 45 + [False] * 15, [True] * 33 + [False] * 27)
    judged = summarize_run(
        "0123456789abcdef",
        "flywheel/legal",
        0,
        "FINISHED",
        eval_metrics(candidate, champion),
        {TAG_GATE_DECISION: "promote", TAG_GATE_SUMMARY: "promote"},
    )
    assert judged.cells()[4:8] == ("60", "75.0% (63–84%)", "55.0% (42–67%)", "promote")


def test_a_canary_decision_becomes_tags_and_metrics_of_the_training_run() -> None:
    from registry.canary import MetricCheck

    satisfaction = MetricCheck(
        "satisfaction", 0.06, 0.41, 0.9, 0.07, "OK", 0.05, (66, 65), 1.1, "canary 0.410 ..."
    )
    rate = MetricCheck("dissatisfied_rate", 0.3, 0.2, 0.8, float("nan"), "UNPROVEN", 0.1)

    record = canary_record(
        "promote",
        "OK satisfaction within -0.05 of the champion's",
        "legal-v3",
        actor="flywheel:canary",
        decided_at=datetime(2026, 12, 4, 9, 25, tzinfo=UTC),
        fraction=0.05,
        look=2,
        requests=(120, 7),
        checks=(satisfaction, rate),
    )

    assert record.action == record.tags["canary.decision"] == "promote"
    assert record.tags["canary.reason"].startswith("OK satisfaction")
    assert record.tags["canary.adapter"] == "legal-v3"
    assert record.tags["canary.decided_at"] == "2026-12-04T09:25:00+00:00"
    assert record.tags["canary.satisfaction.verdict"] == "OK"
    assert record.metrics["canary.satisfaction.canary"] == 0.41
    assert record.metrics["canary.satisfaction.champion"] == 0.06
    assert record.metrics["canary.satisfaction.non_inferior_p"] == 0.07
    assert record.metrics["canary.satisfaction.canary_n"] == 65
    assert record.metrics["canary.satisfaction.champion_n"] == 66
    assert record.metrics["canary.canary_requests"] == 7
    assert record.metrics["canary.look"] == 2
    assert "canary.dissatisfied_rate.non_inferior_p" not in record.metrics  # NaN left out
    assert record.artifact == "canary/promote.json"

    watch = canary_record(
        "revert", "regressed", "legal-v3", actor="a", decided_at=datetime(2026, 12, 4, tzinfo=UTC),
        fraction=1.0, look=1, requests=(60, 60), checks=(rate,), prefix="watch",
        arms=("previous", "champion"),
    )  # fmt: skip
    assert watch.tags["watch.decision"] == "revert"
    assert watch.metrics["watch.dissatisfied_rate.previous"] == 0.3
    assert watch.metrics["watch.dissatisfied_rate.champion"] == 0.2
    assert watch.artifact == "watch/revert.json"


def test_tracking_uri_defaults_to_sqlite_under_home(tmp_path: Path) -> None:
    assert tracking_uri_for(tmp_path, None) == f"sqlite:///{tmp_path}/mlflow/mlflow.db"
    assert tracking_uri_for(tmp_path, "http://mlflow:5000") == "http://mlflow:5000"
    assert not (tmp_path / "mlflow").exists()
