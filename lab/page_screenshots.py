"""The feedback page as a demo leaves it, photographed with headless Chromium.

    make demo                     # or flywheel demo / flywheel loop on a home of your own
    .venv/bin/python lab/page_screenshots.py --home ~/.flywheel --out docs/screenshots

Makes a key that sees and reviews every line on that home (as the demo's hint does),
serves the page with ``flywheel serve dashboard``, logs in and photographs, for the line
the loop ran on: its overview (each signal's trend), the canary flow's latest look, the
cleaning funnel, a sample with a user's edit, the review queue and the eval review; for
the line with the most stored traffic, its overview as well. A page that is missing
something the demo should have left (no edit, no eval) is reported and the rest are taken.
Needs Chromium (``/usr/bin/chromium``) and the dev extras' playwright.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flywheel.processes import service_process  # noqa: E402 (after the path set-up)

CHROMIUM = Path("/usr/bin/chromium")
VIEWPORT = {"width": 1280, "height": 800}
KEY_NAME = "screenshots"


def make_key(home: Path) -> str:
    """A key seeing and reviewing every line of ``home`` (its secret rotated if it exists)."""
    from flywheel.errors import UsageError
    from flywheel.settings import load_settings
    from gateway.keys import add_key, rotate_key

    path = load_settings().gateway.resolved_keys_file(home)
    try:
        return add_key(path, KEY_NAME, ["*"], ["*"])
    except UsageError:
        return rotate_key(path, KEY_NAME)


def busiest_lines(home: Path) -> list[str]:
    """The home's lines with stored interactions, most first."""
    from sqlalchemy import func, select

    from feedback.schema import interactions_table
    from feedback.store import FeedbackStore
    from flywheel.settings import load_settings

    settings = load_settings().model_copy(update={"home": home})
    store = FeedbackStore.open(settings)
    try:
        line = interactions_table.c.business_line
        query = select(line, func.count()).group_by(line).order_by(func.count().desc())
        with store.engine.connect() as connection:
            return [row[0] for row in connection.execute(query)]
    finally:
        store.close()


@dataclass
class Camera:
    """A logged-in browser page on the served page, and what it could not photograph."""

    page: Any
    url: str
    out: Path
    prefix: str
    missing: list[str] = field(default_factory=list)

    def visit(self, path: str) -> str:
        """Open ``path`` and return its main text once the page is idle."""
        self.page.goto(f"{self.url}{path}")
        self.page.wait_for_load_state("networkidle")
        return str(self.page.locator("main").inner_text())

    def shot(self, name: str, scroll_to: str | None = None) -> None:
        """Photograph the viewport, scrolled to ``scroll_to`` first when given."""
        if scroll_to is not None:
            found = self.page.locator(scroll_to)
            if found.count() == 0:
                self.missing.append(f"{name}: nothing matches {scroll_to}")
                return
            found.first.evaluate("element => element.scrollIntoView()")
        target = self.out / f"{self.prefix}{name}.png"
        self.page.screenshot(path=str(target))
        print(f"{target} ({target.stat().st_size // 1000} KB)")


def tour(camera: Camera, key: str, line: str, others: list[str]) -> None:
    """Log in and photograph each view of ``line`` (and the busiest other line's overview)."""
    page = camera.page
    camera.visit(f"/lines/{line}")
    page.fill("input[name=key]", key)
    page.click("form.login button[type=submit]")
    page.wait_for_url(f"{camera.url}/lines/{line}")
    page.wait_for_load_state("networkidle")
    camera.shot("overview-trend")
    camera.shot("canary-decision", "#canary-checks")
    if others:
        camera.visit(f"/lines/{others[0]}")
        camera.shot(f"overview-trend-{others[0]}")
    if "dataset" not in camera.visit(f"/lines/{line}/funnel"):
        camera.missing.append(f"funnel of {line}: no dataset build")
    camera.shot("funnel")
    camera.visit(f"/lines/{line}/samples?signal=edit")
    edits = page.locator("#samples tbody tr a.open")
    if edits.count():
        edits.first.click()
        page.wait_for_url(f"**/lines/{line}/samples/*")
        camera.shot("sample-edit-diff", "#edit-diff")
    else:
        camera.missing.append(f"samples of {line}: no edit")
    camera.visit(f"/lines/{line}/review")
    camera.shot("review-queue")
    if "candidate" not in camera.visit(f"/lines/{line}/evals"):
        camera.missing.append(f"evals of {line}: no eval run")
    camera.shot("eval-review")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--home", type=Path, required=True, help="The demo's FLYWHEEL_HOME.")
    parser.add_argument("--out", type=Path, required=True, help="Folder for the PNGs.")
    parser.add_argument(
        "--line", default="customer_service", help="The line the loop ran on (the demo's)."
    )
    parser.add_argument("--prefix", default="page-", help="Prefix of each PNG's name.")
    args = parser.parse_args()
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    from registry.vllm_server import free_port

    home = args.home.expanduser().resolve()
    key = make_key(home)
    others = [line for line in busiest_lines(home) if line != args.line]
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {
        **os.environ,
        "FLYWHEEL_HOME": str(home),
        "FLYWHEEL_DASHBOARD_PORT": str(port),
        "FLYWHEEL_DASHBOARD_HOST": "127.0.0.1",
    }
    url = f"http://127.0.0.1:{port}"
    argv = [str(Path(sys.executable).parent / "flywheel"), "serve", "dashboard"]
    log = home / "page-screenshots.log"
    with (
        service_process(argv, name="the page", ready_url=f"{url}/healthz", log_path=log, env=env),
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        camera = Camera(
            browser.new_context(viewport=VIEWPORT).new_page(), url, args.out, args.prefix
        )
        tour(camera, key, args.line, others)
        browser.close()
    for problem in camera.missing:
        print(f"not photographed: {problem}")


if __name__ == "__main__":
    main()
