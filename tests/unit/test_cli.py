"""The flywheel command on the embedded store: fresh homes, imports, stats, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from flywheel.settings import Settings

runner = CliRunner()


def test_stats_on_a_fresh_home_needs_no_upgrade(settings: Settings) -> None:
    result = runner.invoke(app, ["stats", "--json"])
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout)
    assert counts["interactions"] == 0
    assert set(counts["events"]) >= {
        "thumbs_up",
        "thumbs_down",
        "regenerate",
        "edit",
        "abandon",
        "task_outcome",
    }
    assert (settings.home / "flywheel.db").exists()


def test_simulate_to_file_then_import_matches_direct(settings: Settings, tmp_path: Path) -> None:
    out = tmp_path / "traffic.jsonl"
    written = runner.invoke(
        app, ["simulate", "--requests", "400", "--seed", "3", "--out", str(out)]
    )
    assert written.exit_code == 0, written.output
    imported = runner.invoke(app, ["import", "jsonl", str(out)])
    assert imported.exit_code == 0, imported.output
    via_file = json.loads(runner.invoke(app, ["stats", "--json"]).stdout)
    direct = runner.invoke(app, ["simulate", "--requests", "400", "--seed", "3"])
    assert direct.exit_code == 0
    assert "added 0 interactions and 0 feedback events" in direct.stdout
    assert json.loads(runner.invoke(app, ["stats", "--json"]).stdout) == via_file
    assert via_file["interactions"] >= 400


def test_import_with_bad_lines_exits_1_and_quarantines(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(
        b'{"type": "interaction", "request_id": "r1", "business_line": "legal",'
        b' "base_model": "m", "messages": [{"role": "user", "content": "hi"}],'
        b' "response": "hello", "created_at": "2026-11-01T00:00:00Z"}\n'
        b'{"type": "thumbs_up", "request_id": "r1", "created_at": "2026-11-01T00:01:00Z"}\n'
        b'{"type": "smile", "request_id": "r1"}\n'
    )
    result = runner.invoke(app, ["import", "jsonl", str(path)])
    assert result.exit_code == 1
    assert "mixed.jsonl:3" in result.stderr
    assert "unknown event type 'smile'" in result.stderr
    listed = runner.invoke(app, ["quarantine", "--json"])
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [row["line_number"] for row in rows] == [3]
    assert rows[0]["raw"].startswith('{"type": "smile"')
    table = runner.invoke(app, ["buckets"])
    assert "legal" in table.stdout


def cli(
    *args: str, home: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLYWHEEL_HOME": str(home)}
    env.pop("FLYWHEEL_DATABASE_URL", None)
    env.update(extra_env or {})
    flywheel = Path(sys.executable).with_name("flywheel")
    return subprocess.run(
        [str(flywheel), *args], capture_output=True, text=True, env=env, check=False
    )


def test_user_errors_are_messages_with_exit_codes(tmp_path: Path) -> None:
    missing = cli("import", "jsonl", str(tmp_path / "nope.jsonl"), home=tmp_path)
    assert missing.returncode == 2
    assert "no such file" in missing.stderr
    bad_rate = cli("simulate", "--requests", "5", "--rate", "thumbs_up", home=tmp_path)
    assert bad_rate.returncode == 2
    assert "expected SIGNAL=RATE" in bad_rate.stderr
    out_of_range = cli("simulate", "--requests", "5", "--rate", "thumbs_up=3", home=tmp_path)
    assert out_of_range.returncode == 2
    assert "less than or equal to 1" in out_of_range.stderr
    for result in (missing, bad_rate, out_of_range):
        assert "Traceback" not in result.stderr


def _served_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """`flywheel serve vllm ARGS --print-command` on a stand-in base model folder, one line."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("FLYWHEEL_BASE_MODEL", str(model))
    result = runner.invoke(app, ["serve", "vllm", *args, "--print-command"])
    assert result.exit_code == 0, result.output
    return result.stdout.replace("\n", "")


