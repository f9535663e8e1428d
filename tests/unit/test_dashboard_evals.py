"""Eval review on real MLflow (a local SQLite tracking store): runs, gate reasons, the
comparison plot, sample generations side by side (scrubbed), links to the MLflow UI."""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from composition.recipes import Recipe, recipe_hash, start_training_run
from eval.gate import GatePolicy, decide_promotion
from eval.reports import EvalReport, GateCheck, GateDecision, GenerationSample
from flywheel.intervals import wilson_interval
from registry.tracking import Registry
from tests.dashboard_store import PageHome, build_page_home

LINE = "medical"
PLANTED_EMAIL = "jane.roe1987@example.org"


def _report(model: str, accuracy: float, answer: str) -> EvalReport:
    return EvalReport(
        model=model,
        pairs=12,
        preference_accuracy=accuracy,
        mean_margin=accuracy - 0.5,
        preferred_loss=1.4,
        general_loss=2.0,
        refusal_rate=0.0,
        mean_answer_length=31.0,
        pii_in_generations=0,
        canaries_in_generations=0,
        samples=(
            GenerationSample(prompt="What helps a headache?", answer=answer, refused=False),
            GenerationSample(
                prompt=f"Email my results to {PLANTED_EMAIL} please.",
                answer=f"I will write to {PLANTED_EMAIL}.",
                refused=False,
            ),
        ),
    )


def _train(registry: Registry, root: Path, content_hash: str, promote: bool) -> tuple[str, int]:
    recipe = Recipe(business_line=LINE, method="dpo", max_steps=2)
    manifest = root / content_hash[:8] / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"business_line": LINE, "content_hash": content_hash}))
    run_id = start_training_run(registry, recipe, content_hash, manifest, "base", "abc1234")
    checks = (
        GateCheck("preference_accuracy", promote, "0.80 vs 0.60: gain +0.20 >= +0.02"),
        GateCheck("general_loss", True, "2.00 vs 2.00: +0.00 <= +0.05"),
    )
    registry.log_evaluation(
        run_id,
        _report("candidate", 0.8 if promote else 0.55, "Rest, water and quiet."),
        _report("champion", 0.6, "Take a nap."),
        GateDecision(promote=promote, checks=checks),
    )
    adapter = root / f"adapter-{content_hash[:8]}"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    registry.log_adapter(run_id, adapter)
    lineage = {
        "base_model": "base",
        "dataset_hash": content_hash,
        "recipe_hash": recipe_hash(recipe),
        "code_version": "abc1234",
    }
    version = registry.register_adapter(run_id, LINE, lineage) if promote else 0
    registry.finish_run(run_id)
    return run_id, version


def _train_on_four_pairs(registry: Registry, root: Path) -> str:
    """The demo's night on customer service: 4 held-out pairs, the candidate right on all,
    the base model on none, under a gate that needs 100 pairs."""
    line = "customer_service"
    recipe = Recipe(business_line=line, method="sft", max_steps=2)
    manifest = root / "four-pairs" / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"business_line": line, "content_hash": "d" * 64}))
    run_id = start_training_run(registry, recipe, "d" * 64, manifest, "base", "abc1234")
    candidate = dataclasses.replace(
        _report("customer_service-sft-dddddddd", 1.0, "Sure."), pairs=4, pair_wins=(True,) * 4
    )
    champion = dataclasses.replace(
        _report("base model", 0.0, "Hello."), pairs=4, pair_wins=(False,) * 4
    )
    decision = decide_promotion(candidate, champion, GatePolicy(min_eval_pairs=100))
    registry.log_evaluation(run_id, candidate, champion, decision)
    registry.finish_run(run_id)
    return run_id


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PageHome, list[str]]]:
    root = tmp_path_factory.mktemp("evals")
    built = build_page_home(root / "home", requests=60, with_dataset=False)
    registry = Registry.for_home(built.settings.home)
    first, v1 = _train(registry, root, "a" * 64, promote=True)
    registry.promote(LINE, v1, reason="first champion")
    rejected, _ = _train(registry, root, "b" * 64, promote=False)
    _train_on_four_pairs(registry, root)
    yield built, [first, rejected]
    built.store.close()


@pytest.fixture(scope="module", autouse=True)
def _no_telemetry() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        yield


