"""The offline evaluation where a data scientist reads it: a training run in real MLflow (a
local SQLite store) with both models' metrics side by side, n and 95% intervals, the
comparison plot, the adapter's LoggedModel listed as the run's output, the gate's verdict
(not judged on too few pairs), and the canary's decision written back to the run."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from composition.recipes import Recipe, recipe_hash, start_training_run
from eval.gate import GatePolicy, decide_promotion
from eval.reports import EvalReport, GenerationSample
from flywheel.intervals import wilson_interval
from registry.canary import MetricCheck
from registry.records import canary_record
from registry.tracking import Registry, artifact_root_for, tracking_uri_for

LINE = "customer_service"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module", autouse=True)
def _no_telemetry() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        yield


def _report(model: str, wins: tuple[bool, ...], refused: int) -> EvalReport:
    return EvalReport(
        model=model,
        pairs=len(wins),
        preference_accuracy=sum(wins) / len(wins),
        mean_margin=0.4 if all(wins) else -0.3,
        preferred_loss=1.4,
        general_loss=2.0,
        refusal_rate=refused / 8,
        mean_answer_length=40.0,
        pii_in_generations=0,
        canaries_in_generations=0,
        samples=tuple(
            GenerationSample(prompt=f"question {i}", answer="an answer", refused=i < refused)
            for i in range(8)
        ),
        pair_wins=wins,
    )


def _trained_run(registry: Registry, root: Path) -> tuple[str, str, int]:
    """The demo's night as the nightly records it: 4 held-out pairs, the candidate right on
    all 4 and the base model on none, under a gate that needs 100. (run, model id, version)"""
    recipe = Recipe(business_line=LINE, method="sft", max_steps=2)
    content_hash = "c" * 64
    manifest = root / "dataset" / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"business_line": LINE, "content_hash": content_hash}))
    run_id = start_training_run(registry, recipe, content_hash, manifest, "base", "abc1234")
    adapter = root / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    model_id = registry.log_adapter(run_id, adapter)
    candidate = _report("customer_service-sft-cccccccc", (True,) * 4, 0)
    champion = _report("base model Qwen2.5-0.5B-Instruct", (False,) * 4, 1)
    decision = decide_promotion(candidate, champion, GatePolicy(min_eval_pairs=100))
    registry.log_evaluation(run_id, candidate, champion, decision)
    lineage = {
        "base_model": "base",
        "dataset_hash": content_hash,
        "recipe_hash": recipe_hash(recipe),
        "code_version": "abc1234",
    }
    version = registry.register_adapter(run_id, LINE, lineage)
    registry.finish_run(run_id)
    return run_id, model_id, version


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Registry, str, str, int]:
    root = tmp_path_factory.mktemp("mlflow-eval")
    registry = Registry(tracking_uri_for(root / "home", None), artifact_root_for(root / "home"))
    return registry, *_trained_run(registry, root)


def test_the_run_page_lists_the_adapter_as_the_runs_logged_model(
    trained: tuple[Registry, str, str, int],
) -> None:
    registry, run_id, model_id, _ = trained

    run = registry.client.get_run(run_id)

    # What MLflow's run page reads for "Logged models" (empty: "—").
    assert [output.model_id for output in run.outputs.model_outputs] == [model_id]
    model = registry.client.get_logged_model(model_id)
    assert model.source_run_id == run_id
    linked = {metric.key: metric.value for metric in model.metrics or []}
    assert linked["eval.candidate.preference_accuracy"] == 1.0
    assert not any(key.startswith("eval.champion.") for key in linked)


def test_both_models_side_by_side_with_n_and_95_percent_intervals(
    trained: tuple[Registry, str, str, int],
) -> None:
    registry, run_id, _, _ = trained

    metrics = registry.client.get_run(run_id).data.metrics

    assert metrics["eval.candidate.preference_accuracy"] == 1.0
    assert metrics["eval.champion.preference_accuracy"] == 0.0
    assert metrics["eval.candidate.preference_accuracy_n"] == 4
    assert metrics["eval.candidate.preference_accuracy_low"] == pytest.approx(
        wilson_interval(4, 4)[0]
    )
    assert metrics["eval.champion.preference_accuracy_high"] == pytest.approx(
        wilson_interval(0, 4)[1]
    )
    assert metrics["eval.champion.refusal_rate_n"] == 8
    assert metrics["eval.preference_accuracy_difference"] == 1.0
    assert metrics["eval.preference_accuracy_difference_low"] < 1.0
    assert "candidate.preference_accuracy" not in metrics


def test_a_gate_on_four_pairs_says_not_judged_in_tags_gate_txt_plot_and_flywheel_runs(
    trained: tuple[Registry, str, str, int], tmp_path: Path
) -> None:
    registry, run_id, _, version = trained

    tags = registry.client.get_run(run_id).data.tags
    assert tags["gate.decision"] == "not judged"
    assert tags["gate.summary"] == "not judged: n=4 < 100"
    assert "1.000" not in tags["gate.reasons"]
    gate_txt = Path(registry.client.download_artifacts(run_id, "eval/gate.txt", str(tmp_path)))
    assert gate_txt.read_text().splitlines()[0] == "not judged: n=4 < 100"
    plot = Path(registry.client.download_artifacts(run_id, "eval/comparison.png", str(tmp_path)))
    assert plot.read_bytes().startswith(PNG_SIGNATURE)
    shutil.copy(plot, tmp_path / "comparison-not-judged.png")  # to look at after a run
    table = json.loads(
        Path(
            registry.client.download_artifacts(run_id, "eval/metrics.json", str(tmp_path))
        ).read_text()
    )
    assert {"n", "candidate_low", "candidate_high", "champion_low"} <= set(table["columns"])

    (summary,) = registry.recent_runs(LINE)
    cells = dict(zip(("pairs", "candidate", "champion", "gate"), summary.cells()[4:8], strict=True))
    assert cells == {
        "pairs": "4",
        "candidate": "-",
        "champion": "-",
        "gate": "not judged: n=4 < 100",
    }
    assert registry.version_verdict(LINE, version)[0] == "not judged"


def test_the_canarys_decision_and_its_numbers_go_back_to_the_training_run(
    trained: tuple[Registry, str, str, int], tmp_path: Path
) -> None:
    registry, run_id, _, version = trained
    satisfaction = MetricCheck(
        "satisfaction", 0.06, 0.41, 0.9, 0.07, "OK", 0.05, (66, 65), 1.1, "canary 0.410 ..."
    )
    record = canary_record(
        "promote",
        "OK satisfaction within -0.05 of the champion's",
        f"{LINE}-v{version}",
        actor="flywheel:canary",
        decided_at=datetime(2026, 12, 4, 9, 25, tzinfo=UTC),
        fraction=0.05,
        look=3,
        requests=(131, 9),
        checks=(satisfaction,),
    )

    assert registry.log_canary_outcome(LINE, version, record, {"look": 3}) == run_id

    run = registry.client.get_run(run_id)
    assert run.data.tags["canary.decision"] == "promote"
    assert run.data.tags["canary.reason"].startswith("OK satisfaction")
    assert run.data.metrics["canary.satisfaction.canary"] == 0.41
    assert run.data.metrics["canary.satisfaction.champion"] == 0.06
    assert run.data.metrics["canary.satisfaction.canary_n"] == 65
    assert run.data.metrics["canary.canary_requests"] == 9
    assert run.info.status == "FINISHED"
    saved = registry.client.download_artifacts(run_id, "canary/promote.json", str(tmp_path))
    assert json.loads(Path(saved).read_text()) == {"look": 3}


def test_flywheel_runs_prints_not_judged_instead_of_the_accuracies(
    trained: tuple[Registry, str, str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    registry = trained[0]
    database = Path(registry.tracking_uri.removeprefix("sqlite:///"))
    monkeypatch.setenv("FLYWHEEL_HOME", str(database.parent.parent))
    monkeypatch.delenv("FLYWHEEL_MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)

    result = CliRunner().invoke(app, ["runs", LINE], env={"COLUMNS": "160"})

    assert result.exit_code == 0, result.output
    assert "not judged: n=4 < 100" in result.output
    assert "100.0%" not in result.output
    assert "0.0%" not in result.output
