"""A user's file is read within bounds: an over-long line costs a few MB of memory, however
long it is; a gzip file stops at its decompression bound; a refused row keeps a few KB."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from cli.main import app
from feedback.importers.business_rules import load_business_rules
from feedback.importers.pairs import iter_pairs_file
from feedback.jsonl import JsonlRecord, MalformedLine, iter_jsonl
from flywheel.settings import Settings

runner = CliRunner()
MB = 1024 * 1024
PAIR = {"prompt": "Capital of France?", "chosen": "Paris.", "rejected": "Lyon."}


def write_long_line_gz(path: Path, megabytes: int) -> Path:
    """A gzip file: a good pair, one line of ``megabytes`` MB, another good pair."""
    with gzip.open(path, "wb", compresslevel=6) as sink:
        sink.write(orjson.dumps(PAIR) + b"\n")
        sink.write(b'{"prompt": "')
        block = b"a" * MB
        for _ in range(megabytes):
            sink.write(block)
        sink.write(b'"}\n')
        sink.write(orjson.dumps({**PAIR, "prompt": "Capital of Italy?"}) + b"\n")
    return path


def peak_traced(read: Callable[[], Any]) -> tuple[Any, int]:
    """What ``read`` returns and the peak of Python's allocations while it ran, in bytes."""
    tracemalloc.start()
    try:
        result = read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


@pytest.fixture(scope="module")
def long_line_gz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_long_line_gz(tmp_path_factory.mktemp("bomb") / "pairs.jsonl.gz", 96)


def test_a_96_mb_line_in_a_gzip_file_is_skipped_in_little_memory(long_line_gz: Path) -> None:
    items, peak = peak_traced(lambda: list(iter_pairs_file(long_line_gz)))

    assert long_line_gz.stat().st_size < MB
    assert peak < 40 * MB, f"peak {peak / MB:.0f} MB"
    assert [type(item) for item in items] == [JsonlRecord, MalformedLine, JsonlRecord]
    refused = items[1]
    assert isinstance(refused, MalformedLine)
    assert refused.line_number == 2
    assert f"line is {96 * MB + 14:,} bytes" in refused.reason
    assert len(refused.raw) <= 4096
    assert refused.raw.startswith(b'{"prompt": "aaaa')


def test_a_long_line_of_a_plain_file_is_skipped_in_little_memory(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with path.open("wb") as sink:
        sink.write(b'{"type": "x", "text": "' + b"b" * (40 * MB) + b'"}\n{"type": "y"}\n')

    items, peak = peak_traced(lambda: list(iter_jsonl(path)))

    assert peak < 24 * MB, f"peak {peak / MB:.0f} MB"
    assert [item.line_number for item in items] == [1, 2]
    assert isinstance(items[0], MalformedLine)
    assert isinstance(items[1], JsonlRecord)


def flywheel_peak(*args: str, home: Path) -> tuple[int, str, int]:
    """Run the flywheel command: its exit code, its stderr and its peak resident memory (bytes)."""
    env = {**os.environ, "FLYWHEEL_HOME": str(home)}
    env.pop("FLYWHEEL_DATABASE_URL", None)
    command = [str(Path(sys.executable).with_name("flywheel")), *args]
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        return process.returncode, stderr.read().decode(), usage.ru_maxrss * 1024


def test_a_gzip_bomb_is_refused_at_its_decompression_bound(tmp_path: Path) -> None:
    """The probe's file (400 MB of one line in a few hundred KB), given to both commands that
    read pairs: refused by exit 2 naming it, within a few MB more than a tiny file takes."""
    bomb = write_long_line_gz(tmp_path / "bomb.jsonl.gz", 400)
    small = tmp_path / "small.jsonl"
    small.write_bytes(orjson.dumps(PAIR) + b"\n")

    _, _, baseline = flywheel_peak("import", "pairs", str(small), home=tmp_path)
    runs = {
        "import": flywheel_peak("import", "pairs", str(bomb), home=tmp_path),
        "eval": flywheel_peak(
            "eval", "general", "--pairs", str(bomb), "--version", "base", home=tmp_path
        ),
    }

    assert bomb.stat().st_size < 600 * 1024
    for command, (code, stderr, peak) in runs.items():
        assert code == 2, (command, stderr)
        assert "bomb.jsonl.gz: decompresses to more than" in stderr, (command, stderr)
        assert "Traceback" not in stderr
        assert peak < baseline + 48 * MB, (command, peak / MB, baseline / MB)


def test_a_refused_row_keeps_a_few_kb_in_quarantine_with_its_size(
    settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "big.jsonl"
    big_text = "z" * (3 * MB)  # valid JSON, refused for its text length
    path.write_bytes(
        b'{"type": "smile", "text": "'
        + b"y" * (9 * MB)
        + b'"}\n'
        + orjson.dumps(
            {
                "type": "interaction",
                "request_id": "r-big",
                "business_line": "legal",
                "base_model": "m",
                "messages": [{"role": "user", "content": big_text}],
                "response": "ok",
                "created_at": "2026-11-01T00:00:00Z",
            }
        )
        + b"\n"
    )

    result = runner.invoke(app, ["import", "jsonl", str(path)])
    listed = runner.invoke(app, ["quarantine", "--json"])

    assert result.exit_code == 1, result.output
    rows = {row["line_number"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert rows.keys() == {1, 2}
    for row in rows.values():
        assert len(row["raw"].encode()) <= 4096
    assert f"{9 * MB + 29:,} bytes" in rows[1]["reason"]
    assert "first 4,096 kept" in rows[2]["reason"]


def test_a_rules_file_is_read_within_its_bound(tmp_path: Path) -> None:
    from flywheel.errors import UsageError

    path = tmp_path / "rules.yaml"
    path.write_bytes(b"default: general\n# " + b"x" * (2 * MB) + b"\n")

    with pytest.raises(UsageError, match=r"rules\.yaml: larger than"):
        load_business_rules(path)


def test_every_importer_reads_gzip_through_the_same_reader(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"type": "x"}\n\n[1]\n'))

    items = list(iter_jsonl(path))

    assert [(item.line_number, type(item)) for item in items] == [
        (1, JsonlRecord),
        (3, MalformedLine),
    ]
