"""The feedback page in a real browser: Debian's headless Chromium driven by Playwright.

Loads the page on a generated store served by uvicorn, logs in with a gateway key,
switches business line, filters the samples, opens one with an edit diff, and saves
a screenshot of each step. A second test seeds a store the way a demo leaves one (a
week of traffic on three lines, a dataset build, a trained candidate judged by the
gate in MLflow, the canary flow's look) and photographs what a person sees: the
trend, the funnel, an edit, the eval review, the canary's decision in words.
Screenshots go to ``$FLYWHEEL_SCREENSHOTS`` when set (docs/screenshots/ was taken so),
else under the test's tmp dir. The browser may fetch nothing but this server.
Skips without ``/usr/bin/chromium`` unless ``FLYWHEEL_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import services_required
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
# Where the screenshots go (a folder; unset: each test's tmp dir).
SCREENSHOTS = "FLYWHEEL_SCREENSHOTS"
VIEWPORT = {"width": 1280, "height": 800}


def screenshot_dir(tmp_path: Path) -> Path:
    """``$FLYWHEEL_SCREENSHOTS`` (created), else ``tmp_path``."""
    chosen = os.environ.get(SCREENSHOTS)
    folder = Path(chosen) if chosen else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def only_from(url: str, context: Any) -> list[str]:
    """Let ``context`` fetch from ``url`` alone; the list collects what it tried elsewhere."""
    outside: list[str] = []

    def only_this_server(route: Any) -> None:
        if route.request.url.startswith(url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_this_server)
    return outside


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
    outside = only_from(url, context)
    page = context.new_page()
    shots: list[Path] = []
    folder = screenshot_dir(tmp_path)

    def shot(name: str) -> None:
        path = folder / f"walk-{len(shots) + 1:02d}-{name}.png"
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
    for path in shots:
        assert path.stat().st_size > 10_000


# --- the page after a demo, photographed ----------------------------------------------------

DEMO_LINE = "legal"


def _eval_report(model: str, wins: int, pairs: int, answer: str) -> Any:
    from eval.reports import EvalReport, GenerationSample

    return EvalReport(
        model=model,
        pairs=pairs,
        preference_accuracy=wins / pairs,
        mean_margin=(wins / pairs - 0.5) / 5,
        preferred_loss=1.4,
        general_loss=2.0,
        refusal_rate=0.02,
        mean_answer_length=48.0,
        pii_in_generations=0,
        canaries_in_generations=0,
        samples=(
            GenerationSample(
                prompt="Can my landlord keep the deposit for normal wear and tear?",
                answer=answer,
                refused=False,
            ),
        ),
        pair_wins=tuple(i < wins for i in range(pairs)),
    )


def _judged_candidate(home: PageHome, root: Path) -> None:
    """A night's candidate on the demo line, evaluated and judged by the real gate in MLflow
    (the champion's answers on the same 60 held-out pairs)."""
    from composition.recipes import Recipe, start_training_run
    from eval.gate import GatePolicy, decide_promotion
    from registry.tracking import Registry

    registry = Registry.for_home(home.settings.home)
    recipe = Recipe(business_line=DEMO_LINE, method="dpo", max_steps=40)
    manifest = root / "dataset" / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"business_line": DEMO_LINE, "content_hash": "e" * 64}))
    run_id = start_training_run(registry, recipe, "e" * 64, manifest, "base", "abc1234")
    candidate = _eval_report(
        f"{DEMO_LINE}-dpo-eeeeeeee",
        45,
        60,
        "Not for normal wear and tear: the deposit covers damage beyond ordinary use. Ask "
        "for an itemised list of deductions within the period your lease names.",
    )
    champion = _eval_report(
        "champion", 33, 60, "Landlords can keep deposits in some cases. Check your lease."
    )
    decision = decide_promotion(candidate, champion, GatePolicy(), base_general_loss=2.0)
    registry.log_evaluation(run_id, candidate, champion, decision)
    registry.finish_run(run_id)


