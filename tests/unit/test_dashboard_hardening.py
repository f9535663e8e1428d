"""The feedback page as an attacker or a careless user meets it: formulas in exports,
response headers, and the login session (FastAPI TestClient, small SQLite store)."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from dashboard.access import COOKIE
from dashboard.app import create_app
from dashboard.exports import FORMULA_STARTS, spreadsheet_cell
from dashboard.sessions import LoginSessions, session_digest
from dashboard.tables import dashboard_sessions_table
from flywheel.settings.dashboard import DashboardSettings
from gateway.keys import ApiKey, add_key, key_digest
from registry.routes import RouteStore
from tests.dashboard_store import PageHome, build_page_home, shared_scrubber

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


# --- login sessions -----------------------------------------------------------------------------


class _Clock:
    """UTC now, moved by hand."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def _page(home: PageHome, clock: _Clock | None = None, **options: Any) -> FastAPI:
    """The page on ``home`` with a clock for its sessions."""
    settings = DashboardSettings(**({"rollup_grace_s": 0, "rollup_interval_s": 0} | options))
    return create_app(
        home.settings,
        settings,
        store=home.store,
        routes=RouteStore(home.store.engine),
        keys_file=home.settings.home / "gateway-keys.yaml",
        scrubber_factory=shared_scrubber,
        clock=clock,
    )


def _log_in(browser: TestClient, key: str) -> httpx.Response:
    answer = browser.post(
        "/login", data={"key": key, "next": "/lines/legal"}, follow_redirects=False
    )
    assert answer.status_code == 303, answer.text
    return answer


def test_the_cookie_is_a_session_not_the_key(home: PageHome) -> None:
    key = home.keys["counsel"]
    with TestClient(home.app(), client=REMOTE) as browser:
        answer = _log_in(browser, key)
        cookie = answer.headers["set-cookie"]
        attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
        assert {"httponly", "path", "max-age", "samesite"} <= attributes
        assert "samesite=strict" in cookie.lower()
        assert "path=/" in cookie.lower()
        assert "max-age=28800" in cookie.lower()  # the 8 hour default
        assert "secure" not in attributes  # plain http here
        session_id = browser.cookies[COOKIE]
        assert key not in cookie
        assert key_digest(key) not in cookie
        assert key[3:] not in session_id
        assert browser.get("/lines/legal").status_code == 200
        assert browser.get("/api/lines").json()["viewer"] == "counsel"
    with home.store.engine.connect() as connection:
        stored = [tuple(row) for row in connection.execute(select(dashboard_sessions_table))]
    assert stored
    assert all(session_id not in str(row) and key not in str(row) for row in stored)


def test_over_https_the_cookie_is_secure(home: PageHome) -> None:
    with TestClient(home.app(), client=REMOTE, base_url="https://testserver") as browser:
        cookie = _log_in(browser, home.keys["counsel"]).headers["set-cookie"].lower()
        assert "; secure" in cookie


def test_logout_ends_the_session_for_a_replayed_cookie_and_other_workers(home: PageHome) -> None:
    with TestClient(home.app(), client=REMOTE) as browser:
        _log_in(browser, home.keys["counsel"])
        session_id = browser.cookies[COOKIE]
        # Another worker of the same page sees the login, then the logout.
        with TestClient(home.app(), client=REMOTE, cookies={COOKIE: session_id}) as other:
            assert other.get("/api/lines").status_code == 200
            browser.post("/logout")
            assert COOKIE not in browser.cookies
            replayed = other.get("/lines/legal")
            assert replayed.status_code == 401
            assert 'name="key"' in replayed.text  # the login form
            assert "log in again" in other.get("/api/lines").json()["error"]


def test_an_expired_session_is_refused(home: PageHome) -> None:
    clock = _Clock()
    app = _page(home, clock, session_lifetime_s=3600)
    with TestClient(app, client=REMOTE) as browser:
        cookie = _log_in(browser, home.keys["counsel"]).headers["set-cookie"]
        assert "max-age=3600" in cookie.lower()
        clock.now += timedelta(minutes=59)
        assert browser.get("/lines/legal").status_code == 200
        clock.now += timedelta(minutes=1)  # an absolute lifetime: use does not renew it
        assert browser.get("/lines/legal").status_code == 401


@pytest.mark.parametrize(
    "forged",
    [
        "tampered",
        "the raw key",
        "x" * 43,
        "",
        "../../etc" * 20,
    ],
)
def test_a_forged_cookie_is_refused(home: PageHome, forged: str) -> None:
    with TestClient(home.app(), client=REMOTE) as browser:
        _log_in(browser, home.keys["counsel"])
        real = browser.cookies[COOKIE]
        value = {
            "tampered": real[:-1] + ("A" if real[-1] != "A" else "B"),
            "the raw key": home.keys["counsel"],
        }.get(forged, forged)
        with TestClient(home.app(), client=REMOTE, cookies={COOKIE: value}) as other:
            assert other.get("/api/lines").status_code == 401
            # The old cookie, which held the key itself, opens nothing either.
            other.cookies.clear()
            other.cookies.set("flywheel_key", home.keys["counsel"])
            assert other.get("/api/lines").status_code == 401


def test_a_removed_key_ends_its_sessions_and_bearer_still_works(home: PageHome) -> None:
    path = home.settings.home / "gateway-keys.yaml"
    before = path.read_text()
    temporary = add_key(path, "temporary", ["legal"])
    try:
        with TestClient(home.app(), client=REMOTE) as browser:
            _log_in(browser, temporary)
            assert browser.get("/lines/legal").status_code == 200
            bearer = {"Authorization": f"Bearer {home.keys['counsel']}"}
            path.write_text(before)
            time.sleep(0.3)  # the key file is re-read at most every 0.25 s
            assert browser.get("/lines/legal").status_code == 401
            assert browser.get("/lines/legal", headers=bearer).status_code == 200
    finally:
        path.write_text(before)


def test_sessions_keep_only_digests_and_drop_expired_rows(home: PageHome) -> None:
    clock = _Clock()
    sessions = LoginSessions(home.store.engine, timedelta(hours=1), clock=clock)
    key = ApiKey(name="admin", sha256=key_digest(home.keys["admin"]), business_lines=("*",))
    first = sessions.open(key)
    found = sessions.find(first)
    assert found is not None
    assert found.key_name == "admin"
    assert found.key_sha256 == key.sha256
    clock.now += timedelta(hours=2)
    assert sessions.find(first) is None
    second = sessions.open(key)  # opening one purges the expired
    c = dashboard_sessions_table.c
    with home.store.engine.connect() as connection:
        ids = set(connection.execute(select(c.id_sha256)).scalars())
    assert session_digest(first) not in ids
    assert session_digest(second) in ids
    sessions.close(second)
    assert sessions.find(second) is None
    sessions.close("not a session")  # nothing to end, no error
