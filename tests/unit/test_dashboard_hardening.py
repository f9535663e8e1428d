"""The feedback page as an attacker or a careless user meets it: formulas in exports,
response headers, and the login session (FastAPI TestClient, small SQLite store)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from dashboard.exports import FORMULA_STARTS, spreadsheet_cell
from tests.dashboard_store import PageHome, build_page_home

REMOTE = ("10.1.2.3", 40000)
PLANTED_LINE = "legal"
FORMULAS = (
    '=HYPERLINK("http://x","y")',
    "+1+1",
    "-2+3",
    "@SUM(A1)",
    "\t=1",
    "\r=1",
)


def _plant(home: PageHome) -> list[str]:
    """One interaction per formula, as its prompt, answer and edit."""
    records: list[dict[str, object]] = []
    ids = []
    for n, formula in enumerate(FORMULAS):
        request_id = f"formula-{n}"
        ids.append(request_id)
        records.append(
            {
                "type": "interaction",
                "request_id": request_id,
                "business_line": PLANTED_LINE,
                "base_model": "m",
                "messages": [{"role": "user", "content": formula}],
                "response": formula,
                "created_at": f"2026-11-02T10:00:{n:02d}Z",
            }
        )
        records.append(
            {
                "type": "edit",
                "request_id": request_id,
                "edited_text": formula + " (edited)",
                "created_at": f"2026-11-02T10:01:{n:02d}Z",
            }
        )
    report = home.store.ingest(records, source="test")
    assert report.quarantined == 0, report.rejections
    return ids


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PageHome]:
    built = build_page_home(
        tmp_path_factory.mktemp("hardening") / "home", requests=20, with_dataset=False
    )
    _plant(built)
    yield built
    built.store.close()


@pytest.fixture(scope="module")
def admin(home: PageHome) -> Iterator[TestClient]:
    with TestClient(home.app(), client=REMOTE, headers=home.bearer("admin")) as session:
        yield session


# --- exports ------------------------------------------------------------------------------------


def test_spreadsheet_cell_quotes_only_formula_starts() -> None:
    for start in FORMULA_STARTS:
        assert spreadsheet_cell(start + "x") == "'" + start + "x"
    for safe in ("", "hello", "'=already text", "1+1", " =1", "你好"):
        assert spreadsheet_cell(safe) == safe


def test_csv_export_has_no_live_formula_and_keeps_the_text(admin: TestClient) -> None:
    answer = admin.get(f"/lines/{PLANTED_LINE}/export.csv", params={"signal": "edit"})
    assert answer.status_code == 200
    table = list(csv.reader(io.StringIO(answer.text, newline="")))
    header, rows = table[0], table[1:]
    assert all(not cell.startswith(FORMULA_STARTS) for row in table for cell in row)
    planted = [dict(zip(header, row, strict=True)) for row in rows]
    planted = [row for row in planted if row["request_id"].startswith("formula-")]
    assert len(planted) == len(FORMULAS)

    exact = admin.get(f"/lines/{PLANTED_LINE}/export.jsonl", params={"signal": "edit"})
    by_id = {r["request_id"]: r for r in map(json.loads, exact.text.splitlines())}
    for row in planted:
        original = by_id[row["request_id"]]
        prompt = original["messages"][-1]["content"]
        assert prompt in FORMULAS  # the JSONL export keeps the text as it was
        for column, text in (
            ("prompt", prompt),
            ("response", original["response"]),
            ("edit", original["edit"]),
        ):
            assert row[column] == "'" + text
