"""``flywheel eval`` on real HH-RLHF pairs with the real base model and a registered adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.commands.evaluate import RUN_KIND, TAG_RUN_KIND
from cli.main import app
from composition.recipes import Recipe, start_training_run
from registry.names import experiment_name
from registry.tracking import Registry
from tests.conftest import shared_file

pytestmark = [pytest.mark.integration, pytest.mark.slow]

runner = CliRunner()
PAIRS = 20


@pytest.fixture
def home(tmp_path: Path, base_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLYWHEEL_BASE_MODEL", str(base_model_dir))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    monkeypatch.delenv("FLYWHEEL_MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "home"


def test_eval_of_the_base_model_reports_an_interval_and_logs_an_evaluation_run(
    home: Path, tmp_path: Path
) -> None:
    pairs = shared_file("hh-rlhf/harmless-base-test.jsonl.gz")
    report = tmp_path / "eval.json"

    args = ["eval", "general", "--pairs", str(pairs), "--version", "base", "--limit", str(PAIRS)]

    result = runner.invoke(app, [*args, "--json", str(report)])

    assert result.exit_code == 0, result.output
    assert "95% CI (Wilson)" in result.stdout
    document = json.loads(report.read_text())
    model = document["model"]
    assert document["pairs"] == PAIRS
    assert document["base"] is None
    assert document["paired_vs_base"] is None
    assert model["name"] == "base"
    assert len(document["pair_wins"]["model"]) == PAIRS
    assert model["preference_accuracy"] == sum(document["pair_wins"]["model"]) / PAIRS
    assert model["accuracy_low"] <= model["preference_accuracy"] <= model["accuracy_high"]
    registry = Registry.for_home(home)
    run = registry.client.get_run(document["mlflow_run_id"])
    experiment = registry.client.get_experiment(run.info.experiment_id)
    assert experiment.name == experiment_name("general")
    assert run.data.tags[TAG_RUN_KIND] == RUN_KIND
    assert run.info.status == "FINISHED"
    assert run.data.metrics["model.preference_accuracy"] == model["preference_accuracy"]
    assert run.data.params["format"] == "auto"
    artifacts = {a.path for a in registry.client.list_artifacts(run.info.run_id, "eval")}
    assert "eval/pairs_eval.json" in artifacts
    # `flywheel runs` lists trainings: an evaluation trained nothing and is left out.
    listed = runner.invoke(app, ["runs", "general"])
    assert listed.exit_code == 0, listed.output
    assert run.info.run_id[:8] not in listed.stdout
    assert registry.recent_runs("general") == []


def test_eval_of_the_champion_compares_it_with_the_base_on_the_same_pairs(
    home: Path, tmp_path: Path, base_model_dir: Path, lora_adapter: Path
) -> None:
    pairs = shared_file("hh-rlhf/harmless-base-test.jsonl.gz")
    line = "customer_service"
    registry = Registry.for_home(home)
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    recipe = Recipe(business_line=line, method="sft", max_steps=1)
    run_id = start_training_run(registry, recipe, "d" * 64, manifest, base_model_dir.name, "test")
    registry.log_adapter(run_id, lora_adapter)
    lineage = {
        "base_model": base_model_dir.name,
        "dataset_hash": "d" * 64,
        "recipe_hash": "r",
        "code_version": "test",
    }
    version = registry.register_adapter(run_id, line, lineage)
    registry.finish_run(run_id)
    registry.promote(line, version)
    report = tmp_path / "eval.json"

    result = runner.invoke(
        app, ["eval", line, "--pairs", str(pairs), "--limit", "10", "--json", str(report)]
    )

    assert result.exit_code == 0, result.output
    assert f"paired with the base model: on 10 pairs: {line}-v{version} right on" in result.stdout
    document = json.loads(report.read_text())
    paired = document["paired_vs_base"]
    assert document["model"]["name"] == f"{line}-v{version}"
    assert document["model"]["version"] == version
    assert document["base"]["name"] == "base"
    assert paired["n"] == 10
    assert paired["candidate_accuracy"] == document["model"]["preference_accuracy"]
    assert paired["baseline_accuracy"] == document["base"]["preference_accuracy"]
    assert paired["difference_low"] <= paired["difference"] <= paired["difference_high"]
    assert 0 <= paired["p_value"] <= 1
    metrics = registry.client.get_run(document["mlflow_run_id"]).data.metrics
    assert metrics["paired.b"] == paired["candidate_only"]
