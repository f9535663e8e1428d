"""What each vLLM replica serves with, as it said at its start: read, never copied by hand.

``flywheel serve vllm`` records its replica here when it starts (:meth:`ReplicaStore.record`):
the base model it serves (name and :func:`training.base_model.base_fingerprint` digest),
its ``--max-loras`` and ``--max-lora-rank``, and whether flywheel's LoRA resolver is
installed in it. The rollout reads these limits for its LoRA budget and the recipe's rank
check, and the base for refusing an adapter trained on another one
(:func:`registry.delivery.base_refusal`).

The table is the registry's (``registry.tables``); the one migration history
(``feedback/migrations``, revision 0013) creates it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from registry.tables import replicas_table


def replica_key(url: str) -> str:
    """The form a replica URL is stored and looked up in (no trailing slash)."""
    return url.rstrip("/")


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    """A replica as it started: its URL, the base model it serves (name and digest), its
    LoRA limits and whether vLLM asks flywheel's resolver for adapters it lacks."""

    url: str
    base_name: str
    base_digest: str
    max_loras: int
    max_lora_rank: int
    resolver: bool
    started_at: datetime


class ReplicaStore:
    """The replicas' records in the feedback store (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def record(self, replica: ReplicaRecord) -> None:
        """Record ``replica`` as it started, replacing what its URL held before."""
        key = replica_key(replica.url)
        values: dict[str, object] = {
            "base_name": replica.base_name,
            "base_digest": replica.base_digest,
            "max_loras": replica.max_loras,
            "max_lora_rank": replica.max_lora_rank,
            "resolver": replica.resolver,
            "started_at": replica.started_at,
        }
        table = replicas_table
        for attempt in range(2):
            try:
                with self.engine.begin() as connection:
                    changed = connection.execute(
                        update(table).where(table.c.url == key).values(**values)
                    ).rowcount
                    if not changed:
                        connection.execute(insert(table).values(url=key, **values))
                return
            except IntegrityError:
                # Another process recorded the same URL between the two statements.
                if attempt:
                    raise

    def get(self, url: str) -> ReplicaRecord | None:
        """The record of the replica at ``url``; None for one that never recorded itself."""
        query = select(replicas_table).where(replicas_table.c.url == replica_key(url))
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
        return _record(row) if row is not None else None

    def all(self) -> list[ReplicaRecord]:
        """Every recorded replica, by URL."""
        query = select(replicas_table).order_by(replicas_table.c.url)
        with self.engine.connect() as connection:
            return [_record(row) for row in connection.execute(query)]


def _record(row: object) -> ReplicaRecord:
    mapping = row._mapping  # type: ignore[attr-defined]
    return ReplicaRecord(
        url=mapping["url"],
        base_name=mapping["base_name"],
        base_digest=mapping["base_digest"],
        max_loras=int(mapping["max_loras"]),
        max_lora_rank=int(mapping["max_lora_rank"]),
        resolver=bool(mapping["resolver"]),
        started_at=mapping["started_at"],
    )
