"""The feedback page as a product team reads it: a trend over the data's own span, rates
that are shares, one count per thing, a funnel for every build, an edit beside its
answer, tabs that lead somewhere, and times written for people."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from dashboard.diffs import side_by_side
from dashboard.plots import line_chart
from dashboard.shaping import human_span, human_time
from feedback.datasets import accumulate, line_builds
from feedback.reviews import ReviewPolicy
from feedback.rollup import RollupQuery, SignalRollup
from feedback.store import FeedbackStore
from flywheel.settings import load_settings
from gateway.keys import add_key
from tests.dashboard_store import TRAINED_LINE, PageHome, build_page_home

REMOTE = ("10.1.2.3", 40000)
LOOPBACK = ("127.0.0.1", 40000)
RAW_ISO = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}")
BURST = datetime(2026, 12, 4, 9, 25, tzinfo=UTC)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PageHome]:
    built = build_page_home(tmp_path_factory.mktemp("trend") / "home", requests=150)
    root = built.settings.datasets_dir
    accumulate(
        root, TRAINED_LINE, line_builds(root, TRAINED_LINE), horizon_days=30, half_life_days=7
    )
    built.keys["cs-reviewer"] = add_key(
        built.settings.home / "gateway-keys.yaml",
        "cs-reviewer",
        ["customer_service"],
        ["customer_service"],
    )
    yield built
    built.store.close()


@pytest.fixture(scope="module")
def client(home: PageHome) -> Iterator[TestClient]:
    with TestClient(home.app(), client=REMOTE, headers=home.bearer("admin")) as session:
        yield session


def _interaction(request_id: str, line: str, when: datetime) -> dict[str, Any]:
    return {
        "type": "interaction",
        "request_id": request_id,
        "user_id": f"user-{request_id}",
        "business_line": line,
        "adapter_name": None,
        "base_model": "tiny-base",
        "messages": [{"role": "user", "content": f"Question {request_id}?"}],
        "response": "An answer.",
        "created_at": when.isoformat(),
    }


def _votes(request_id: str, kind: str, n: int, when: datetime) -> list[dict[str, Any]]:
    """``n`` votes on one answer, as an OpenAssistant reply carries its annotators'."""
    return [
        {
            "type": kind,
            "request_id": request_id,
            "idempotency_key": f"{request_id}:{kind}:{i}",
            "created_at": (when + timedelta(seconds=i + 1)).isoformat(),
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def burst(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """One hour of traffic on a configured line (as after the demo, beside an old imported
    record) and an imported line that is not configured, each answer with several votes."""
    home = tmp_path_factory.mktemp("burst") / "home"
    settings = load_settings(
        home=home,
        database_url=f"sqlite:///{home / 'flywheel.db'}",
        business_lines=("customer_service",),
    )
    store = FeedbackStore.open(settings)
    # An old import on the same line: the window still follows the recent traffic.
    records = [_interaction("imported-0", "customer_service", datetime(2023, 3, 24, tzinfo=UTC))]
    for n in range(120):
        when = BURST + timedelta(seconds=30 * n)
        records.append(_interaction(f"cs-{n}", "customer_service", when))
        if n % 3 == 0:
            records += _votes(f"cs-{n}", "thumbs_down", 1, when)
    for n in range(10):
        when = BURST + timedelta(minutes=5 * n)
        records.append(_interaction(f"oasst-{n}", "general", when))
        records += _votes(f"oasst-{n}", "thumbs_up", 6, when)
    report = store.ingest(records, source="test")
    assert report.quarantined == 0, report.rejections
    page = PageHome(settings, store, [], {})
    with TestClient(page.app(), client=LOOPBACK) as session:
        yield session
    store.close()


# --- the window follows the data ---------------------------------------------------------------


def test_an_hour_of_traffic_plots_as_a_trend_of_a_few_dozen_points(burst: TestClient) -> None:
    view = burst.get("/api/lines/customer_service/overview").json()
    starts = view["series"]["starts"]
    assert view["series"]["bucket_seconds"] < 3600
    assert 12 <= len(starts) <= 60
    served = view["series"]["counts"]["base"]["requests"]
    assert sum(served) == 120
    assert sum(1 for n in served if n) >= 10, "the hour's traffic spreads over many points"
    page = burst.get("/lines/customer_service")
    assert "5 min per point" in page.text or "2 min per point" in page.text


def test_days_of_traffic_plot_as_a_few_dozen_points(client: TestClient) -> None:
    view = client.get(f"/api/lines/{TRAINED_LINE}/overview").json()
    assert 12 <= len(view["series"]["starts"]) <= 60
    assert human_span(timedelta(minutes=5)) == "5 min"
    assert human_span(timedelta(hours=3)) == "3 h"
    assert human_span(timedelta(days=7)) == "7 days"


def test_a_short_series_marks_each_point() -> None:
    starts = [BURST + timedelta(minutes=5 * i) for i in range(6)]
    chart = line_chart("requests", starts, timedelta(minutes=5), {"base": [1, 2, None, 4, 5, 6]})
    assert chart.count("<circle") == 5
    assert "4 Dec 09:25" in chart


# --- rates are shares ---------------------------------------------------------------------------


def test_a_rate_is_a_share_of_requests_however_many_votes_an_answer_has(
    burst: TestClient,
) -> None:
    view = burst.get("/api/lines/general/overview").json()
    (totals,) = view["totals"]
    assert totals["requests"] == 10
    assert totals["counts"]["thumbs_up"] == 10
    assert totals["rates"]["thumbs_up"] == 1.0
    page = burst.get("/lines/general")
    percents = [float(p) for p in re.findall(r"(\d+(?:\.\d+)?)%", page.text)]
    assert percents
    assert max(percents) <= 100


def test_a_line_that_is_not_configured_says_so(burst: TestClient) -> None:
    assert burst.get("/api/lines/general/overview").json()["configured"] is False
    assert 'id="unconfigured"' in burst.get("/lines/general").text
    assert burst.get("/api/lines/customer_service/overview").json()["configured"] is True
    assert 'id="unconfigured"' not in burst.get("/lines/customer_service").text


# --- counts -------------------------------------------------------------------------------------


def test_the_funnel_says_its_count_is_of_its_own_window(client: TestClient) -> None:
    page = client.get(f"/lines/{TRAINED_LINE}").text
    assert 'id="range"' in page
    assert 'id="funnel-count"' in page
    assert "not the requests of the range above" in page
    assert "pulled for window build" in page  # the newest build is accumulated


# --- a funnel for every build -------------------------------------------------------------------


def test_every_dataset_build_has_a_funnel(client: TestClient) -> None:
    builds = client.get(f"/api/lines/{TRAINED_LINE}/funnel").json()["builds"]
    assert len(builds) == 2
    newest, window = builds
    assert newest["accumulated_from"] == [window["dataset"]]
    assert newest["funnel_of"] == window["dataset"]
    assert all(b["steps"] for b in builds), [b["dataset"] for b in builds if not b["steps"]]
    overview = client.get(f"/lines/{TRAINED_LINE}").text
    assert "accumulated from 1 build" in overview
    assert "scrubbed + filtered" in overview
    funnel = client.get(f"/lines/{TRAINED_LINE}/funnel").text
    assert "accumulated from 1 build" in funnel


def test_buckets_prints_the_funnel_of_an_accumulated_build(home: PageHome) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    env = {
        "FLYWHEEL_HOME": str(home.settings.home),
        "FLYWHEEL_DATABASE_URL": home.settings.resolved_database_url,
        "COLUMNS": "200",
    }
    printed = CliRunner().invoke(app, ["buckets", "--line", TRAINED_LINE], env=env)
    assert printed.exit_code == 0, printed.output
    assert "accumulated from 1 build" in printed.stdout
    assert "in training data" in printed.stdout


# --- the edit beside the answer -----------------------------------------------------------------


def test_the_diff_columns_read_back_as_the_answer_and_the_edit() -> None:
    answer, edit = "Book an appointment at the desk.", "Check the leaflet at the desk."
    before, after = side_by_side(answer, edit)
    assert "".join(s.text for s in before) == answer
    assert "".join(s.text for s in after) == edit
    assert {s.op for s in before} == {"same", "removed"}
    assert {s.op for s in after} == {"same", "added"}


def _column(page: str, name: str) -> str:
    found = re.search(rf'<pre class="diff" id="{name}">(.*?)</pre>', page, re.S)
    assert found, name
    return found.group(1)


def test_a_sample_shows_the_answer_and_the_edit_side_by_side(client: TestClient) -> None:
    edits = client.get(f"/api/lines/{TRAINED_LINE}/samples", params={"signal": "edit"}).json()
    sample = next(s for s in edits["samples"] if s["edit"] and s["edit"] != s["response"])
    page = client.get(f"/lines/{TRAINED_LINE}/samples/{sample['request_id']}").text
    original, edited = _column(page, "edit-original"), _column(page, "edit-edited")
    assert "<ins>" not in original
    assert "<del>" not in edited
    assert html.unescape(re.sub(r"<[^>]+>", "", original)) == sample["response"]
    assert html.unescape(re.sub(r"<[^>]+>", "", edited)) == sample["edit"]


# --- tabs ---------------------------------------------------------------------------------------


def _tabs(page: str) -> list[str]:
    nav = re.search(r'<nav class="tabs"[^>]*>(.*?)</nav>', page, re.S)
    assert nav
    return re.findall(r'href="([^"]+)"', nav.group(1))


def test_every_tab_leads_to_a_page(home: PageHome) -> None:
    with TestClient(home.app(), client=REMOTE, headers=home.bearer("cs-reviewer")) as session:
        tabs = _tabs(session.get("/lines/customer_service").text)
        assert tabs
        for href in tabs:
            assert session.get(href).status_code == 200, href
        assert "/lines/customer_service/review" not in tabs


def test_the_review_tab_shows_where_the_line_has_a_queue(home: PageHome) -> None:
    from dashboard.app import create_app
    from flywheel.settings.dashboard import DashboardSettings
    from registry.routes import RouteStore
    from tests.dashboard_store import shared_scrubber

    app = create_app(
        home.settings,
        DashboardSettings(rollup_grace_s=0, rollup_interval_s=0),
        store=home.store,
        routes=RouteStore(home.store.engine),
        keys_file=home.settings.home / "gateway-keys.yaml",
        scrubber_factory=shared_scrubber,
        review_policy_of=lambda line: (
            ReviewPolicy(rubric=("correct", "wrong")) if line == "customer_service" else None
        ),
    )
    with TestClient(app, client=REMOTE, headers=home.bearer("cs-reviewer")) as session:
        assert "/lines/customer_service/review" in _tabs(
            session.get("/lines/customer_service").text
        )


# --- times --------------------------------------------------------------------------------------


def test_times_read_as_people_write_them() -> None:
    moment = datetime(2026, 12, 4, 9, 25, 4, 141601, tzinfo=UTC)
    assert human_time(moment) == "4 Dec 2026, 09:25 UTC"
    assert human_time("2026-12-04T09:25:04.141601Z") == "4 Dec 2026, 09:25 UTC"
    assert human_time(None) == ""


def test_no_page_prints_a_raw_timestamp(client: TestClient) -> None:
    edits = client.get(f"/api/lines/{TRAINED_LINE}/samples", params={"signal": "edit"}).json()
    pages = [
        f"/lines/{TRAINED_LINE}",
        f"/lines/{TRAINED_LINE}/funnel",
        f"/lines/{TRAINED_LINE}/samples",
        *(f"/lines/{TRAINED_LINE}/samples/{s['request_id']}" for s in edits["samples"][:3]),
    ]
    for path in pages:
        text = client.get(path).text
        shown = re.sub(r'(href|action|id)="[^"]*"', "", text)
        assert not RAW_ISO.search(shown), (path, RAW_ISO.findall(shown)[:3])


def test_the_rollup_counts_a_request_once_per_signal_folded_or_live(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path, database_url=f"sqlite:///{tmp_path / 'f.db'}")
    store = FeedbackStore.open(settings)
    try:
        first = [_interaction("r-1", "legal", BURST), *_votes("r-1", "thumbs_up", 3, BURST)]
        store.ingest(first, source="test")
        SignalRollup(store.engine, grace=timedelta(0)).counts(RollupQuery("legal"))  # folds
        later = [_interaction("r-2", "legal", BURST), *_votes("r-2", "thumbs_up", 2, BURST)]
        again = _votes("r-1", "thumbs_up", 2, BURST + timedelta(minutes=1))
        for vote in again:
            vote["idempotency_key"] += ":again"
        store.ingest([*later, *again], source="test")
        for grace in (timedelta(days=1), timedelta(0)):  # the live tail, then folded
            cells = SignalRollup(store.engine, grace=grace).counts(RollupQuery("legal"))
            counts = {c.signal: c.count for c in cells}
            assert counts == {"requests": 2, "thumbs_up": 2}, grace
    finally:
        store.close()
