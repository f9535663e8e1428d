"""What a person reads in the CLI's output: plain words, whole numbers, whole reasons, no
library noise (issue 34, quiet and readable progress)."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flywheel.settings import Settings
from flywheel.wording import in_words

ROOT = Path(__file__).resolve().parents[2]


def test_a_mapping_reads_as_words() -> None:
    assert in_words({"regenerate": 35, "thumbs_up": 2}) == "regenerate: 35, thumbs up: 2"
    synced = {"http://127.0.0.1:8001": {"loaded": [], "kept": ["cs-v1", "cs-v2"]}}
    assert in_words(synced) == "http://127.0.0.1:8001: (loaded: none, kept: cs-v1, cs-v2)"
    assert in_words({}) == "none"


def test_the_loops_night_prints_reactions_without_braces(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from lab.commands.loop import _print_night
    from lab.simulation.loop import NightRecord

    record = NightRecord(
        night=1,
        champion=None,
        canary="customer_service-v1",
        decision="canary",
        satisfied={"base": 0.3},
        served={"base": 190},
        nightly={"status": "deployed", "reason": "on the canary"},
        canary_decisions=[],
        reactions={"regenerate": 35, "thumbs_up": 4},
        minutes=2.0,
        reviews={"passed": 3},
        failures={"http 503": 2},
    )
    _print_night(record)
    printed = capsys.readouterr().out
    assert "reactions: regenerate: 35, thumbs up: 4" in printed
    assert "not taken by the gateway: http 503: 2" in printed
    assert "reviews: passed: 3" in printed
    assert "{" not in printed
    assert "'" not in printed


def _counts(big: int) -> dict[str, object]:
    signals = ["errors", "thumbs_up", "thumbs_down", "regenerate", "abandon", "edit"]
    signals += ["task_success", "task_failure", "task_outcome", "comment", "copy"]
    lines = {
        name: {"interactions": big + n, "events": dict.fromkeys(signals, big + n)}
        for n, name in enumerate(["legal", "customer_service"])
    }
    return {
        "events": dict.fromkeys(signals, 2 * big),
        "business_lines": lines,
        "interactions": 2 * big,
    }


def test_a_table_off_a_terminal_keeps_long_numbers_whole(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cli.commands.reports import print_buckets

    monkeypatch.delenv("COLUMNS", raising=False)
    print_buckets(_counts(1_000_000_000))
    printed = capsys.readouterr().out
    assert "…" not in printed
    for number in ("1000000000", "1000000001", "2000000000"):
        assert number in printed


def test_a_table_at_80_columns_folds_numbers_instead_of_cutting_them(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cli.commands.reports import print_buckets

    monkeypatch.setenv("COLUMNS", "80")
    print_buckets(_counts(1_000_000_000))
    printed = capsys.readouterr().out
    assert "…" not in printed
    assert max(len(line) for line in printed.splitlines()) <= 80


def _alnum(text: str) -> str:
    return "".join(ch for ch in text if ch.isalnum())


def test_canary_status_prints_a_long_reason_whole(settings: Settings) -> None:
    from cli.main import app
    from feedback.store import FeedbackStore
    from registry.decisions import record_decision

    store = FeedbackStore.open(settings)
    words = " ".join(f"look{n} canary satisfies 0.41 of 65 users" for n in range(8))
    reason = f"{words}; promoted (p 0.089 <= 0.2) END"
    assert len(reason) > 300
    record_decision(
        store.engine,
        business_line="customer_service",
        adapter="customer_service-v1",
        fraction=0.05,
        look=1,
        action="promote",
        reasons=reason,
        numbers={},
        actor="canary flow",
        when=datetime(2026, 12, 4, 9, 0, tzinfo=UTC),
    )
    result = CliRunner().invoke(app, ["canary", "status", "customer_service"])
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    assert _alnum(reason) in _alnum(result.stdout)


def test_the_package_metadata_has_no_deprecated_licence_table() -> None:
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        distribution = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    licence_warnings = [w for w in caught if "license" in str(w.message).lower()]
    assert licence_warnings == []
    assert distribution.metadata.license_expression == "Apache-2.0"
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_the_trainers_log_dicts_and_bars_do_not_reach_the_terminal(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import torch
    from transformers import Trainer, TrainerControl, TrainerState, TrainingArguments

    from training.train import _quiet_trainer

    for disable_tqdm in (False, True):  # a progress bar that writes dicts, or a printer
        args = TrainingArguments(
            output_dir=str(tmp_path), report_to=[], use_cpu=True, disable_tqdm=disable_tqdm
        )
        trainer = Trainer(model=torch.nn.Linear(2, 2), args=args)
        _quiet_trainer(trainer)
        state = TrainerState(max_steps=3)
        calls = trainer.callback_handler
        calls.on_train_begin(args, state, TrainerControl())
        state.global_step = 1
        calls.on_step_end(args, state, TrainerControl())
        calls.on_log(args, state, TrainerControl(), logs={"loss": 3.849, "grad_norm": 1.25})
        calls.on_train_end(args, state, TrainerControl())
    printed = capfd.readouterr()
    assert "3.849" not in printed.out + printed.err
    assert "grad_norm" not in printed.out + printed.err


def test_library_logs_and_training_steps_go_to_a_file_under_home(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import logging

    from flywheel.library_logs import library_logs_to_file
    from training.train import log_training_step

    with warnings.catch_warnings(), library_logs_to_file(tmp_path) as path:
        warnings.simplefilter("always")
        logging.getLogger("transformers.modeling_utils").warning("a library line")
        logging.getLogger("mlflow.tracking").info("an MLflow INFO line")
        warnings.warn("a deprecated call", DeprecationWarning, stacklevel=1)
        log_training_step(2, 3, 3.849, {"loss": 3.849, "grad_norm": 1.25})
    assert path.parent == tmp_path / "logs"
    written = path.read_text(encoding="utf-8")
    for line in ("a library line", "an MLflow INFO line", "a deprecated call"):
        assert line in written
    assert "training at step 2/3: loss: 3.849, grad norm: 1.25" in written
    printed = capfd.readouterr()
    for line in ("a library line", "MLflow INFO", "a deprecated call", "3.849"):
        assert line not in printed.out + printed.err
    # As it was afterwards: the libraries' own handlers back, warnings printed again.
    assert not logging.getLogger("py.warnings").handlers


def test_torch_s_own_info_lines_stay_off_the_terminal_while_library_logs_go_to_a_file(
    tmp_path: Path,
) -> None:
    # torch's components print through handlers of their own at their parent's level: a
    # night that first imports inductor inside the block printed "I1205 ... compile_threads
    # set to 2" amid the demo's output. A child process: the test session imported it already.
    import subprocess
    import sys

    code = (
        "import sys, torch; from pathlib import Path\n"
        "from flywheel.library_logs import library_logs_to_file\n"
        "assert 'torch._inductor.config' not in sys.modules\n"
        f"with library_logs_to_file(Path({str(tmp_path)!r})):\n"
        "    import torch._inductor.config\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "compile_threads" not in done.stderr + done.stdout


def test_torch_first_imported_inside_the_block_prints_nothing_at_exit(tmp_path: Path) -> None:
    # `flywheel loop` printed dynamo's "TorchDynamo attempted to trace the following frames"
    # and "FakeTensor cache stats" at exit: torch was first imported inside the block, which
    # then restored the "torch" logger to the level it had before torch set one (none), so
    # at exit it followed the root logger, at INFO under Prefect's run-log settings.
    import subprocess
    import sys

    code = (
        "import logging, sys; from pathlib import Path\n"
        "logging.getLogger().setLevel(logging.INFO)\n"
        "from flywheel.library_logs import library_logs_to_file\n"
        f"with library_logs_to_file(Path({str(tmp_path)!r})):\n"
        "    import torch._dynamo, torch._subclasses.fake_tensor\n"
        "assert logging.getLogger('torch').getEffectiveLevel() >= logging.WARNING\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "TorchDynamo" not in done.stderr + done.stdout
    assert "FakeTensor" not in done.stderr + done.stdout


def test_off_a_terminal_a_training_is_two_lines_with_its_steps_and_loss() -> None:
    from flywheel.progress import announce_training, training_steps
    from training.train import log_training_step

    said: list[str] = []
    with training_steps(announce_training(said.append)):
        log_training_step(0, 3, None, {})
        for step, loss in ((1, 3.849), (2, 2.5), (3, 2.0)):
            log_training_step(step, 3, loss, {"loss": loss})
        log_training_step(3, 3, None, {}, done=True)
    assert said == ["  training (3 steps)", "  trained 3 steps, loss 3.849 -> 2.000"]


def test_a_training_cut_back_by_its_loss_guard_says_the_step_it_kept() -> None:
    from flywheel.progress import announce_training, training_steps
    from training.train import log_training_step

    said: list[str] = []
    with training_steps(announce_training(said.append)):
        log_training_step(0, 48, None, {})
        for step, loss in ((24, 1.2), (30, 0.9)):
            log_training_step(step, 48, loss, {"loss": loss})
        log_training_step(30, 48, None, {}, done=True, kept=24)
    assert said[-1] == (
        "  trained 30 steps, loss 1.200 -> 0.900; "
        "the adapter of step 24 kept (a later one over the loss limit)"
    )


def test_a_long_stage_off_a_terminal_says_each_quarter_done() -> None:
    """A 15-minute day of users in a CI log: its start, then a line per quarter, never one
    per request."""
    from flywheel.progress import milestones

    said: list[str] = []
    minutes = iter([0.0, 60.0, 150.0, 300.0, 420.0])
    advance = milestones("first day: users", 10, said.append, clock=lambda: next(minutes))
    for _ in range(10):
        advance(1)
    assert said == [
        "  first day: users (10)",
        "  first day: users: 3/10 (1.0 min)",
        "  first day: users: 5/10 (2.5 min)",
        "  first day: users: 8/10 (5.0 min)",
        "  first day: users: 10/10 (7.0 min)",
    ]
    quiet: list[str] = []
    milestones("nothing", 0, quiet.append)(1)
    assert quiet == ["  nothing (0)"]


def test_a_first_command_on_a_new_home_prints_no_mlflow_schema_lines(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """MLflow announces "Creating initial MLflow database tables..." at INFO through its own
    stderr handler when a SQLite store is new: every first command printed it."""
    import mlflow  # noqa: F401  (MLflow sets its stderr handler up on import)

    from registry.tracking import Registry

    registry = Registry.for_home(tmp_path / "home")
    registry.aliases("customer_service")
    captured = capfd.readouterr()
    assert "database tables" not in captured.err + captured.out
