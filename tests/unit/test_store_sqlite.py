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

    from feedback.schema import Base

    store = FeedbackStore.open(settings)
    with store.engine.connect() as connection:
        drift = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    store.close()
    assert drift == [], f"models and migrations disagree: {drift}"
