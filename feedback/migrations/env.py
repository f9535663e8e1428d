"""Alembic environment: runs on the connection the store hands over, or on the configured URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text

from composition.tables import metadata

config = context.config
target_metadata = metadata  # every package's tables: one history migrates them all
ADVISORY_LOCK_ID = 0x464C5957  # "FLYW": one migrator at a time on PostgreSQL


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": ADVISORY_LOCK_ID})
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate on the given connection (from the store) or on sqlalchemy.url."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
