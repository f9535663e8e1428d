"""The review queue in a real browser: Debian's headless Chromium driven by Playwright.

A reviewer logs in with a gateway key that has the reviewer role on the line, works
through the queue (blind, scrubbed answers of the champion and the live canary, in
random order), passes the champion's answers, fails the canary's and corrects one
Chinese answer; the queue then says it is empty, the correction is stored as a
review event that training reads as an edit, and the overview shows each arm's pass
rate and the canary flow's look at it. Screenshots go to ``$FLYWHEEL_SCREENSHOTS`` or
the test's tmp dir (.ci/run installs fonts-noto-cjk: Chinese is readable).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from feedback.online import adapter_windows
from feedback.schema import feedback_table
from feedback.signals import pull_records
from registry.canary import PASS_RATE, CanaryPolicy, ReviewTest, _arm, decide_canary
from registry.decisions import record_decision
from tests.dashboard_store import shared_scrubber
from tests.integration.test_dashboard_browser import (  # noqa: F401 (fixture)
    VIEWPORT,
    browser,
    only_from,
    screenshot_dir,
)
from tests.pg_instance import free_port
from tests.review_world import LINE, ReviewWorld, build_review_world
from tests.servers import serving

pytestmark = pytest.mark.integration

CORRECTION = "您好，很抱歉：订单会晚到两天，预计周五送达。"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ReviewWorld, str]]:
    world = build_review_world(tmp_path_factory.mktemp("review") / "home", per_arm=4)
    shared_scrubber()  # loaded before the clock of the first page starts (spaCy, jieba)
    with serving(world.app(), free_port()) as url:
        yield world, url
    world.store.close()


def _cjk(text: str) -> bool:
    return any("\u4e00" <= c <= "\u9fff" for c in text)


def test_a_reviewer_works_through_the_queue_and_corrects_a_chinese_answer(
    browser: Any,  # noqa: F811 (the imported fixture)
    site: tuple[ReviewWorld, str],
    tmp_path: Path,
) -> None:
    world, url = site
    fonts = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True, check=False)
    assert fonts.stdout.strip(), "no CJK font: install fonts-noto-cjk (.ci/run does)"
    context = browser.new_context(viewport=VIEWPORT)
    outside = only_from(url, context)
    page = context.new_page()
    page.set_default_timeout(90_000)  # a scrub of a new text on a busy two-core machine
    shots: list[Path] = []
    folder = screenshot_dir(tmp_path)

    def shot(name: str) -> None:
        path = folder / f"review-{len(shots) + 1:02d}-{name}.png"
        page.screenshot(path=str(path))
        shots.append(path)

    page.goto(f"{url}/lines/{LINE}/review")
    page.fill("input[name=key]", world.keys["reviewer"])
    page.click("form.login button[type=submit]")
    page.wait_for_url(f"{url}/lines/{LINE}/review")
    assert page.locator("nav.tabs a.current").inner_text() == "review queue"

    answers: list[str] = []
    corrected_item = None
    while page.locator("#review-form").count():
        item = page.locator("#review-item").get_attribute("data-item")
        answer = page.locator("#review-answer").inner_text()
        prompt = page.locator("#review-item .message.user pre").inner_text()
        text = page.locator("main").inner_text()
        for hidden in (world.champion, world.canary, "req-", "jane.smith@example.com"):
            assert hidden not in text, hidden
        answers.append(answer)
        canary = "delayed" in answer or "晚到" in answer
        page.check(f"input[name=verdict][value={'fail' if canary else 'pass'}]")
        page.select_option("select[name=reason]", "wrong facts" if canary else "correct")
        if canary and _cjk(answer) and corrected_item is None:
            corrected_item = item
            assert _cjk(prompt)
            page.fill("textarea[name=correction]", CORRECTION)
            shot("chinese-answer-with-correction")
        elif len(shots) == 0 and not _cjk(answer) and "<PERSON" in prompt + text:
            shot("english-answer-scrubbed")
        page.click("#review-form button[type=submit]")
        page.wait_for_url(f"**/lines/{LINE}/review?saved={item}")
        assert page.locator("#saved").is_visible()
    assert page.locator("#queue-empty").is_visible()
    assert page.locator("#reviewed").inner_text() == "8"
    shot("queue-empty")
    assert len(answers) == 8
    assert sum(_cjk(a) for a in answers) == 4
    assert corrected_item is not None

    # Stored as review events; the correction is an edit for training, with lineage.
    f = feedback_table.c
    with world.store.engine.connect() as connection:
        reviews = connection.execute(select(feedback_table).where(f.type == "review")).all()
    assert len(reviews) == 8
    (correction,) = [r for r in reviews if r.edited_text]
    assert correction.edited_text == CORRECTION
    assert correction.outcome == "fail"
    assert correction.metadata == {"reason": "wrong facts", "reviewer": "reviewer"}
    record = next(
        r for r in pull_records(world.store.engine, LINE) if r.request_id == correction.request_id
    )
    assert record.edit == CORRECTION
    assert record.signal == "edit"

    # The canary flow's look, recorded as the flow records it, and the overview showing it.
    windows = adapter_windows(
        world.store.engine,
        LINE,
        [world.champion, world.canary],
        world.started - timedelta(seconds=1),
        datetime.now(UTC) + timedelta(days=1),
    )
    champion, canary = _arm(windows, world.champion), _arm(windows, world.canary)
    policy = CanaryPolicy(min_requests=1, reviews=ReviewTest(min_reviews=4, margin=0.1))
    decision = decide_canary(champion, canary, policy, look=1)
    check = next(c for c in decision.checks if c.metric == PASS_RATE)
    assert (check.champion, check.canary) == (1.0, 0.0)
    record_decision(
        world.store.engine,
        business_line=LINE,
        adapter=world.canary,
        fraction=0.05,
        look=1,
        action=decision.action.value,
        reasons="; ".join(decision.reasons),
        numbers={"checks": [asdict(c) for c in decision.checks]},
        actor="test",
        when=datetime.now(UTC),
    )
    page.goto(f"{url}/lines/{LINE}")
    reviews_table = page.locator("#canary-reviews").inner_text()
    assert "100.0%" in reviews_table
    assert "0.0%" in reviews_table
    checks = page.locator("#canary-checks").inner_text()
    assert "pass rate" in checks
    assert "worse" in checks
    shot("overview-pass-rates")
    assert outside == [], f"the page fetched from elsewhere: {outside}"
    context.close()
    for path in shots:
        assert path.stat().st_size > 10_000