def _canary_look(home: PageHome) -> None:
    """The canary flow's look at the line's canary, decided and recorded as the flow does."""
    from feedback.online import adapter_windows
    from registry.canary import CanaryPolicy, _arm, decide_canary
    from registry.decisions import record_decision
    from registry.routes import RouteStore

    table = RouteStore(home.store.engine).table(DEMO_LINE)
    assert table.canary is not None
    adapters = [table.champion, table.canary]
    since = datetime(2000, 1, 1, tzinfo=UTC)
    windows = adapter_windows(
        home.store.engine, DEMO_LINE, adapters, since, datetime.now(UTC) + timedelta(days=1)
    )
    champion, canary = _arm(windows, table.champion), _arm(windows, table.canary)
    policy = CanaryPolicy(min_requests=20, max_looks=6)
    for look in (1, 2):
        decision = decide_canary(champion, canary, policy, look=look)
        record_decision(
            home.store.engine,
            business_line=DEMO_LINE,
            adapter=table.canary,
            fraction=table.canary_fraction,
            look=look,
            action=decision.action.value,
            reasons="; ".join(decision.reasons),
            numbers={"checks": [asdict(c) for c in decision.checks]},
            actor="flywheel:canary",
            when=datetime.now(UTC),
        )


@pytest.fixture(scope="module")
def demo_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PageHome, str]]:
    root = tmp_path_factory.mktemp("demo-page")
    home = build_page_home(root / "home", requests=1_500, days=7)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        _judged_candidate(home, root)
    _canary_look(home)
    with serving(home.app(page_size=25), free_port()) as url:
        yield home, url
    home.store.close()


def test_screenshots_of_the_page_a_demo_leaves(
    browser: Any, demo_site: tuple[PageHome, str], tmp_path: Path
) -> None:
    home, url = demo_site
    context = browser.new_context(viewport=VIEWPORT)
    outside = only_from(url, context)
    page = context.new_page()
    folder = screenshot_dir(tmp_path)
    shots: list[Path] = []

    def shot(name: str, scroll_to: str | None = None) -> None:
        if scroll_to is not None:
            page.locator(scroll_to).first.evaluate("element => element.scrollIntoView()")
        path = folder / f"{name}.png"
        page.screenshot(path=str(path))
        shots.append(path)

    def visit(path: str, ready: Callable[[], None] | None = None) -> None:
        page.goto(f"{url}{path}")
        page.wait_for_load_state("networkidle")
        if ready is not None:
            ready()

    visit(f"/lines/{DEMO_LINE}")
    page.fill("input[name=key]", home.keys["admin"])
    page.click("form.login button[type=submit]")
    page.wait_for_url(f"{url}/lines/{DEMO_LINE}")
    # A trend: the charts' points span the week of traffic, not one dot at the edge.
    points = page.locator("svg.chart").first.locator("circle")
    assert points.count() >= 12
    xs = [float(points.nth(i).get_attribute("cx") or 0) for i in range(points.count())]
    assert max(xs) - min(xs) > 200
    shot("overview-trend")

    checks = page.locator("#canary-checks").inner_text()
    assert "dissatisfied rate" in checks
    assert "sure the canary is worse" in checks
    text = page.locator("main").inner_text()
    for jargon in ("always-valid", "UNPROVEN", "non-inferior"):
        assert jargon not in text
    shot("overview-canary-decision", 'h3:has-text("The canary flow\'s latest look")')

    visit(f"/lines/{DEMO_LINE}/funnel")
    assert "dataset" in page.locator("main").inner_text()
    shot("funnel")

    visit(f"/lines/{DEMO_LINE}/samples?signal=edit")
    rows = page.locator("#samples tbody tr")
    assert rows.count() >= 1
    english = next(
        i for i in range(rows.count()) if rows.nth(i).locator("td").nth(3).inner_text().isascii()
    )
    rows.nth(english).locator("a.open").click()
    page.wait_for_url(f"**/lines/{DEMO_LINE}/samples/*")
    diff = page.locator("#edit-diff")
    assert diff.locator("del").count() + diff.locator("ins").count() >= 1
    shot("sample-edit-diff", "#edit-diff")

    visit(f"/lines/{DEMO_LINE}/evals")
    evals = page.locator("main").inner_text()
    assert "sure the candidate is better" in evals
    assert "promote" in evals
    shot("eval-review")

    assert outside == [], f"the page fetched from elsewhere: {outside}"
    context.close()
    for path in shots:
        assert path.stat().st_size > 10_000
