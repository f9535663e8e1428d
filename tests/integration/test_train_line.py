"""flywheel train end to end: store → dataset → training → eval → gate → MLflow registry."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from composition.clients import build_clients
from composition.line_training import train_line
from feedback.cleaning import clean_line, scrub_with
from feedback.pii import build_scrubber
from feedback.store import FeedbackStore
from flywheel.errors import FlywheelError
from flywheel.settings import Settings, load_settings
from flywheel.settings.cleaning import CleaningSettings
from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator
from registry.delivery import adapter_digest
from registry.records import TAG_ENDED_BECAUSE
from registry.tracking import Registry
from training.base_model import base_fingerprint, read_base_record

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RECIPE = """\
business_line: customer_service
method: dpo
lora: {rank: 8, alpha: 16, dropout: 0.0}
learning_rate: 2.0e-4
max_steps: 2
batch_size: 2
max_length: 192
min_new_examples: 5
eval_generations: 2
gate: {preference_test: non_inferior, non_inferiority_margin: 1.0, min_margin_gain: -100,
       min_eval_pairs: 1, max_preferred_loss_increase: 10, max_general_loss_increase: 10,
       max_refusal_rate_increase: 1, max_length_ratio: 100, min_length_ratio: 0.01}
"""


def _simulated_dataset(settings: Settings, *, requests: int, seed: int) -> FeedbackStore:
    """Simulated customer-service traffic in the store, cleaned into a dataset; the store."""
    store = FeedbackStore.open(settings)
    simulation = SimulationSettings(
        requests=requests,
        seed=seed,
        start=datetime(2026, 11, 1, tzinfo=UTC),
        business_lines=("customer_service",),
    )
    store.ingest(TrafficSimulator(simulation).events(), source="simulate")
    clean_line(
        store.engine,
        "customer_service",
        scrub=scrub_with(build_scrubber()),
        settings=CleaningSettings(),
        dataset_root=settings.datasets_dir,
    )
    return store


def test_train_line_registers_once_with_lineage(
    tmp_path: Path, base_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "customer_service.yaml").write_text(RECIPE)
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLYWHEEL_RECIPES_DIR", str(recipes))
    monkeypatch.setenv("FLYWHEEL_BASE_MODEL", str(base_model_dir))
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    monkeypatch.delenv("FLYWHEEL_MLFLOW_TRACKING_URI", raising=False)
    settings = load_settings()
    store = _simulated_dataset(settings, requests=600, seed=3)

    outcome = train_line(settings, build_clients(settings), "customer_service")

    assert outcome.status == "trained", outcome.reason
    assert outcome.version == 1
    assert outcome.decision is not None
    assert outcome.decision.promote, outcome.decision.reasons
    registry = Registry.for_home(settings.home)
    assert registry.alias_version("customer_service", "candidate") == 1
    tags = registry.version_tags("customer_service", 1)
    assert tags["base_model"] == base_model_dir.name
    assert len(tags["dataset_hash"]) == 64
    assert (registry.adapter_path("customer_service", 1) / "adapter_config.json").exists()
    # The base it was trained on travels with it, and the files carry their digest.
    assert tags["flywheel.base_digest"] == base_fingerprint(base_model_dir).digest
    fetched = registry.adapter_path("customer_service", 1)
    assert tags["flywheel.adapter_digest"] == adapter_digest(fetched)
    assert read_base_record(fetched) == base_fingerprint(base_model_dir)
    runs = registry.recent_runs("customer_service")
    assert len(runs) == 1
    assert runs[0].gate_decision == "promote"
    assert runs[0].registered_version == 1

    again = train_line(settings, build_clients(settings), "customer_service")
    assert again.status == "reused"
    assert again.version == 1
    assert len(registry.recent_runs("customer_service")) == 1
    store.close()


def _settings_with(recipe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings on a fresh home (embedded store and MLflow) with this customer-service recipe."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "customer_service.yaml").write_text(recipe)
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLYWHEEL_RECIPES_DIR", str(recipes))
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    monkeypatch.delenv("FLYWHEEL_MLFLOW_TRACKING_URI", raising=False)
    return load_settings()


def test_too_little_data_is_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings_with(
        RECIPE.replace("min_new_examples: 5", "min_new_examples: 100000"), tmp_path, monkeypatch
    )
    assert train_line(settings, build_clients(settings), "customer_service").reason == (
        "no dataset yet: run flywheel datasets build"
    )
    _simulated_dataset(settings, requests=200, seed=5).close()

    outcome = train_line(settings, build_clients(settings), "customer_service")

    # A dataset is there now: the threshold, not its absence, is why nothing trains.
    assert outcome.status == "skipped"
    assert re.fullmatch(
        r"[1-9]\d* new DPO training examples weighing [\d.]+ \([1-9]\d* from users. signals, "
        r"[\d.]+; \d+ from reviewers, [\d.]+; 0 labelled by the satisfaction model, 0\.0\), "
        r"the recipe needs a weight of at least 100000",
        outcome.reason,
    ), outcome.reason
    assert outcome.version is None
    assert Registry.for_home(settings.home).recent_runs("customer_service") == []


def test_a_rank_the_server_cannot_load_fails_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On main this trained for minutes, then every deploy failed and the line wedged."""
    monkeypatch.setenv("FLYWHEEL_VLLM_MAX_LORA_RANK", "16")
    settings = _settings_with(
        RECIPE.replace("rank: 8, alpha: 16", "rank: 32, alpha: 64"), tmp_path, monkeypatch
    )
    _simulated_dataset(settings, requests=200, seed=5).close()

    with pytest.raises(FlywheelError, match="LoRA rank 32 is above the serving vLLM's"):
        train_line(settings, build_clients(settings), "customer_service")

    registry = Registry.for_home(settings.home)
    [run] = registry.client.search_runs([registry.experiment_id("customer_service")])
    assert run.info.status == "FAILED"
    assert "max-lora-rank 16" in run.data.tags[TAG_ENDED_BECAUSE]
    assert not (settings.runs_dir / "customer_service").exists() or not any(
        (settings.runs_dir / "customer_service").rglob("adapter_model.safetensors")
    )


