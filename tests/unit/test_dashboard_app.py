"""The feedback page over HTTP (FastAPI TestClient) on a generated SQLite store."""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from typer.testing import CliRunner

from dashboard.attempts import FailedKeyAttempts, client_of
from feedback.schema import feedback_table, interactions_table
from tests.dashboard_store import TRAINED_LINE, PageHome, build_page_home

LOOPBACK = ("127.0.0.1", 40000)
REMOTE = ("10.1.2.3", 40000)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PageHome]:
    built = build_page_home(tmp_path_factory.mktemp("page") / "home")
    yield built
    built.store.close()


@pytest.fixture(scope="module")
def client(home: PageHome) -> Iterator[TestClient]:
    with TestClient(home.app(), client=REMOTE, headers=home.bearer("admin")) as session:
        yield session


def _count(home: PageHome, line: str, *where: object) -> int:
    i = interactions_table.c
    query = select(func.count()).select_from(interactions_table).where(i.business_line == line)
    with home.store.engine.connect() as connection:
        return int(connection.execute(query.where(*where)).scalar_one())


# --- access -------------------------------------------------------------------------------------


def test_health_needs_no_key(home: PageHome) -> None:
    with TestClient(home.app(), client=REMOTE) as anonymous:
        assert anonymous.get("/healthz").json() == {"status": "ok", "open_mode": False}


def test_no_key_gets_the_login_form_or_401_json(home: PageHome) -> None:
    with TestClient(home.app(), client=REMOTE) as anonymous:
        page = anonymous.get("/lines/legal")
        assert page.status_code == 401
        assert 'name="key"' in page.text
        api = anonymous.get("/api/lines/legal/overview")
        assert api.status_code == 401
        assert "API key" in api.json()["error"]
        wrong = anonymous.get("/api/lines", headers={"Authorization": "Bearer fw-nope"})
        assert wrong.status_code == 401


def test_a_key_sees_only_its_lines(home: PageHome) -> None:
    with TestClient(home.app(), client=REMOTE, headers=home.bearer("support")) as support:
        assert support.get("/api/lines").json() == {
            "viewer": "support",
            "lines": ["customer_service"],
        }
        refused = support.get("/api/lines/legal/overview")
        assert refused.status_code == 403
        assert "may not see 'legal'" in refused.json()["error"]
        assert support.get("/lines/legal/samples").status_code == 403
        assert support.get("/lines/legal/export.csv").status_code == 403
        page = support.get("/lines/customer_service")
        assert page.status_code == 200
        assert 'data-line="legal"' not in page.text  # the switcher lists its lines only
        home_page = support.get("/", follow_redirects=False)
        assert home_page.headers["location"] == "/lines/customer_service"


