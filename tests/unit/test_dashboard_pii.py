"""PII planted in the store (Faker names, phones, emails, ids, cards, addresses in prompts
and edits) never comes out of the feedback page: no page, API response, export, log line
or ``flywheel buckets`` output holds any planted value."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from typer.testing import CliRunner

from feedback.schema import interactions_table
from tests.dashboard_store import LINES, PageHome, build_page_home


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PageHome]:
    built = build_page_home(
        tmp_path_factory.mktemp("pii") / "home", requests=240, pii_share=0.6, seed=29
    )
    yield built
    built.store.close()


def _every_response(client: TestClient, home: PageHome) -> Iterator[tuple[str, str]]:
    """(url, body) of every view, page, sample and export of every line."""
    with home.store.engine.connect() as connection:
        i = interactions_table.c
        line_of = {
            row.request_id: row.business_line
            for row in connection.execute(select(i.request_id, i.business_line))
        }
    planted_ids = {p.request_id for p in home.planted}
    for url in ("/", "/api/lines", "/login", "/healthz"):
        yield url, client.get(url).text
    for line in LINES:
        for view in ("", "/funnel", "/evals"):
            yield f"/lines/{line}{view}", client.get(f"/lines/{line}{view}").text
        for view in ("overview", "funnel", "evals"):
            yield f"/api/lines/{line}/{view}", client.get(f"/api/lines/{line}/{view}").text
        for signal in ("", "edit", "thumbs_down"):
            cursor = None
            while True:
                params = {"signal": signal} | ({"cursor": cursor} if cursor else {})
                page = client.get(f"/lines/{line}/samples", params=params)
                yield f"/lines/{line}/samples?{params}", page.text
                api = client.get(f"/api/lines/{line}/samples", params=params)
                yield f"/api/lines/{line}/samples?{params}", api.text
                cursor = api.json()["next_cursor"]
                if cursor is None:
                    break
            for kind in ("csv", "jsonl"):
                url = f"/lines/{line}/export.{kind}"
                yield url, client.get(url, params={"signal": signal}).text
        for request_id in sorted(rid for rid in planted_ids if line_of.get(rid) == line):
            for prefix in ("/lines", "/api/lines"):
                url = f"{prefix}/{line}/samples/{request_id}"
                yield url, client.get(url).text


def test_no_planted_pii_leaves_the_page(
    home: PageHome, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    planted = sorted({p.value for p in home.planted})
    assert len(planted) > 100  # the check below must have something to find
    caplog.set_level(logging.DEBUG)
    app = home.app(export_limit=100_000)
    leaks: dict[str, list[str]] = {}
    responses = 0
    with TestClient(app, client=("10.0.0.9", 1234), headers=home.bearer("admin")) as client:
        for url, body in _every_response(client, home):
            responses += 1
            found = [value for value in planted if value in body]
            if found:
                leaks[url] = found
    assert responses > 50
    assert leaks == {}, f"planted PII on {len(leaks)} responses: {list(leaks.items())[:3]}"
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert [value for value in planted if value in logged] == []

    from cli.main import app as cli

    env = {
        "FLYWHEEL_HOME": str(home.settings.home),
        "FLYWHEEL_DATABASE_URL": home.settings.resolved_database_url,
    }
    for args in (["buckets"], ["buckets", "--json"]):
        printed = CliRunner().invoke(cli, args, env=env)
        assert printed.exit_code == 0, printed.output
        assert [value for value in planted if value in printed.output] == []


def test_the_store_really_holds_the_planted_values(home: PageHome) -> None:
    """The test above is only meaningful if the raw text is in the store."""
    with home.store.engine.connect() as connection:
        raw = " ".join(
            str(row.messages) for row in connection.execute(select(interactions_table.c.messages))
        )
    in_prompts = [p for p in home.planted if p.value in raw]
    assert len(in_prompts) > len(home.planted) // 2
