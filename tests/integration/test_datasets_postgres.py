"""From the PostgreSQL store to datasets with the real scrubber: planted PII never comes out."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from feedback.cleaning import clean_line, scrub_with
from feedback.datasets import manifests_with_user
from feedback.pii import build_scrubber
from feedback.schema import interactions_table
from feedback.signals import pull_records
from feedback.store import FeedbackStore, create_store_engine, upgrade_schema
from flywheel.settings.cleaning import CleaningSettings
from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator

pytestmark = pytest.mark.integration


def test_store_to_datasets_without_pii(postgres_url: str, tmp_path: Path) -> None:
    engine = create_store_engine(postgres_url)
    upgrade_schema(engine)
    store = FeedbackStore(engine)
    simulator = TrafficSimulator(
        SimulationSettings(
            requests=900, seed=21, start=datetime(2026, 11, 1, tzinfo=UTC), pii_share=0.5
        ),
        track_pii=True,
    )
    report = store.ingest(simulator.events(), source="simulate")
    assert report.quarantined == 0
    assert len(simulator.planted) > 200
    scrub = scrub_with(build_scrubber())
    root = tmp_path / "datasets"
    results = [
        clean_line(engine, line, scrub=scrub, settings=CleaningSettings(), dataset_root=root)
        for line in store.business_lines()
    ]
    assert {r.business_line for r in results} == {"customer_service", "medical", "legal"}
    outputs = [path for r in results if r.dataset for path in r.dataset.path.iterdir()]
    assert any(p.name.startswith("dpo_") for p in outputs)
    text = ""
    for path in outputs:
        if path.suffix == ".parquet":
            text += str(pq.read_table(path).to_pylist())
        else:
            text += path.read_text(encoding="utf-8")
    leaked = sorted({p.value for p in simulator.planted if p.value in text})
    assert leaked == [], f"{len(leaked)} planted PII values reached a dataset: {leaked[:5]}"
    for result in results:
        funnel = result.funnel.as_dict()
        assert funnel["pii"], "the scrubber found nothing"
        assert sum(funnel["steps"]["pulled"].values()) >= sum(
            funnel["steps"]["deduplicated"].values()
        )

    # a deletion request removes the user's events and names the datasets they were in
    built = next(r.dataset for r in results if r.dataset)
    request_id = built.manifest["examples"][0]["source_request_ids"][0]
    with engine.connect() as connection:
        user = connection.execute(
            select(interactions_table.c.user_id).where(
                interactions_table.c.request_id == request_id
            )
        ).scalar_one()
    assert built.path / "manifest.json" in manifests_with_user(root, user)
    deleted = store.forget_user(user)
    assert deleted.total("interactions") > 0
    remaining = [
        r
        for line in store.business_lines()
        for r in pull_records(engine, line)
        if r.user_id == user
    ]
    assert remaining == []
    store.close()