def test_a_huge_login_body_is_refused_unread(home: PageHome) -> None:
    with TestClient(home.app(), client=REMOTE) as browser:
        declared = browser.post("/login", content=b"key=" + b"x" * 5_000_000)
        assert declared.status_code == 413

        def chunks():  # no content-length: the limit holds while reading
            for _ in range(100):
                yield b"x" * 1_000

        streamed = browser.post(
            "/login",
            content=chunks(),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert streamed.status_code == 413
        assert "over the 16384 byte limit" in streamed.text


def test_login_form_sets_a_cookie_that_opens_the_lines(home: PageHome) -> None:
    with TestClient(home.app(), client=REMOTE) as browser:
        bad = browser.post("/login", data={"key": "fw-wrong", "next": "/lines/legal"})
        assert bad.status_code == 401
        good = browser.post(
            "/login",
            data={"key": home.keys["counsel"], "next": "/lines/legal"},
            follow_redirects=False,
        )
        assert good.status_code == 303
        assert good.headers["location"] == "/lines/legal"
        assert "httponly" in good.headers["set-cookie"].lower()
        assert browser.get("/lines/legal").status_code == 200
        assert browser.get("/lines/customer_service").status_code == 403
        offsite = browser.post(
            "/login",
            data={"key": home.keys["counsel"], "next": "//evil.example"},
            follow_redirects=False,
        )
        assert offsite.headers["location"] == "/"
        browser.post("/logout")
        assert browser.get("/lines/legal").status_code == 401


def test_login_and_logout_posted_from_another_site_are_refused(home: PageHome) -> None:
    """Login CSRF: another site must not log this browser in under a key of its choosing."""
    login = {"key": home.keys["counsel"], "next": "/lines/legal"}
    with TestClient(home.app(), client=REMOTE) as browser:
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null", "Sec-Fetch-Site": "cross-site"},  # a sandboxed frame
            {"Sec-Fetch-Site": "same-site"},
        ):
            refused = browser.post("/login", data=login, headers=headers, follow_redirects=False)
            assert refused.status_code == 403, headers
            assert "set-cookie" not in refused.headers
            assert browser.get("/lines/legal").status_code == 401
        # The page's own form: its origin, or null under its no-referrer policy.
        for headers in (
            {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"},
            {"Origin": "null", "Sec-Fetch-Site": "same-origin"},
        ):
            opened = browser.post("/login", data=login, headers=headers, follow_redirects=False)
            assert opened.status_code == 303, headers
        assert browser.get("/lines/legal").status_code == 200
        elsewhere = browser.post("/logout", headers={"Origin": "http://evil.example"})
        assert elsewhere.status_code == 403
        assert browser.get("/lines/legal").status_code == 200


def test_a_client_that_keeps_trying_keys_gets_429_with_retry_after(home: PageHome) -> None:
    guesser, neighbour = ("10.9.9.9", 40000), ("10.9.9.10", 40000)
    app = home.app(failed_key_checks=10, failed_key_window_s=60)
    with TestClient(app, client=guesser) as browser, TestClient(app, client=neighbour) as other:
        logged_in = browser.post("/login", data={"key": home.keys["counsel"]})
        assert logged_in.status_code == 200  # followed to the first line
        statuses = [
            browser.post("/login", data={"key": f"fw-guess-{n}"}).status_code for n in range(40)
        ]
        assert statuses == [401] * 10 + [429] * 30
        refused = browser.post("/login", data={"key": home.keys["support"]})
        assert refused.status_code == 429  # refused before the key is looked at
        assert 1 <= int(refused.headers["retry-after"]) <= 6
        bearer = browser.get("/api/lines", headers={"Authorization": "Bearer fw-guess"})
        assert bearer.status_code == 429
        assert bearer.headers["retry-after"]
        # Its session is no key check: it still reads its line.
        assert browser.get("/lines/legal").status_code == 200
        # Another client is not held back by this one.
        assert other.post("/login", data={"key": "fw-typo"}).status_code == 401
        assert other.get("/api/lines", headers=home.bearer("support")).status_code == 200


def test_failed_key_checks_are_kept_per_client_in_bounded_memory() -> None:
    now = [0.0]
    attempts = FailedKeyAttempts(3, 30, capacity=100, clock=lambda: now[0])
    for _ in range(3):
        assert attempts.retry_after("a") is None
        attempts.failed("a")
    assert attempts.retry_after("a") == 10
    assert attempts.retry_after("b") is None
    now[0] = 10.0
    assert attempts.retry_after("a") is None  # one more try earned
    attempts.failed("a")
    assert attempts.retry_after("a") == 10
    for n in range(10_000):
        attempts.failed(f"client-{n}")
    assert len(attempts) == 100
    # An IPv6 client is its /64; an IPv4-mapped one is its IPv4 address.
    assert client_of("2001:db8::1") == client_of("2001:db8::ffff:2") == "2001:db8::/64"
    assert client_of("::ffff:10.0.0.1") == "10.0.0.1"


def test_without_a_key_file_the_page_is_open_on_loopback_only(tmp_path: Path) -> None:
    bare = build_page_home(tmp_path / "home", requests=30, with_dataset=False, with_keys=False)
    try:
        app = bare.app()
        with TestClient(app, client=LOOPBACK) as local:
            assert local.get("/healthz").json()["open_mode"] is True
            assert local.get("/lines/medical").status_code == 200
        with TestClient(app, client=REMOTE) as remote:
            refused = remote.get("/api/lines")
            assert refused.status_code == 403
            assert "flywheel gateway add-key" in refused.json()["error"]
    finally:
        bare.store.close()


# --- views --------------------------------------------------------------------------------------


def test_overview_plots_signals_per_adapter_and_shows_routing(client: TestClient) -> None:
    page = client.get("/lines/medical")
    assert page.status_code == 200
    text = page.text
    assert text.count("<svg") >= 9  # requests + one rate plot per signal + funnel or not
    for adapter in ("medical-v1", "medical-v2", "medical-v3"):
        assert adapter in text
    assert "canary" in text
    assert "20.0% of users" in text
    assert 'id="canary"' in text
    assert "<script" not in text
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_overview_shows_the_canary_flows_latest_checks(home: PageHome) -> None:
    """Refusals, output length, TTFT and TPOT of the latest look are on the page and in
    the JSON; a look at another adapter is not shown as this canary's."""
    from datetime import UTC, datetime

    from registry.canary import ArmStats, CanaryPolicy, decide_canary
    from registry.decisions import record_decision

    line = "legal"
    canary = f"{line}-v3"
    quick, sluggish = tuple(150.0 + i / 8 for i in range(400)), tuple(900.0 + i for i in range(400))
    champion = ArmStats(None, 400, refusal=4, p99_ttft_ms=200.0, p50_tpot_ms=30.0,
                        answered=400, output_tokens_mean=80.0, output_tokens_sd=20.0,
                        ttft_samples_ms=quick, tpot_samples_ms=(30.0,) * 400)  # fmt: skip
    slow = ArmStats(None, 400, refusal=40, p99_ttft_ms=900.0, p50_tpot_ms=31.0,
                    answered=400, output_tokens_mean=82.0, output_tokens_sd=20.0,
                    ttft_samples_ms=sluggish, tpot_samples_ms=(31.0,) * 400)  # fmt: skip
    decision = decide_canary(champion, slow, CanaryPolicy(), look=1)
    checks = [
        {"metric": c.metric, "champion": c.champion, "canary": c.canary, "verdict": c.verdict,
         "worse_p": c.worse_p, "non_inferior_p": c.non_inferior_p}
        for c in decision.checks
    ]  # fmt: skip
    for adapter, rows in ((f"{line}-v9", [{"metric": "other_adapter_metric"}]), (canary, checks)):
        record_decision(
            home.store.engine, business_line=line, adapter=adapter, fraction=0.2, look=1,
            action=decision.action.value, reasons="; ".join(decision.reasons),
            numbers={"checks": rows}, actor="test", when=datetime.now(UTC),
        )  # fmt: skip
    with TestClient(home.app(), client=REMOTE, headers=home.bearer("admin")) as session:
        text = session.get(f"/lines/{line}").text
        data = session.get(f"/api/lines/{line}/overview").json()
    assert 'id="canary-checks"' in text
    for metric in ("refusal_rate", "p99_ttft_ms", "p50_tpot_ms", "mean_output_tokens"):
        assert f'title="{metric}"' in text
    checks = text[
        text.index('id="canary-checks"') : text.index("</table>", text.index("canary-checks"))
    ]
    for words in (
        "refusal rate",
        "time to first token",
        "mean answer length",
        "sure the canary is worse",
    ):
        assert words in checks
    assert "<td>1.0%</td><td>10.0%</td>" in checks  # the refusal rates, in percent
    assert "p non-inferior" not in checks
    assert "other_adapter_metric" not in text
    shown = {c["metric"]: c["verdict"] for c in data["canary"]["checks"]}
    assert shown["refusal_rate"] == "WORSE"
    assert shown["p99_ttft_ms"] == "WORSE"


def test_overview_api_counts_match_the_store(home: PageHome, client: TestClient) -> None:
    body = client.get("/api/lines/legal/overview").json()
    totals = {row["adapter"]: row for row in body["totals"]}
    assert totals["all"]["requests"] == _count(home, "legal")
    f = feedback_table.c
    with home.store.engine.connect() as connection:
        edits = connection.execute(
            select(func.count()).where(f.business_line == "legal", f.type == "edit")
        ).scalar_one()
    assert totals["all"]["counts"]["edit"] == edits
    assert body["routing"] == {
        "business_line": "legal",
        "champion": "legal-v2",
        "canary": "legal-v3",
        "canary_fraction": 0.2,
        "previous": "legal-v1",
        "shadow": None,
        "shadow_fraction": 0.0,
        "replicas": None,
        "experiment": None,
    }
    assert body["canary"]["canary_requests"] == totals["legal-v3"]["requests"]
    assert body["funnel"]["steps"][0]["step"] == "raw"


def test_buckets_command_prints_the_page_numbers(home: PageHome, client: TestClient) -> None:
    from cli.main import app

    runner = CliRunner()
    env = {
        "FLYWHEEL_HOME": str(home.settings.home),
        "FLYWHEEL_DATABASE_URL": home.settings.resolved_database_url,
        "COLUMNS": "200",
    }
    query = {"since": "2026-11-02", "until": "2026-11-03", "adapter": "legal-v2"}
    args = ["buckets", "--line", "legal", "--json"]
    args += [item for key, value in query.items() for item in (f"--{key}", value)]
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    (printed,) = json.loads(result.stdout)
    shown = client.get("/api/lines/legal/overview", params=query).json()
    assert printed["totals"] == shown["totals"]
    assert (printed["since"], printed["until"]) == (shown["since"], shown["until"])
    assert printed["funnel"]["steps"] == [
        [s["step"], s["records"]] for s in shown["funnel"]["steps"]
    ]
    table = runner.invoke(app, ["buckets", "--line", "legal"], env=env)
    assert "legal-v3" in table.stdout
    assert "in training data" in table.stdout


def test_a_rebuilt_rollup_counts_the_same(home: PageHome) -> None:
    from cli.main import app

    runner = CliRunner()
    env = {
        "FLYWHEEL_HOME": str(home.settings.home),
        "FLYWHEEL_DATABASE_URL": home.settings.resolved_database_url,
    }
    before = runner.invoke(app, ["buckets", "--json"], env=env)
    assert before.exit_code == 0, before.output
    rebuilt = runner.invoke(app, ["db", "rebuild-rollup"], env=env)
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "rollup rebuilt" in rebuilt.stdout
    after = runner.invoke(app, ["buckets", "--json"], env=env)
    assert json.loads(after.stdout) == json.loads(before.stdout)


def test_pages_walk_a_bucket_once_newest_first(home: PageHome, client: TestClient) -> None:
    seen: list[str] = []
    times: list[str] = []
    cursor = None
    while True:
        params = {"adapter": "medical-v2"} | ({"cursor": cursor} if cursor else {})
        body = client.get("/api/lines/medical/samples", params=params).json()
        seen += [s["request_id"] for s in body["samples"]]
        times += [s["created_at"] for s in body["samples"]]
        assert all(s["adapter"] == "medical-v2" for s in body["samples"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert (
        len(seen)
        == len(set(seen))
        == _count(home, "medical", interactions_table.c.adapter_name == "medical-v2")
    )
    assert times == sorted(times, reverse=True)
    assert body["approximate_total"] == len(seen)


def test_signal_and_time_filters(client: TestClient) -> None:
    edits = client.get("/api/lines/customer_service/samples", params={"signal": "edit"}).json()
    assert edits["samples"]
    assert all("edit" in s["signals"] and s["edit"] for s in edits["samples"])
    quiet = client.get("/api/lines/customer_service/samples", params={"signal": "none"}).json()
    assert all(s["signals"] == [] for s in quiet["samples"])
    day = client.get(
        "/api/lines/customer_service/samples", params={"since": "2026-11-02", "until": "2026-11-02"}
    ).json()
    assert day["samples"]
    assert all(s["created_at"].startswith("2026-11-02") for s in day["samples"])
    html = client.get("/lines/customer_service/samples", params={"signal": "thumbs_down"})
    assert html.status_code == 200
    assert 'value="thumbs_down" selected' in html.text


def test_a_sample_with_an_edit_shows_a_diff_and_its_training_use(
    home: PageHome, client: TestClient
) -> None:
    from dashboard.lineage import DatasetIndex

    uses = DatasetIndex(home.settings.datasets_dir).builds(TRAINED_LINE)[0].uses
    edits = client.get(f"/api/lines/{TRAINED_LINE}/samples", params={"signal": "edit"}).json()
    used = [s for s in edits["samples"] if s["request_id"] in uses]
    assert used, "some edited answer should have become a training example"
    request_id = used[0]["request_id"]
    page = client.get(f"/lines/{TRAINED_LINE}/samples/{request_id}")
    assert page.status_code == 200
    assert 'id="edit-diff"' in page.text
    assert "<del>" in page.text
    assert "<ins>" in page.text
    assert 'id="training"' in page.text
    assert "sft" in page.text or "dpo" in page.text
    api = client.get(f"/api/lines/{TRAINED_LINE}/samples/{request_id}").json()
    assert {seg["op"] for seg in api["diff"]} >= {"removed", "added"}
    assert api["training"]
    assert client.get(f"/lines/{TRAINED_LINE}/samples/no-such-id").status_code == 404


def test_funnel_page_explains_the_drops(client: TestClient) -> None:
    page = client.get(f"/lines/{TRAINED_LINE}/funnel")
    assert page.status_code == 200
    for words in ("raw", "scrubbed + filtered", "deduplicated", "in training data"):
        assert words in page.text
    assert "duplicate cluster" in page.text or "filter:" in page.text
    empty = client.get("/lines/medical/funnel")
    assert "no dataset built" in empty.text


def test_exports_are_the_filtered_bucket(home: PageHome, client: TestClient) -> None:
    params = {"signal": "thumbs_down"}
    rows = list(
        csv.DictReader(io.StringIO(client.get("/lines/legal/export.csv", params=params).text))
    )
    assert rows
    assert all("thumbs_down" in row["signals"].split("|") for row in rows)
    lines = client.get("/lines/legal/export.jsonl", params=params).text.splitlines()
    assert [json.loads(line)["request_id"] for line in lines] == [r["request_id"] for r in rows]
    capped = TestClient(home.app(export_limit=5), client=REMOTE, headers=home.bearer("admin"))
    with capped:
        assert len(capped.get("/lines/legal/export.jsonl").text.splitlines()) == 5


@pytest.mark.parametrize(
    ("url", "status", "words"),
    [
        ("/lines/legal?since=last-week", 400, "bad 'since'"),
        ("/lines/legal/samples?signal=smile", 400, "bad 'signal'"),
        ("/lines/legal/samples?cursor=%%%", 400, "bad 'cursor'"),
        ("/api/lines/legal/samples?since=2026-11-03&until=2026-11-01", 400, "bad time range"),
        ("/lines/atlantis", 404, "unknown business line"),
        ("/api/lines/atlantis/overview", 404, "unknown business line"),
        ("/lines/legal/export.xml", 404, "no export as 'xml'"),
        ("/lines/legal/evals?run=nope", 404, "no run 'nope'"),
        ("/nowhere", 404, "Not Found"),
    ],
)
def test_bad_requests_get_a_reason_not_a_trace(
    client: TestClient, url: str, status: int, words: str
) -> None:
    answer = client.get(url)
    assert answer.status_code == status
    assert words in html.unescape(answer.text)
    assert "Traceback" not in answer.text


def test_request_ids_with_slashes_and_a_foreign_back_link(tmp_path: Path) -> None:
    bare = build_page_home(tmp_path / "home", requests=10, with_dataset=False, with_keys=False)
    odd = "team/a+b@1"
    bare.store.ingest(
        [
            {
                "type": "interaction",
                "request_id": odd,
                "business_line": "legal",
                "base_model": "m",
                "messages": [{"role": "user", "content": "Can I break my lease early?"}],
                "response": "Usually, with notice.",
                "created_at": "2026-11-02T10:00:00Z",
            }
        ],
        source="test",
    )
    try:
        with TestClient(bare.app(), client=LOOPBACK) as local:
            listing = local.get("/lines/legal/samples")
            assert "/samples/team/a%2Bb%401" in listing.text
            page = local.get("/lines/legal/samples/team/a%2Bb%401?back=javascript:alert(1)")
            assert page.status_code == 200
            assert "Can I break my lease early?" in page.text
            assert "javascript:" not in page.text
            assert local.get(f"/api/lines/legal/samples/{odd}").json()["request_id"] == odd
    finally:
        bare.store.close()
