"""The review queue on PostgreSQL: claims under concurrent reviewers, verdicts, pass rates."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from composition.recipes import load_recipe
from dashboard.review_queue import ReviewQueue, ReviewVerdictIn
from feedback.online import adapter_windows
from registry.routes import RouteStore
from tests.review_world import LINE, build_review_world

pytestmark = pytest.mark.integration


def test_concurrent_reviewers_share_items_only_at_the_end_and_their_verdicts_count(
    tmp_path: Path, postgres_url: str
) -> None:
    world = build_review_world(tmp_path / "home", per_arm=10, database_url=postgres_url)
    recipes = world.settings.recipes_dir
    assert recipes is not None
    queue = ReviewQueue(
        world.store,
        lambda line: load_recipe(line, recipes).review,
        routes=RouteStore(world.store.engine),
        rng=random.Random(1),
    )
    got: dict[str, list[str]] = {}
    failures: list[BaseException] = []

    def work(reviewer: str) -> None:
        try:
            mine = got.setdefault(reviewer, [])
            while (item := queue.next_item(LINE, reviewer)) is not None:
                mine.append(item.raw.request_id)
                verdict = "fail" if "-canary-" in item.raw.request_id else "pass"
                queue.submit(LINE, reviewer, item.item, ReviewVerdictIn(verdict, "unclear"))
        except BaseException as exc:  # surfaced below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(f"r{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    handed = [rid for ids in got.values() for rid in ids]
    assert all(len(ids) == len(set(ids)) for ids in got.values())  # never one twice
    assert len(set(handed)) == 20
    # Two reviewers share an answer only at the very end, when nothing else is left: at
    # most one per other reviewer still working.
    assert len(handed) - 20 <= 3
    champion_n = sum("-champion-" in rid for rid in handed)
    windows = adapter_windows(
        world.store.engine,
        LINE,
        [world.champion, world.canary],
        world.started - timedelta(seconds=1),
        datetime.now(UTC) + timedelta(days=1),
    )
    canary_n = len(handed) - champion_n
    assert (windows[world.champion].reviews, windows[world.champion].review_failures) == (
        champion_n,
        0,
    )
    assert (windows[world.canary].reviews, windows[world.canary].review_failures) == (
        canary_n,
        canary_n,
    )
    world.store.close()
