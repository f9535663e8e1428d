"""The feedback page shows a line's shadow: its share, the requests it answered again, and the
canary flow's latest look at it, in numbers (never the shadow's texts)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import select

from feedback.schema import interactions_table
from feedback.shadow import shadow_pairs
from registry.decisions import record_decision
from registry.routes import RouteStore
from registry.shadow import ShadowPolicy, compare_shadow, judge_shadow
from tests.dashboard_store import build_page_home
from tests.routing import set_shadow

LINE = "medical"
SHADOW = f"{LINE}-v9"
SECRET = "Write to shadow.only@example.com, I refuse nothing"


def test_the_overview_shows_the_shadow_in_numbers(tmp_path: Path) -> None:
    home = build_page_home(tmp_path / "home", requests=120, with_dataset=False)
    engine = home.store.engine
    i = interactions_table.c
    with engine.connect() as connection:
        ids = (
            connection.execute(
                select(i.request_id).where(i.business_line == LINE, i.status == "ok").limit(12)
            )
            .scalars()
            .all()
        )
    routes = RouteStore(engine)
    before = routes.table(LINE)
    set_shadow(routes, LINE, SHADOW, 0.25, actor="test")
    now = datetime.now(UTC)
    outputs = [
        {"request_id": rid, "business_line": LINE, "adapter_name": SHADOW, "response": SECRET,
         "status": "ok", "created_at": now.isoformat()}
        for rid in ids[:10]
    ] + [
        {"request_id": rid, "business_line": LINE, "adapter_name": SHADOW, "response": "",
         "status": "error", "created_at": now.isoformat()}
        for rid in ids[10:]
    ]  # fmt: skip
    assert home.store.add_shadow_outputs(outputs).added == 12
    app = home.app()
    with TestClient(app, client=("10.1.2.3", 1), headers=home.bearer("admin")) as session:
        unlooked = session.get(f"/api/lines/{LINE}/overview").json()["shadow"]
        assert (unlooked["answered"], unlooked["errors"]) == (10, 2)
        assert unlooked["latest_look"] is None
        report = compare_shadow(
            SHADOW,
            shadow_pairs(engine, LINE, SHADOW, now.replace(year=2000), now.replace(year=2100)),
        )
        decision = judge_shadow(report, ShadowPolicy(fraction=0.25, min_pairs=5))
        record_decision(
            engine, business_line=LINE, adapter=SHADOW, fraction=0.25, look=1,
            action="shadow_reject", reasons="; ".join(decision.reasons),
            numbers={"shadow": report.as_dict(), "checks": [asdict(c) for c in decision.checks]},
            actor="test", when=now,
        )  # fmt: skip
        page = session.get(f"/lines/{LINE}").text
        body = session.get(f"/api/lines/{LINE}/overview").json()
    assert "medical-v9 on 25.0% of requests, never shown" in page
    assert 'id="shadow-checks"' in page
    assert "shadow_reject" in page
    assert "shadow.only@example.com" not in page
    assert SECRET not in str(body)
    look = body["shadow"]["latest_look"]
    assert look["action"] == "shadow_reject"
    assert look["report"]["pairs"] == 10
    verdicts = {c["metric"]: c["verdict"] for c in look["checks"]}
    assert verdicts["error_rate"] == "WORSE"
    assert verdicts["pii"] == "WORSE"
    assert body["routing"]["shadow"] == SHADOW
    assert before.shadow is None
    home.store.close()
