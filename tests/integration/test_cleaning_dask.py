"""The cleaning stage on a local 2-worker Dask cluster, under Prefect, against PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from feedback.cleaning import clean_line, scrub_with
from feedback.pii import build_scrubber
from feedback.store import FeedbackStore
from flows.cleaning import run_partitioned
from flywheel.settings import Settings, load_settings
from flywheel.settings.cleaning import CleaningSettings
from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator

# ~45 s: a Prefect API, two worker processes each loading spaCy.
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def prefect_api() -> Iterator[None]:
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def pg_settings(postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLYWHEEL_DATABASE_URL", postgres_url)
    settings = load_settings()
    store = FeedbackStore.open(settings)
    simulation = SimulationSettings(
        requests=900, seed=3, start=datetime(2026, 11, 1, tzinfo=UTC), pii_share=0.4
    )
    simulator = TrafficSimulator(simulation, track_pii=True)
    store.ingest(simulator.events(), source="simulate")
    store.close()
    return settings


def test_two_dask_workers_build_the_one_process_dataset(
    prefect_api: None, pg_settings: Settings, tmp_path: Path
) -> None:
    until = datetime(2026, 11, 2, tzinfo=UTC)
    result = run_partitioned(pg_settings, "medical", workers=2, until=until)
    assert result.partitions == 4
    assert result.dataset is not None
    assert set(result.seconds) == {
        "pull_scrub_sign",
        "pull_scrub_sign_cpu",
        "dedup_shards",
        "join_build_write",
    }
    assert result.seconds["pull_scrub_sign_cpu"] > 0
    assert result.funnel["pii"], "the workers' scrubber found nothing"
    assert not list((pg_settings.home / "staging").iterdir()), "staging left behind"

    store = FeedbackStore.open(pg_settings)
    try:
        whole = clean_line(
            store.engine,
            "medical",
            scrub=scrub_with(build_scrubber()),
            settings=CleaningSettings(),
            dataset_root=tmp_path / "whole",
            until=until,
        )
    finally:
        store.close()
    assert whole.dataset is not None
    assert result.funnel == whole.funnel.as_dict()
    assert result.dataset == whole.dataset.content_hash

    # What Prefect stored of the run (its database, its UI): small parameters, no secret.
    import asyncio
    import json

    from prefect.client.orchestration import get_client

    async def stored_parameters() -> list[dict[str, object]]:
        async with get_client() as client:
            runs = await client.read_flow_runs()
        return [run.parameters for run in runs if run.name == "clean-medical"]

    [parameters] = asyncio.run(stored_parameters())
    assert set(parameters) <= {"line", "since", "until", "workers", "cleaning", "across_windows"}
    stored = json.dumps(parameters, default=str)
    assert pg_settings.resolved_database_url not in stored
    assert "postgresql" not in stored
    assert str(pg_settings.home) not in stored