def _drift_detail(outcome: Any) -> tuple[float, float]:
    """(candidate, base) general-set losses from the gate's drift check."""
    assert outcome.decision is not None, outcome.reason
    [check] = [c for c in outcome.decision.checks if c.name == "general_loss_drift"]
    found = re.search(r"model (\d+\.\d+) vs base (\d+\.\d+) \(", check.detail)
    assert found, check.detail
    return float(found.group(1)), float(found.group(2))


def test_drift_bound_measures_a_continued_adapter_against_the_base_model(
    tmp_path: Path, base_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Night 1 reads the base's general-set loss off the champion's report (the champion is
    the base); night 2 continues v1's adapter and scores the base model once more: the
    same loss, the reference however many nights the line has continued."""
    monkeypatch.setenv("FLYWHEEL_BASE_MODEL", str(base_model_dir))
    # A high rate for six steps, so that v1 moves the general-set loss visibly.
    recipe = (
        RECIPE.replace(
            "max_general_loss_increase: 10,",
            "max_general_loss_increase: 10,\n       max_general_loss_drift: 10,",
        ).replace("learning_rate: 2.0e-4\nmax_steps: 2", "learning_rate: 3.0e-3\nmax_steps: 6")
        + "start_from: champion\n"
    )
    settings = _settings_with(recipe, tmp_path, monkeypatch)
    _simulated_dataset(settings, requests=300, seed=3).close()
    first = train_line(settings, build_clients(settings), "customer_service")
    assert first.status == "trained", first.reason
    _, base_on_night_1 = _drift_detail(first)
    registry = Registry.for_home(settings.home)
    registry.set_alias("customer_service", "champion", 1)

    _simulated_dataset(settings, requests=300, seed=4).close()
    second = train_line(settings, build_clients(settings), "customer_service")

    assert second.status == "trained", second.reason
    _, base_on_night_2 = _drift_detail(second)
    # Scored alone, not batched beside the held-out pairs: bfloat16 rounding may differ a hair.
    assert base_on_night_2 == pytest.approx(base_on_night_1, rel=0.01)
    # ... and not the champion's: v1 moved the general-set loss, the reference did not move.
    [step] = [c for c in second.decision.checks if c.name == "general_loss"]
    found = re.search(r"vs champion (\d+\.\d+) \(", step.detail)
    assert found, step.detail
    # Further apart than the rounding allowed above (1%): v1 moved it by ~2-3% here, in
    # float32 on a CPU without bfloat16 as in autocast.
    assert abs(float(found.group(1)) - base_on_night_2) > 0.01 * base_on_night_2, step.detail
    [latest, *_] = registry.recent_runs("customer_service")
    run = registry.client.get_run(latest.run_id)
    assert run.data.metrics["base.general_loss"] == pytest.approx(base_on_night_2, abs=5e-4)


def test_a_guarded_training_keeps_the_last_adapter_inside_the_gates_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With loss_checks, train_line's training measures the general-set loss as the gate does:
    its start is the base model's loss the gate logs, its limit the gate's drift bound over it,
    and the adapter the gate scores is the one of the last measure inside the limit."""
    from training.train import guard_steps

    guarded = (
        RECIPE.replace("learning_rate: 2.0e-4", "learning_rate: 1.0e-2")
        .replace("max_steps: 2", "max_steps: 8\nloss_checks: 4")
        .replace(
            "max_general_loss_increase: 10,",
            "max_general_loss_increase: 10,\n       max_general_loss_drift: 0.05,",
        )
    )
    settings = _settings_with(guarded, tmp_path, monkeypatch)
    _simulated_dataset(settings, requests=300, seed=4).close()

    outcome = train_line(settings, build_clients(settings), "customer_service")

    assert outcome.status == "trained", outcome.reason
    assert outcome.run_id is not None
    assert outcome.candidate is not None
    registry = Registry.for_home(settings.home)
    run = registry.client.get_run(outcome.run_id).data.metrics
    measures = [
        (m.step, m.value)
        for m in registry.client.get_metric_history(outcome.run_id, "guard/general_loss")
    ]
    steps = [step for step, _ in measures]
    assert steps == sorted(steps)
    assert set(steps) <= {0, *guard_steps(8, 4)}
    base = run["base.general_loss"]
    assert measures[0] == (0, pytest.approx(base, rel=0.01))
    limit = run["train.loss_limit"]
    assert limit == pytest.approx(base * 1.05, rel=0.01)
    assert all(loss <= limit for _, loss in measures[:-1])
    by_step = dict(measures)
    if measures[-1][1] > limit:
        kept = int(run["train.kept_step"])
        assert kept == steps[-2]
        assert outcome.metrics["kept_step"] == kept
    else:
        assert "train.kept_step" not in run
        assert "kept_step" not in outcome.metrics
        kept = steps[-1]
    # The adapter the gate scored is the kept one: its loss is the guard's at that step.
    assert outcome.candidate.general_loss == pytest.approx(by_step[kept], rel=0.01)
