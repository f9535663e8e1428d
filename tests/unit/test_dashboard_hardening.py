"""The feedback page as an attacker or a careless user meets it: formulas in exports,
response headers, and the login session (FastAPI TestClient, small SQLite store)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

import httpx
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


# --- headers ------------------------------------------------------------------------------------


def _assert_guarded(answer: httpx.Response, *, cached: bool = False) -> None:
    policy = answer.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "script-src" not in policy  # no script may run, from anywhere
    assert "frame-ancestors 'none'" in policy
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["referrer-policy"] == "no-referrer"
    if not cached:
        assert answer.headers["cache-control"] == "no-store"


@pytest.mark.parametrize(
    ("url", "status", "kind"),
    [
        ("/lines/legal", 200, "text/html"),
        ("/lines/legal/samples", 200, "text/html"),
        ("/api/lines/legal/overview", 200, "application/json"),
        ("/lines/legal/export.csv", 200, "text/csv"),
        ("/lines/legal/export.jsonl", 200, "application/x-ndjson"),
        ("/lines/atlantis", 404, "text/html"),
        ("/api/lines/atlantis/overview", 404, "application/json"),
        ("/nowhere", 404, "text/html"),
        ("/lines/legal?since=last-week", 400, "text/html"),
        ("/healthz", 200, "application/json"),
        ("/login", 200, "text/html"),
    ],
)
def test_every_answer_is_guarded(admin: TestClient, url: str, status: int, kind: str) -> None:
    answer = admin.get(url)
    assert answer.status_code == status
    assert answer.headers["content-type"].startswith(kind)
    _assert_guarded(answer)
    if kind == "text/html":  # what the policy would block, so the page must not need it
        assert "<script" not in answer.text
        assert "<style" not in answer.text


def test_refusals_and_failures_are_guarded_too(home: PageHome) -> None:
    with TestClient(home.app(), client=REMOTE, headers=home.bearer("support")) as support:
        forbidden = support.get("/lines/legal")
        assert forbidden.status_code == 403
        _assert_guarded(forbidden)
        _assert_guarded(support.get("/api/lines/legal/overview"))
    with TestClient(home.app(), client=REMOTE) as anonymous:
        login = anonymous.get("/lines/legal")
        assert login.status_code == 401
        _assert_guarded(login)
    app = home.app()

    def broken() -> None:
        raise RuntimeError("a message that may quote data")

    app.add_api_route("/lines/legal/broken", broken)
    with TestClient(app, client=REMOTE, raise_server_exceptions=False) as session:
        failed = session.get("/lines/legal/broken")
        assert failed.status_code == 500
        assert "quote data" not in failed.text
        _assert_guarded(failed)


def test_the_stylesheet_may_be_cached(admin: TestClient) -> None:
    answer = admin.get("/static/style.css")
    _assert_guarded(answer, cached=True)
    assert answer.headers["cache-control"] == "max-age=300"
    assert "url(" not in answer.text  # nothing loads from elsewhere
    assert "@import" not in answer.text
