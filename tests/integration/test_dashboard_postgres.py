"""The feedback page on the real PostgreSQL store: rollup exact and race-safe under row
locks, views and pages agree with the store, planted PII stays out."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from feedback.rollup import RollupQuery, SignalRollup, rebuild_rollup
from tests.dashboard_store import TRAINED_LINE, PageHome, build_page_home, recount

pytestmark = pytest.mark.integration


@pytest.fixture
def home(postgres_url: str, tmp_path: Path) -> Iterator[PageHome]:
    built = build_page_home(
        tmp_path / "home", requests=400, database_url=postgres_url, pii_share=0.5
    )
    yield built
    built.store.close()


def _counter(rollup: SignalRollup) -> Counter[tuple[object, ...]]:
    return Counter(
        {
            (c.business_line, c.adapter, c.hour, c.signal): c.count
            for c in rollup.counts(RollupQuery())
        }
    )


def test_the_page_on_postgres(home: PageHome) -> None:
    _rollup_matches_a_recount_even_with_racing_folds(home)
    _views_agree_with_the_store(home)


def _rollup_matches_a_recount_even_with_racing_folds(home: PageHome) -> None:
    rebuild_rollup(home.store.engine)
    expected = recount(home.store)
    live = SignalRollup(home.store.engine, grace=timedelta(days=365))
    assert _counter(live) == expected
    racers = [SignalRollup(home.store.engine, grace=timedelta(0)) for _ in range(4)]
    threads = [threading.Thread(target=r.refresh, kwargs={"force": True}) for r in racers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert min(racers[0].watermarks().values()) > 0
    assert _counter(racers[0]) == expected
    assert racers[0].adapters("medical") == ["medical-v1", "medical-v2", "medical-v3"]


def _views_agree_with_the_store(home: PageHome) -> None:
    with TestClient(home.app(), client=("10.0.0.3", 1), headers=home.bearer("admin")) as client:
        overview = client.get("/api/lines/legal/overview").json()
        requests = sum(
            n
            for key, n in recount(home.store).items()
            if key[0] == "legal" and key[3] == "requests"
        )
        assert {t["adapter"]: t["requests"] for t in overview["totals"]}["all"] == requests
        assert overview["canary"]["canary"] == "legal-v3"

        seen: list[str] = []
        cursor = None
        while True:
            params = {"signal": "thumbs_up"} | ({"cursor": cursor} if cursor else {})
            body = client.get("/api/lines/legal/samples", params=params).json()
            seen += [s["request_id"] for s in body["samples"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert len(seen) == len(set(seen)) == overview["totals"][-1]["counts"]["thumbs_up"]

        edits = client.get(f"/api/lines/{TRAINED_LINE}/samples", params={"signal": "edit"}).json()
        detail = client.get(f"/lines/{TRAINED_LINE}/samples/{edits['samples'][0]['request_id']}")
        assert 'id="edit-diff"' in detail.text
        funnel = client.get(f"/api/lines/{TRAINED_LINE}/funnel").json()
        assert funnel["builds"][0]["steps"][0]["step"] == "raw"

        planted = {p.value for p in home.planted}
        bodies = [
            client.get(f"/lines/{line}/export.jsonl", params={"signal": signal}).text
            for line in ("legal", "medical", "customer_service")
            for signal in ("", "edit")
        ]
        leaked = sorted(value for value in planted if any(value in body for body in bodies))
        assert leaked == []
