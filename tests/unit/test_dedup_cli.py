"""The ``dedup`` command, run through Typer's test runner."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import typer
from typer.testing import CliRunner

from cli.commands.dedup import dedup


@pytest.fixture
def app() -> typer.Typer:
    application = typer.Typer()
    application.command()(dedup)
    return application


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def read_records(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def record(**fields: object) -> str:
    return orjson.dumps(fields).decode()


def test_good_file_gets_cluster_keep_and_reason(app: typer.Typer, tmp_path: Path) -> None:
    source = write_lines(
        tmp_path / "in.jsonl",
        [
            record(text="I want to cancel my order 12345", created_at="2024-01-02T00:00:00Z"),
            record(text="I want to cancel my order 67890", created_at="2024-01-01T00:00:00Z"),
            "",
            record(text="How do I reset my password", business_line="bank"),
            record(text="how do i reset my password?", business_line="bank"),
        ],
    )
    target = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["--in", str(source), "--out", str(target), "--field", "text"])
    assert result.exit_code == 0, result.output
    written = read_records(target)
    assert [(r["cluster"], r["keep"], r["dedup_reason"]) for r in written] == [
        (2, False, "near_duplicate_of:2"),
        (2, True, "first_of_cluster"),
        (4, True, "first_of_cluster"),
        (4, False, "exact_duplicate_of:4"),
    ]
    assert written[2]["business_line"] == "bank"
    assert "Traceback" not in result.output


def test_flood_cap_option(app: typer.Typer, tmp_path: Path) -> None:
    source = write_lines(
        tmp_path / "in.jsonl",
        [record(text=f"I want to cancel my order {n}", created_at=n) for n in range(5)],
    )
    target = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        app, ["--in", str(source), "--out", str(target), "--field", "text", "--max-kept", "2"]
    )
    assert result.exit_code == 0, result.output
    assert [r["keep"] for r in read_records(target)] == [True, True, False, False, False]


def test_malformed_lines_are_named_and_good_ones_still_written(
    app: typer.Typer, tmp_path: Path
) -> None:
    source = write_lines(
        tmp_path / "in.jsonl",
        [
            record(text="refund please"),
            "{not json",
            record(text="Refund, please!"),
            "[1, 2]",
            record(text=5),
            record(text="refund please", created_at="last week"),
            record(text="where is my parcel"),
        ],
    )
    target = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["--in", str(source), "--out", str(target), "--field", "text"])
    assert result.exit_code == 1
    assert f"{source}:2: not valid JSON" in result.stderr
    assert f"{source}:4: expected a JSON object" in result.stderr
    assert f"{source}:5: field 'text' is a number" in result.stderr
    assert f"{source}:6: field 'created_at' is 'last week'" in result.stderr
    assert "Traceback" not in result.output
    written = read_records(target)
    assert [r["text"] for r in written] == [
        "refund please",
        "Refund, please!",
        "where is my parcel",
    ]
    assert [r["dedup_reason"] for r in written] == [
        "first_of_cluster",
        "exact_duplicate_of:1",
        "unique",
    ]


def test_invalid_settings_exit_without_traceback(app: typer.Typer, tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.jsonl", [record(text="hello")])
    result = CliRunner().invoke(
        app,
        [
            "--in",
            str(source),
            "--out",
            str(tmp_path / "o.jsonl"),
            "--field",
            "text",
            "--threshold",
            "0.1",
        ],
    )
    assert result.exit_code == 2
    assert "use more bands or fewer rows" in result.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_missing_output_directory_is_reported(app: typer.Typer, tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.jsonl", [record(text="hello")])
    result = CliRunner().invoke(
        app, ["--in", str(source), "--out", str(tmp_path / "no" / "o.jsonl"), "--field", "text"]
    )
    assert result.exit_code == 2
    assert "is not a directory" in result.stderr
