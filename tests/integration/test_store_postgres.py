"""The feedback store on the real PostgreSQL server: migrations, ingest, quarantine, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from feedback.importers.business_rules import load_business_rules
from feedback.importers.oasst import oasst_items
from feedback.jsonl import iter_jsonl
from feedback.store import (
    FeedbackStore,
    create_store_engine,
    current_revision,
    downgrade_schema,
    head_revision,
    upgrade_schema,
)
from flywheel.database import Base
from tests.conftest import REPO, shared_file
from tests.store_contract import StoreContract

pytestmark = pytest.mark.integration


class TestPostgresStore(StoreContract):
    @pytest.fixture
    def store(self, postgres_url: str) -> Iterator[FeedbackStore]:
        engine = create_store_engine(postgres_url)
        upgrade_schema(engine)
        store = FeedbackStore(engine)
        yield store
        store.close()


def test_migrations_go_up_from_empty_and_back_down(postgres_url: str) -> None:
    engine = create_store_engine(postgres_url)
    assert current_revision(engine) is None
    upgrade_schema(engine)
    assert current_revision(engine) == head_revision()
    tables = set(inspect(engine).get_table_names())
    assert {"interactions", "feedback_events", "quarantine", "alembic_version"} <= tables
    with engine.connect() as connection:
        drift = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert drift == [], f"models and migrations disagree: {drift}"
    upgrade_schema(engine)  # idempotent
    downgrade_schema(engine, "base")
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    engine.dispose()


def test_oasst_import_counts_on_postgres(postgres_url: str) -> None:
    path = shared_file("oasst/en_100_tree.jsonl")
    engine = create_store_engine(postgres_url)
    upgrade_schema(engine)
    store = FeedbackStore(engine)
    rules = load_business_rules()
    report = store.ingest(oasst_items(iter_jsonl(path), rules), source=str(path))
    assert report.quarantined == 0
    counts = store.stats()
    assert counts["interactions"] == 687
    assert counts["events"]["thumbs_up"] + counts["events"]["thumbs_down"] == 854 + 372
    again = store.ingest(oasst_items(iter_jsonl(path), rules), source=str(path))
    assert again.added == 0
    assert store.stats() == counts
    store.close()


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    flywheel = Path(sys.executable).with_name("flywheel")
    return subprocess.run(
        [str(flywheel), *args], capture_output=True, text=True, env=env, cwd=REPO, check=False
    )


def test_cli_against_postgres(postgres_url: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "FLYWHEEL_HOME": str(tmp_path / "home"),
        "FLYWHEEL_DATABASE_URL": postgres_url,
    }
    upgraded = run_cli("db", "upgrade", env=env)
    assert upgraded.returncode == 0, upgraded.stderr
    simulated = run_cli("simulate", "--requests", "300", "--seed", "5", env=env)
    assert simulated.returncode == 0, simulated.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"type": "thumbs_up", "request_id": "nope", "created_at": "2026-01-01"}\n')
    imported = run_cli("import", "jsonl", str(bad), env=env)
    assert imported.returncode == 1
    assert "interaction 'nope' does not exist" in imported.stderr
    assert "Traceback" not in imported.stderr
    stats = json.loads(run_cli("stats", "--json", env=env).stdout)
    assert stats["interactions"] >= 300
    assert stats["quarantined"] == 1
    listed = run_cli("quarantine", "--json", env=env)
    assert (
        json.loads(listed.stdout.splitlines()[0])["reason"] == "interaction 'nope' does not exist"
    )


def test_unreachable_store_is_a_clear_error(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "FLYWHEEL_HOME": str(tmp_path / "home"),
        "FLYWHEEL_DATABASE_URL": "postgresql+psycopg://nobody:secret@127.0.0.1:1/none",
    }
    result = run_cli("stats", "--json", env=env)
    assert result.returncode == 3
    assert "cannot reach the feedback store" in result.stderr
    assert "secret" not in result.stderr
    assert "Traceback" not in result.stderr
