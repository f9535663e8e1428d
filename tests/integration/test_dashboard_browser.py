"""The feedback page in a real browser: Debian's headless Chromium driven by Playwright.

Loads the page on a generated store served by uvicorn, logs in with a gateway key,
switches business line, filters the samples, opens one with an edit diff, and saves
a screenshot of each step (under the test's tmp dir, copied to
``bench/results/dashboard/``). The browser may fetch nothing but this server.
Skips without ``/usr/bin/chromium`` unless ``FLYWHEEL_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, services_required
from tests.dashboard_store import PageHome, build_page_home
from tests.pg_instance import free_port
from tests.servers import serving

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
RESULTS = REPO / "bench" / "results" / "dashboard"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        if services_required():
            pytest.fail(f"{CHROMIUM} is missing (apt-get install chromium)")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if services_required():
            raise
        pytest.skip("the playwright package is not installed (pip install -e '.[dev]')")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PageHome, str]]:
    home = build_page_home(tmp_path_factory.mktemp("browser") / "home", requests=300)
    with serving(home.app(page_size=25), free_port()) as url:
        yield home, url
    home.store.close()


def test_log_in_switch_line_filter_and_open_an_edit(
    browser: Any, site: tuple[PageHome, str], tmp_path: Path
) -> None:
    home, url = site
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    outside: list[str] = []

    def only_this_server(route: Any) -> None:
        if route.request.url.startswith(url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_this_server)
    page = context.new_page()
    shots: list[Path] = []

    def shot(name: str) -> None:
        path = tmp_path / f"{len(shots) + 1:02d}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        shots.append(path)

    page.goto(f"{url}/lines/legal")
    assert page.locator("input[name=key]").is_visible()  # not logged in yet
    shot("login")
    page.fill("input[name=key]", home.keys["counsel"])
    page.click("form.login button[type=submit]")
    page.wait_for_url(f"{url}/lines/legal")
    assert page.locator("h1").inner_text() == "legal"
    assert page.locator("svg.chart").count() >= 9
    assert page.locator("#routing").inner_text().count("legal-v") >= 2
    assert page.locator("#canary").is_visible()
    lines = page.locator("nav.lines a").all_inner_texts()
    assert lines == ["legal", "medical"]  # this key's lines only
    shot("overview-legal")

    page.click("nav.lines a[data-line=medical]")
    page.wait_for_url(f"{url}/lines/medical")
    assert page.locator("h1").inner_text() == "medical"
    assert "medical-v3" in page.locator("#totals").inner_text()
    shot("overview-medical")

    page.click("nav.tabs a:has-text('samples')")
    page.wait_for_url(f"{url}/lines/medical/samples")
    assert page.locator("#samples tbody tr").count() == 25
    page.select_option("select[name=signal]", "edit")
    page.select_option("select[name=adapter]", "medical-v1")
    page.click("#filters button[type=submit]")
    page.wait_for_url("**/lines/medical/samples?*signal=edit*")
    rows = page.locator("#samples tbody tr")
    assert rows.count() >= 1
    for row in rows.all():
        assert "edit" in row.locator("td").nth(2).inner_text()
        assert row.locator("td").nth(1).inner_text() == "medical-v1"
    shot("samples-medical-edits")

    # One English and one Chinese sample (.ci/run installs Debian's fonts-noto-cjk, so the
    # Chinese screenshot shows characters, not boxes).
    fonts = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True, check=False)
    assert fonts.stdout.strip(), "no CJK font: install fonts-noto-cjk (.ci/run does)"
    texts = [r.locator("td").nth(3).inner_text() for r in rows.all()]
    english = [i for i, text in enumerate(texts) if text.isascii()]
    chinese = [i for i, text in enumerate(texts) if any("\u4e00" <= c <= "\u9fff" for c in text)]
    assert english, texts
    assert chinese, texts
    for name, found in (("sample-edit-diff", english), ("sample-edit-diff-chinese", chinese)):
        rows.nth(found[0]).locator("a.open").click()
        page.wait_for_url("**/lines/medical/samples/*")
        diff = page.locator("#edit-diff")
        assert diff.is_visible()
        assert diff.locator("del").count() + diff.locator("ins").count() >= 1
        shot(name)
        page.click("text=← back to the samples")
        page.wait_for_url("**/lines/medical/samples?*signal=edit*")
        rows = page.locator("#samples tbody tr")
    assert outside == [], f"the page fetched from elsewhere: {outside}"
    context.close()

    RESULTS.mkdir(parents=True, exist_ok=True)
    for path in shots:
        assert path.stat().st_size > 10_000
        shutil.copy(path, RESULTS / path.name)