def test_serve_vllm_prints_its_command(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = _served_command(tmp_path, monkeypatch, "--port", "8123")
    model = tmp_path / "model"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in line
    assert f"--model {model}" in line
    assert "--enable-lora" in line
    assert "--host 127.0.0.1 --port 8123" in line


def test_serve_vllm_on_a_gpu_uses_the_cuda_build_and_refuses_an_unknown_device(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = _served_command(tmp_path, monkeypatch, "--device", "cuda")
    assert ".venv-vllm-cuda/bin/python -m vllm" in line or "vllm-venv-cuda/bin/python" in line
    assert "VLLM_CPU_KVCACHE_SPACE" not in line
    assert "FLYWHEEL_ADAPTER_FETCH" in line, "the GPU replica would run without the resolver"
    unknown = cli("serve", "vllm", "--device", "tpu", "--print-command", home=tmp_path)
    assert unknown.returncode == 2
    assert "--device is one of cpu, cuda, not 'tpu'" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_loop_passes_its_sampling_to_the_users_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lab.commands.loop as loop_command
    from lab.simulation.traffic import Sampling

    seen: dict[str, object] = {}

    class StopError(Exception):
        pass

    def run_loop_command(*_args: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise StopError

    monkeypatch.setattr(loop_command, "run_loop_command", run_loop_command)
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    argv = ["loop", "--line", "customer_service", "--max-tokens", "48", "--temperature", "0"]
    result = runner.invoke(app, argv)
    assert isinstance(result.exception, StopError), result.output
    sampling = seen["sampling"]
    assert (sampling.max_tokens, sampling.temperature) == (48, 0.0)  # type: ignore[attr-defined]
    assert sampling.top_p == 0.9  # type: ignore[attr-defined]
    seen.clear()
    assert isinstance(runner.invoke(app, argv[:3]).exception, StopError)
    assert seen["sampling"] == Sampling()  # no option: the traffic's own defaults
    for option, value in (("--max-tokens", "0"), ("--temperature", "2.5")):
        refused = cli("loop", "--line", "customer_service", option, value, home=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert option in refused.stderr
        assert "Traceback" not in refused.stderr


def assert_usage_error(result: subprocess.CompletedProcess[str], *named: str) -> None:
    """Exit 2, the message naming each of ``named``, no traceback nor internal error."""
    assert result.returncode == 2, result.stderr
    for name in named:
        assert name in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert "internal error" not in result.stderr


def test_user_text_holding_markup_is_printed_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "a[red]b.jsonl"
    path.write_bytes(b'{"type": "[/bold]", "request_id": "r1"}\n')
    wide = {"COLUMNS": "240"}

    imported = cli("import", "jsonl", str(path), home=tmp_path, extra_env=wide)
    listed = cli("quarantine", home=tmp_path, extra_env=wide)
    missing = cli("import", "jsonl", str(tmp_path / "no[/bold].jsonl"), home=tmp_path)

    assert imported.returncode == 1, imported.stderr
    assert "a[red]b.jsonl: read 1" in imported.stdout
    assert "quarantined " in imported.stderr
    assert "a[red]b.jsonl:1 (type=[/bold]" in imported.stderr
    assert "unknown event type '[/bold]'" in imported.stderr
    assert listed.returncode == 0, listed.stderr
    assert "unknown event type '[/bold]'" in listed.stdout
    assert_usage_error(missing, "no such file", "no[/bold].jsonl")
    assert "Traceback" not in imported.stderr + listed.stderr


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("FLYWHEEL_STORE_BATCH_SIZE", "-5", "greater than or equal to 1"),
        ("FLYWHEEL_DATABASE_URL", "not a url", "not a SQLAlchemy URL"),
        ("FLYWHEEL_DATABASE_URL", "nosuchdb://u:secretpw@h/d", "no database driver"),
        ("FLYWHEEL_BUSINESS_LINES", "[1,", "not valid JSON"),
    ],
)
def test_a_bad_setting_is_a_usage_error_naming_the_variable(
    tmp_path: Path, variable: str, value: str, says: str
) -> None:
    result = cli("stats", home=tmp_path, extra_env={variable: value})

    assert_usage_error(result, variable, says)
    assert "secretpw" not in result.stderr


def test_a_home_that_cannot_be_made_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")

    below = cli("stats", home=blocker / "home")
    itself = cli("stats", home=blocker)

    assert_usage_error(below, "FLYWHEEL_HOME", str(blocker / "home"))
    assert_usage_error(itself, "FLYWHEEL_HOME", str(blocker))


def test_a_bad_rules_file_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    trees = tmp_path / "trees.jsonl"
    trees.write_text("")
    broken = tmp_path / "broken.yaml"
    broken.write_text("rules: [\n  - {business_line: legal\n")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"default: caf\xe9\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("default: general\nfallback: legal\n")

    results = {
        path.name: cli("import", "oasst", str(trees), "--rules", str(path), home=tmp_path)
        for path in (broken, latin, unknown)
    }

    assert_usage_error(results["broken.yaml"], "broken.yaml", "not valid YAML (line")
    assert_usage_error(results["latin.yaml"], "latin.yaml", "not UTF-8")
    assert_usage_error(results["unknown.yaml"], "unknown.yaml", "fallback")


def test_a_corrupt_gzip_given_to_eval_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    corrupt = tmp_path / "pairs.jsonl.gz"
    corrupt.write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 6 + b"not deflate data at all")
    not_gzip = tmp_path / "plain.jsonl.gz"
    not_gzip.write_bytes(b'{"prompt": "q", "chosen": "a", "rejected": "b"}\n')

    for path in (corrupt, not_gzip):
        result = cli("eval", "general", "--pairs", str(path), "--version", "base", home=tmp_path)
        imported = cli("import", "pairs", str(path), home=tmp_path)

        assert_usage_error(result, path.name, "cannot be read to the end")
        assert_usage_error(imported, path.name, "cannot be read to the end")


def test_a_users_spec_that_exits_at_import_is_a_usage_error(tmp_path: Path) -> None:
    spec = tmp_path / "exits.py"
    spec.write_text("import sys\nsys.exit('no users here')\n")

    result = cli(
        "simulate",
        "--requests",
        "1",
        "--gateway",
        "http://127.0.0.1:9",
        "--api-key",
        "k",
        "--users",
        f"{spec}:Users",
        home=tmp_path,
    )

    assert_usage_error(result, f"--users {spec}:Users", "SystemExit: no users here")


def test_a_replica_the_gateway_does_not_name_is_warned_about() -> None:
    from cli.commands.vllm import unnamed_replica_warning

    upstreams = ["http://vllm:8000/", "http://gpu-2:8000"]
    assert unnamed_replica_warning("http://vllm:8000", upstreams) is None
    assert unnamed_replica_warning("http://gpu-2:8000/", upstreams) is None
    assert unnamed_replica_warning("http://0.0.0.0:8000", []) is None
    warning = unnamed_replica_warning("http://0.0.0.0:8000", upstreams)
    assert warning is not None
    assert "http://0.0.0.0:8000" in warning
    assert "--url" in warning
