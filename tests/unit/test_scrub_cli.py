"""``flywheel scrub`` through Typer's test runner, on a tiny app that registers the command."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
import typer
from typer.testing import CliRunner

from cli.commands.common import with_clients
from cli.commands.scrub import scrub


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer()
    app.callback()(with_clients)
    app.command("scrub")(scrub)

    @app.command("noop")
    def noop() -> None:  # a second command so that "scrub" stays a subcommand
        """Do nothing."""

    return app


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_records(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def test_scrubs_fields_and_adds_a_summary(app: typer.Typer, tmp_path: Path) -> None:
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_lines(
        source,
        [
            json.dumps(
                {
                    "id": 1,
                    "prompt": "I'm Maria Garcia, mail maria@example.com",
                    "response": "Thanks Maria Garcia!",
                }
            ),
            json.dumps(
                {
                    "id": 2,
                    "messages": [{"role": "user", "content": "我叫赵新民，电话13812345678"}],
                },
                ensure_ascii=False,
            ),
            json.dumps({"id": 3, "other": "no fields here"}),
        ],
    )
    result = CliRunner().invoke(
        app,
        ["scrub", "--in", str(source), "--out", str(target), "--field", "prompt", "--field",
         "response", "--field", "messages", "--batch-size", "2"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    records = read_records(target)
    assert [r["id"] for r in records] == [1, 2, 3]
    assert records[0]["prompt"] == "I'm <PERSON_1>, mail <EMAIL_ADDRESS_1>"
    assert records[0]["response"] == "Thanks <PERSON_1>!"
    assert records[0]["pii"] == {"EMAIL_ADDRESS": 1, "PERSON": 2}
    assert records[1]["messages"] == [
        {"role": "user", "content": "我叫<PERSON_1>，电话<PHONE_NUMBER_1>"}
    ]
    assert records[2] == {"id": 3, "other": "no fields here", "pii": {}}
    assert not (tmp_path / "out.jsonl.partial").exists()


def test_malformed_lines_are_named_good_ones_kept_exit_code_1(
    app: typer.Typer, tmp_path: Path
) -> None:
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_lines(
        source,
        [
            json.dumps({"text": "Call 555-123-4567"}),
            "{not json",
            "",
            "[1, 2]",
            json.dumps({"text": "IP 10.1.2.3"}),
        ],
    )
    result = CliRunner().invoke(
        app, ["scrub", "--in", str(source), "--out", str(target), "--field", "text"]
    )
    assert result.exit_code == 1
    assert f"{source}:2: not valid JSON" in result.stderr
    assert f"{source}:4: expected a JSON object, got list" in result.stderr
    assert "2 malformed line(s) skipped; 2 record(s) written" in result.stderr
    assert "Traceback" not in result.output
    assert [r["text"] for r in read_records(target)] == [
        "Call <PHONE_NUMBER_1>",
        "IP <IP_ADDRESS_1>",
    ]


def test_missing_input_is_a_usage_error(app: typer.Typer, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["scrub", "--in", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o.jsonl"),
         "--field", "text"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_bad_language_is_reported(app: typer.Typer, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    write_lines(source, [json.dumps({"text": "hi"})])
    result = CliRunner().invoke(
        app,
        ["scrub", "--in", str(source), "--out", str(tmp_path / "o.jsonl"), "--field", "text",
         "--language", "fr"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "invalid settings" in result.stderr