def test_eval_review_lays_out_runs_for_a_data_scientist(
    home: tuple[PageHome, list[str]],
) -> None:
    page_home, (first, rejected) = home
    app = page_home.app(mlflow_ui_url="http://mlflow.example:5000")
    with TestClient(app, client=("10.0.0.2", 1), headers=page_home.bearer("counsel")) as client:
        page = client.get(f"/lines/{LINE}/evals")
        assert page.status_code == 200
        text = html.unescape(page.text)
        assert 'id="runs"' in text
        assert "promote" in text
        assert "reject" in text
        assert "champion" in text  # the alias of v1
        # the newest run is shown first: the rejected one, with its failed check
        assert "FAIL preference_accuracy: 0.80 vs 0.60" in text
        assert text.count("<svg") >= 1
        assert 'id="generations"' in text
        assert "Take a nap." in text
        assert "Rest, water and quiet." in text
        assert PLANTED_EMAIL not in text  # generations are scrubbed too
        assert "http://mlflow.example:5000/#/experiments/" in text
        assert f"/runs/{rejected}" in text
        assert "http://mlflow.example:5000/#/models/flywheel-medical/versions/1" in text

        chosen = client.get(f"/lines/{LINE}/evals", params={"run": first})
        assert "first champion" in chosen.text  # the promotion note of v1
        assert "PASS preference_accuracy" in chosen.text

        api = client.get(f"/api/lines/{LINE}/evals").json()
        assert [run["run_id"] for run in api["runs"]] == [rejected, first]
        assert api["runs"][1]["version"] == 1
        assert api["runs"][1]["aliases"] == ["champion"]
        assert api["runs"][0]["gate"] == "reject"
        metrics = {m["metric"]: m for m in api["runs"][1]["metrics"]}
        assert metrics["preference_accuracy"] == {
            "metric": "preference_accuracy",
            "candidate": 0.8,
            "champion": 0.6,
        }
        # n and 95% intervals beside the accuracies (12 pairs: 0.8 is 10 of them, rounded)
        spread = api["runs"][1]["intervals"]["preference_accuracy"]
        assert spread["n"] == 12
        assert spread["candidate"] == pytest.approx(list(wilson_interval(10, 12)))
        low, high = wilson_interval(10, 12)
        assert f"0.8 ({low:.3f}–{high:.3f})" in html.unescape(chosen.text)
        assert PLANTED_EMAIL not in json.dumps(api)

        refused = client.get("/lines/customer_service/evals")
        assert refused.status_code == 403


def test_a_run_the_gate_did_not_judge_says_why_instead_of_its_accuracies(
    home: tuple[PageHome, list[str]],
) -> None:
    page_home, _ = home
    with TestClient(
        page_home.app(), client=("10.0.0.2", 1), headers=page_home.bearer("admin")
    ) as client:
        text = html.unescape(client.get("/lines/customer_service/evals").text)
        api = client.get("/api/lines/customer_service/evals").json()

    assert '<span class="gate not_judged">not judged: n=4 < 100</span>' in text
    assert ": not judged: n=4 < 100</h2>" in text
    assert "100.0%" not in text
    # the runs table: 4 pairs, then no accuracies
    assert "<td>4</td><td>–</td><td>–</td>" in "".join(text.split())
    assert '<td colspan="3" class="not-judged">not judged: n=4 < 100</td>' in text
    chart = text[text.index("<svg") : text.index("</svg>")]
    assert "preference_accuracy" not in chart
    assert "general_loss" in chart
    assert "FAIL held_out_pairs: too few held-out pairs (4 < 100)" in text
    (run,) = api["runs"]
    assert run["gate"] == "not judged"
    assert run["gate_summary"] == "not judged: n=4 < 100"
    assert run["judged"] is False
    assert run["intervals"]["preference_accuracy"]["n"] == 4


def test_a_line_without_runs_says_so(home: tuple[PageHome, list[str]]) -> None:
    page_home, _ = home
    with TestClient(
        page_home.app(), client=("10.0.0.2", 1), headers=page_home.bearer("admin")
    ) as c:
        page = c.get("/lines/legal/evals")
        assert page.status_code == 200
        assert "no training runs for this line yet" in page.text


def test_an_adapter_trained_on_a_forgotten_user_s_data_is_flagged(
    home: tuple[PageHome, list[str]],
) -> None:
    page_home, (first, rejected) = home
    registry = Registry.for_home(page_home.settings.home)
    flagged = registry.flag_forgotten_data(["a" * 64], day="2026-12-10")
    assert flagged.runs == [first]
    with TestClient(
        page_home.app(), client=("10.0.0.2", 1), headers=page_home.bearer("counsel")
    ) as client:
        chosen = client.get(f"/lines/{LINE}/evals", params={"run": first})
        assert "trained on data of a user forgotten 2026-12-10" in chosen.text
        api = client.get(f"/api/lines/{LINE}/evals").json()
    notes = {run["run_id"]: run["version_notes"] for run in api["runs"]}
    assert any("forgotten" in note for note in notes[first])
    assert not any("forgotten" in note for note in notes[rejected])
