"""The registry against real MLflow: a local SQLite store, and a real ``mlflow server``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from composition.recipes import Recipe, recipe_hash, start_training_run
from eval.reports import EvalReport, GateCheck, GateDecision, GenerationSample
from flywheel.errors import FlywheelError
from registry.tracking import Registry, artifact_root_for, tracking_uri_for
from tests.conftest import services_required

pytestmark = pytest.mark.integration

LINE = "medical"
BASE_MODEL = "SmolLM2-135M-Instruct"
SERVER_START_S = 60
HISTORY = [
    {"loss": 0.69, "rewards/accuracies": 0.5, "epoch": 0.5, "step": 1},
    {"loss": 0.52, "rewards/accuracies": 0.75, "epoch": 1.0, "step": 2},
    {"eval_loss": 0.55, "eval_rewards/accuracies": 0.7, "step": 2},
]


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


def _recipe() -> Recipe:
    return Recipe(business_line=LINE, method="dpo", max_steps=2)


def _report(model: str, accuracy: float, answer: str) -> EvalReport:
    return EvalReport(
        model=model,
        pairs=10,
        preference_accuracy=accuracy,
        mean_margin=accuracy - 0.5,
        preferred_loss=1.5,
        general_loss=2.0,
        refusal_rate=0.0,
        mean_answer_length=30.0,
        pii_in_generations=0,
        canaries_in_generations=0,
        samples=(GenerationSample(prompt="What helps a headache?", answer=answer, refused=False),),
    )


def _decision(promote: bool) -> GateDecision:
    return GateDecision(
        promote=promote, checks=(GateCheck("preference_gain", promote, "+0.10 vs >= 0.00"),)
    )


def _adapter(root: Path, marker: str) -> Path:
    folder = root / f"adapter-{marker}"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(marker.encode() * 16)
    return folder


def _manifest(root: Path, content_hash: str) -> Path:
    path = root / "datasets" / content_hash[:16] / "manifest.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"business_line": LINE, "content_hash": content_hash}))
    return path


def _train(registry: Registry, root: Path, content_hash: str, promote: bool) -> tuple[str, int]:
    """One training as the nightly flow records it; returns the run id and its version."""
    recipe = _recipe()
    run_id = start_training_run(
        registry, recipe, content_hash, _manifest(root, content_hash), BASE_MODEL, "abc1234"
    )
    registry.log_loss_curve(run_id, HISTORY)
    registry.log_evaluation(
        run_id,
        _report(f"{LINE}-candidate", 0.8, "Rest and water."),
        _report(f"{LINE}-champion", 0.6, "Take a nap."),
        _decision(promote),
    )
    registry.log_adapter(run_id, _adapter(root, content_hash[:8]))
    lineage = {
        "base_model": BASE_MODEL,
        "dataset_hash": content_hash,
        "recipe_hash": recipe_hash(recipe),
        "code_version": "abc1234",
    }
    version = registry.register_adapter(run_id, LINE, lineage)
    registry.finish_run(run_id)
    return run_id, version


def test_a_line_lifecycle_on_the_local_store(tmp_path: Path) -> None:
    home = tmp_path / "home"
    registry = Registry(tracking_uri_for(home, None), artifact_root_for(home))
    first_hash, second_hash = "a" * 64, "b" * 64

    run_1, v1 = _train(registry, tmp_path, first_hash, promote=True)

    assert v1 == 1
    run = registry.client.get_run(run_1)
    assert run.data.params["lora.rank"] == "16"
    assert run.data.tags["gate.decision"] == "promote"
    assert run.data.tags["gate.reasons"].startswith("PASS preference_gain")
    assert run.data.metrics["eval.candidate.preference_accuracy"] == 0.8
    assert run.data.metrics["eval.champion.preference_accuracy"] == 0.6
    [dataset] = run.inputs.dataset_inputs
    assert dataset.dataset.digest == first_hash[:36]
    assert first_hash[:16] in json.loads(dataset.dataset.source)["uri"]
    losses = registry.client.get_metric_history(run_1, "loss")
    assert [(m.step, m.value) for m in losses] == [(1, 0.69), (2, 0.52)]
    artifacts = {a.path for a in registry.client.list_artifacts(run_1, "eval")}
    assert {"eval/metrics.json", "eval/samples.json", "eval/gate.txt"} <= artifacts
    assert "eval/comparison.png" in artifacts
    assert run.info.artifact_uri.startswith((home / "mlflow" / "artifacts").as_uri())
    samples = json.loads(
        Path(registry.client.download_artifacts(run_1, "eval/samples.json")).read_text()
    )
    row = dict(zip(samples["columns"], samples["data"][0], strict=True))
    assert row["prompt"] == "What helps a headache?"
    assert (row["champion_answer"], row["candidate_answer"]) == ("Take a nap.", "Rest and water.")

    recipe = recipe_hash(_recipe())
    assert registry.find_version(LINE, first_hash, recipe, BASE_MODEL) == 1
    assert registry.find_version(LINE, second_hash, recipe, BASE_MODEL) is None
    assert registry.find_version(LINE, first_hash, recipe, "other-base") is None
    assert registry.register_adapter(run_1, LINE, registry.version_tags(LINE, 1)) == 1

    registry.set_candidate(LINE, 1)
    assert registry.alias_version(LINE, "candidate") == 1
    promotion = registry.promote(LINE, 1, actor="nightly", reason="passed the gate")
    assert (promotion.champion, promotion.previous) == (1, None)
    assert registry.aliases(LINE) == {"champion": 1}
    assert registry.version_tags(LINE, 1)["promoted_by"] == "nightly"

    _, v2 = _train(registry, tmp_path, second_hash, promote=True)
    assert v2 == 2
    registry.set_candidate(LINE, 2)
    registry.promote(LINE, 2, reason="canary healthy")
    assert registry.aliases(LINE) == {"champion": 2, "previous": 1}

    rollback = registry.rollback(LINE, "thumbs-down rate doubled in canary")
    assert (rollback.rolled_back, rollback.champion) == (2, 1)
    assert registry.alias_version(LINE, "champion") == 1
    assert registry.alias_version(LINE, "previous") is None
    assert registry.version_tags(LINE, 2)["rolled_back"] == "thumbs-down rate doubled in canary"
    with pytest.raises(FlywheelError, match="no previous"):
        registry.rollback(LINE, "again")

    adapter = registry.adapter_path(LINE, 1)
    assert (adapter / "adapter_config.json").is_file()
    assert (adapter / "adapter_model.safetensors").read_bytes() == b"aaaaaaaa" * 16

    runs = registry.recent_runs(LINE, limit=10)
    assert [r.registered_version for r in runs] == [2, 1]
    assert [r.gate_decision for r in runs] == ["promote", "promote"]
    assert runs[0].status == "FINISHED"
    assert registry.recent_runs(None, limit=1)[0].run_id == runs[0].run_id
    assert registry.recent_runs("legal") == []
    assert registry.alias_version("legal", "champion") is None


def test_a_fresh_registry_reads_what_another_wrote(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _, version = _train(Registry.for_home(home), tmp_path, "c" * 64, promote=False)

    again = Registry.for_home(home)

    assert again.find_version(LINE, "c" * 64, recipe_hash(_recipe()), BASE_MODEL) == version
    assert again.recent_runs()[0].gate_decision == "reject"
    with pytest.raises(FlywheelError, match="no version 9"):
        again.promote(LINE, 9)


def test_processes_opening_a_new_local_store_at_once_all_succeed(tmp_path: Path) -> None:
    # Training workers of a pool open the same new MLflow store together; MLflow's own
    # schema migrations fail when two processes run them at once on one SQLite file.
    home = tmp_path / "home"
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from registry.tracking import Registry\n"
        "registry = Registry.for_home(Path(sys.argv[1]))\n"
        "print(registry.experiment_id(sys.argv[2]))\n"
    )
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(home), line],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for line in ("medical", "legal", "customer_service", "general")
    ]
    results = [child.communicate(timeout=300) for child in children]
    for child, (_, stderr) in zip(children, results, strict=True):
        assert child.returncode == 0, stderr[-2000:]
    assert len({stdout.strip() for stdout, _ in results}) == 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """A real ``mlflow server`` on a free port, SQLite backend, proxied artifacts in tmp."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "server.log").open("wb")
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{tmp_path / 'server.db'}",
        "--artifacts-destination",
        str(tmp_path / "server-artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = os.environ | {"MLFLOW_DISABLE_TELEMETRY": "true"}
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not _healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (tmp_path / "server.log").read_text(errors="replace")[-2_000:]
                reason = f"mlflow server did not start within {SERVER_START_S}s:\n{tail}"
                if services_required():
                    pytest.fail(reason)
                pytest.skip(reason)
            time.sleep(0.5)
        yield url
    finally:
        # The server forks workers; stop its whole process group, which it leads.
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        log.close()


@pytest.mark.slow
def test_the_same_registry_works_over_http(mlflow_server: str, tmp_path: Path) -> None:
    registry = Registry(mlflow_server, None, download_dir=tmp_path / "downloads")

    run_id, v1 = _train(registry, tmp_path, "d" * 64, promote=True)
    registry.promote(LINE, v1, reason="first")
    _, v2 = _train(registry, tmp_path, "e" * 64, promote=True)
    registry.promote(LINE, v2, reason="second")

    assert registry.aliases(LINE) == {"champion": 2, "previous": 1}
    assert registry.client.get_run(run_id).info.artifact_uri.startswith("mlflow-artifacts:")
    adapter = registry.adapter_path(LINE, v1)
    assert adapter == tmp_path / "downloads" / "medical-v1"
    assert (adapter / "adapter_model.safetensors").read_bytes() == b"dddddddd" * 16
    assert registry.adapter_path(LINE, v1) == adapter
    assert (tmp_path / "server-artifacts").is_dir()
    assert registry.rollback(LINE, "canary regressed").champion == 1
    assert [r.registered_version for r in registry.recent_runs(LINE)] == [2, 1]


def test_runs_of_a_dead_trainer_are_closed_and_live_ones_kept(tmp_path: Path) -> None:
    from registry.records import TAG_ENDED_BECAUSE, TAG_TRAINER

    registry = Registry.for_home(tmp_path / "home")
    manifest = _manifest(tmp_path, "d" * 64)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = os.uname().nodename
    runs = {}
    for name, trainer in {
        "dead": f"{host}:{dead.pid}",
        "alive": f"{host}:{os.getpid()}",
        "elsewhere": "another-host:1",
    }.items():
        runs[name] = start_training_run(registry, _recipe(), "d" * 64, manifest, BASE_MODEL, "test")
        registry.client.set_tag(runs[name], TAG_TRAINER, trainer)

    assert registry.close_orphan_runs(LINE) == [runs["dead"]]
    closed = registry.client.get_run(runs["dead"])
    assert closed.info.status == "KILLED"
    assert str(dead.pid) in closed.data.tags[TAG_ENDED_BECAUSE]
    for name in ("alive", "elsewhere"):
        assert registry.client.get_run(runs[name]).info.status == "RUNNING"
    assert registry.close_orphan_runs("legal") == []
