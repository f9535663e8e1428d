"""``flywheel import pairs`` into the embedded SQLite store, then ``flywheel datasets build``."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow.parquet as pq
from typer.testing import CliRunner

from cli.main import app
from flywheel.settings import Settings

runner = CliRunner()

QUESTIONS = [
    (
        "How should I store fresh basil so it lasts longer?",
        "Stems in a glass of water on the counter; change the water daily.",
        "Freeze it whole in a plastic bag.",
    ),
    (
        "What is a good way to learn to juggle three balls?",
        "Toss one ball hand to hand at eye level, then two, then add a third.",
        "Buy more balls.",
    ),
    (
        "Why does bread go stale faster in the fridge?",
        "Cold speeds up starch retrogradation, so the crumb firms sooner.",
        "Fridges are magic.",
    ),
    (
        "How can I keep my bicycle chain from rusting?",
        "Dry it after wet rides and oil it lightly every few hundred km.",
        "Leave it in the rain.",
    ),
]


def hh_row(question: str, good: str, bad: str) -> dict[str, str]:
    start = f"\n\nHuman: {question}\n\nAssistant:"
    return {"chosen": f"{start} {good}", "rejected": f"{start} {bad}"}


def write_pairs(tmp_path: Path) -> tuple[Path, Path]:
    rows: list[bytes] = [orjson.dumps(hh_row(*QUESTIONS[0])) + b"\n"]
    rows.append(orjson.dumps(hh_row(*QUESTIONS[1])) + b"\n")
    rows.append(b'{"chosen": "\\n\\nHuman: broken\n')  # line 3: not JSON
    differ = hh_row(*QUESTIONS[2])
    differ["rejected"] = differ["rejected"].replace("Why", "When")
    rows.append(orjson.dumps(differ) + b"\n")  # line 4: prompts differ
    same = hh_row(QUESTIONS[3][0], QUESTIONS[3][1], QUESTIONS[3][1])
    rows.append(orjson.dumps(same) + b"\n")  # line 5: chosen == rejected
    rows.append(orjson.dumps(hh_row(*QUESTIONS[2])) + b"\n")
    hh = tmp_path / "mine-hh.jsonl"
    hh.write_bytes(b"".join(rows))
    question, good, bad = QUESTIONS[3]
    trl = tmp_path / "mine-trl.jsonl.gz"
    trl.write_bytes(
        gzip.compress(
            orjson.dumps(
                {
                    "prompt": [{"role": "user", "content": question}],
                    "chosen": [{"role": "assistant", "content": good}],
                    "rejected": [{"role": "assistant", "content": bad}],
                }
            )
            + b"\n"
            + orjson.dumps({"prompt": "q?", "chosen": "a"})
            + b"\n"
        )
    )
    return hh, trl


def test_import_quarantines_bad_rows_is_idempotent_and_builds_dpo_pairs(
    settings: Settings, tmp_path: Path
) -> None:
    hh, trl = write_pairs(tmp_path)

    first = runner.invoke(app, ["import", "pairs", str(hh)])
    gz = runner.invoke(app, ["import", "pairs", str(trl), "--format", "trl"])

    assert first.exit_code == 0, first.output
    assert "added 6 interactions and 6 feedback events" in first.stdout
    assert "3 quarantined" in first.stdout
    assert "mine-hh.jsonl:3: not valid JSON" in first.stderr
    assert gz.exit_code == 0, gz.output
    assert "added 2 interactions and 2 feedback events" in gz.stdout
    assert "mine-trl.jsonl.gz:2: trl row: missing 'rejected'" in gz.stderr
    listed = runner.invoke(app, ["quarantine", "--json"])
    quarantined = {
        (Path(row["source"]).name, row["line_number"]): row["reason"]
        for row in map(json.loads, listed.stdout.splitlines())
    }
    assert quarantined.keys() == {
        ("mine-hh.jsonl", 3),
        ("mine-hh.jsonl", 4),
        ("mine-hh.jsonl", 5),
        ("mine-trl.jsonl.gz", 2),
    }
    assert "differ before the last answer" in quarantined["mine-hh.jsonl", 4]
    assert "answers are identical" in quarantined["mine-hh.jsonl", 5]

    again = runner.invoke(app, ["import", "pairs", str(hh)])

    assert again.exit_code == 0, again.output
    assert "added 0 interactions and 0 feedback events, 12 duplicates skipped" in again.stdout
    assert len(runner.invoke(app, ["quarantine", "--json"]).stdout.splitlines()) == 4
    stats = json.loads(runner.invoke(app, ["stats", "--json"]).stdout)
    assert stats["interactions"] == 8

    built = runner.invoke(
        app, ["datasets", "build", "--line", "general", "--eval-fraction", "0", "--json"]
    )

    assert built.exit_code == 0, built.output
    (result,) = json.loads(built.stdout)
    assert result["funnel"]["examples"]["dpo"] == 4
    rows = pq.read_table(Path(result["dataset"]) / "dpo_train.parquet").to_pylist()
    pairs = {(r["prompt"][-1]["content"], r["chosen"][0]["content"]) for r in rows}
    assert pairs == {(q, good) for q, good, _ in QUESTIONS}
    assert {r["rule"] for r in rows} == {"rank"}
    assert all(len(r["source_request_ids"]) == 2 for r in rows)


def flywheel(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLYWHEEL_HOME": str(home)}
    env.pop("FLYWHEEL_DATABASE_URL", None)
    command = Path(sys.executable).with_name("flywheel")
    return subprocess.run(
        [str(command), *args], capture_output=True, text=True, env=env, check=False
    )


def test_a_missing_file_or_an_unknown_format_exits_2(tmp_path: Path) -> None:
    hh, _ = write_pairs(tmp_path)

    missing = flywheel("import", "pairs", str(tmp_path / "nope.jsonl"), home=tmp_path)
    unknown = flywheel("import", "pairs", str(hh), "--format", "csv", home=tmp_path)

    assert missing.returncode == 2
    assert "no such file" in missing.stderr
    assert unknown.returncode == 2
    assert "unknown --format 'csv': use hh or trl" in unknown.stderr
    assert "Traceback" not in missing.stderr + unknown.stderr
