"""The store contract on the embedded SQLite backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from feedback.store import FeedbackStore
from flywheel.settings import Settings
from tests.store_contract import StoreContract


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    def store(self, settings: Settings) -> Iterator[FeedbackStore]:
        store = FeedbackStore.open(settings)
        yield store
        store.close()


def test_migrations_match_the_models_on_sqlite(settings: Settings) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from flywheel.database import Base

    store = FeedbackStore.open(settings)
    with store.engine.connect() as connection:
        drift = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    store.close()
    assert drift == [], f"models and migrations disagree: {drift}"


def test_interactions_stored_before_keys_were_recorded_keep_no_key(settings: Settings) -> None:
    from datetime import UTC, datetime

    from sqlalchemy import select

    from feedback.schema import interactions_table
    from feedback.store import create_store_engine, upgrade_schema
    from tests.store_contract import interaction

    engine = create_store_engine(settings.resolved_database_url)
    upgrade_schema(engine, "0011")
    old = {**interaction("old"), "created_at": datetime.now(UTC), "prompt_hash": "0" * 64}
    old.pop("type")
    with engine.begin() as connection:
        connection.execute(interactions_table.insert().values(status="ok", **old))
    upgrade_schema(engine)
    FeedbackStore(engine).ingest([interaction("new", key_name="support-app")], source="t")
    table = interactions_table.c
    with engine.connect() as connection:
        keys = dict(connection.execute(select(table.request_id, table.key_name)).all())
    engine.dispose()
    assert keys == {"old": None, "new": "support-app"}


def test_a_store_the_composition_root_opens_erases_from_every_package_s_tables(
    settings: Settings,
) -> None:
    import os
    import subprocess
    import sys

    FeedbackStore.open(settings).close()  # at the newest revision: the next open migrates nothing
    erase = (
        "from composition.clients import build_clients\n"
        "from flywheel.settings import load_settings\n"
        "with build_clients(load_settings()) as clients:\n"
        "    print(clients.store.forget_user('nobody').total('interactions'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", erase], check=False, capture_output=True, text=True, env=os.environ
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


def test_an_erasure_refuses_while_the_database_holds_an_undeclared_table(
    settings: Settings,
) -> None:
    from sqlalchemy import text

    from feedback.schema import UndeclaredTablesError

    store = FeedbackStore.open(settings)
    with store.engine.begin() as connection:
        connection.execute(text("CREATE TABLE stray_counts (request_id TEXT)"))
    with pytest.raises(UndeclaredTablesError, match=r"not declared \(stray_counts\)"):
        store.forget_user("nobody")
    store.close()
