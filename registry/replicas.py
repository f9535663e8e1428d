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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from flywheel.settings import Settings
from registry.delivery import AdapterRefusedError, base_refusal
from registry.placement import placed, replica_url
from registry.routing import RoutingTable
from registry.tables import replicas_table
from registry.vllm_admin import VllmAdminClient, VllmAdminError, VllmRequestError
from training.base_model import BaseFingerprint, read_base_record


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
        key = replica_url(replica.url)
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
        query = select(replicas_table).where(replicas_table.c.url == replica_url(url))
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


# --------------------------------------------------------------------------- LoRA limits

MAX_LORAS_SETTING = "FLYWHEEL_VLLM_MAX_LORAS"
MAX_LORA_RANK_SETTING = "FLYWHEEL_VLLM_MAX_LORA_RANK"


@dataclass(frozen=True, slots=True)
class LoraLimits:
    """A replica's ``--max-loras`` and ``--max-lora-rank``, and where each was read: from
    the replica's record (its start flags), from what its vLLM reports, or the settings."""

    max_loras: int
    max_lora_rank: int
    max_loras_source: str
    max_lora_rank_source: str


def reported_max_loras(metrics_text: str) -> int | None:
    """``--max-loras`` as a vLLM server reports it on ``/metrics`` (the ``max_lora`` label of
    ``vllm:lora_requests_info``, present once its engine has stepped); None when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        if family.name != "vllm:lora_requests_info":
            continue
        for sample in family.samples:
            value = sample.labels.get("max_lora", "")
            if value.isdigit() and int(value) > 0:
                return int(value)
    return None


def replica_limits(
    url: str,
    record: ReplicaRecord | None,
    reported: int | None,
    *,
    max_loras_setting: int,
    max_lora_rank_setting: int,
) -> LoraLimits:
    """One replica's limits: its record first, then what its vLLM reports (``--max-loras``
    only: vLLM reports no rank), then the settings; each says where it came from."""
    url = replica_url(url)
    if record is not None:
        said = f"recorded by {url} at its start"
        return LoraLimits(record.max_loras, record.max_lora_rank, said, said)
    if reported is not None:
        loras, loras_source = reported, f"reported by vLLM at {url} (/metrics)"
    else:
        loras, loras_source = max_loras_setting, f"the setting {MAX_LORAS_SETTING}"
    return LoraLimits(
        loras, max_lora_rank_setting, loras_source, f"the setting {MAX_LORA_RANK_SETTING}"
    )


def tightest_limits(limits: Sequence[LoraLimits]) -> LoraLimits:
    """The smallest ``--max-loras`` and the smallest ``--max-lora-rank`` over some replicas
    (those a line is placed on), each with the source it came from."""
    if not limits:
        raise ValueError("no replica to read limits from")
    loras = min(limits, key=lambda limit: limit.max_loras)
    rank = min(limits, key=lambda limit: limit.max_lora_rank)
    return LoraLimits(
        loras.max_loras, rank.max_lora_rank, loras.max_loras_source, rank.max_lora_rank_source
    )


def read_lora_limits(
    upstreams: Sequence[str],
    records: Mapping[str, ReplicaRecord],
    *,
    max_loras_setting: int,
    max_lora_rank_setting: int,
    metrics: Callable[[str], str | None] | None = None,
) -> dict[str, LoraLimits]:
    """Each upstream's limits (:func:`replica_limits`): ``records`` by URL, and for a
    replica without one, ``metrics(url)`` (its ``/metrics`` text, None when it does not
    answer; default: asked over HTTP within 2 s); keyed by URL without a trailing slash."""
    ask = metrics or _metrics_text
    found = {}
    for url in upstreams:
        record = records.get(replica_url(url))
        text = ask(url) if record is None else None
        found[replica_url(url)] = replica_limits(
            url,
            record,
            reported_max_loras(text) if text else None,
            max_loras_setting=max_loras_setting,
            max_lora_rank_setting=max_lora_rank_setting,
        )
    return found


def _metrics_text(url: str, timeout_s: float = 2.0) -> str | None:
    import httpx

    try:
        response = httpx.get(f"{replica_url(url)}/metrics", timeout=timeout_s)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return response.text


# --------------------------------------------------------------------------- same base or refused


class ReplicaRefusedError(AdapterRefusedError, VllmAdminError):
    """A replica refuses an adapter before loading it: its record says it serves another
    base model than the adapter was trained on. A load that fails like this fails the
    version's probe there, so the rollout rejects the version before any user is routed."""


def refusal_on(record: ReplicaRecord | None, adapter_dir: Path) -> str | None:
    """Why the replica of ``record`` must not load the adapter folder ``adapter_dir``
    (:func:`registry.delivery.base_refusal` of the base its ``flywheel_base.json`` records
    against the replica's); None when it may, or when either side recorded no base."""
    if record is None or not record.base_digest:
        return None
    served = BaseFingerprint(record.base_name, record.base_digest)
    return base_refusal(read_base_record(Path(adapter_dir)), served)


def load_checked(
    client: VllmAdminClient,
    adapter: str,
    path: Path | str,
    replicas: ReplicaStore | None,
) -> bool:
    """Load ``adapter`` from ``path`` on the client's replica unless the replica's record
    says it serves another base (:class:`ReplicaRefusedError`, with the reason); True when
    this call loaded it. Every load of a rollout goes through here."""
    record = replicas.get(client.base_url) if replicas is not None else None
    refusal = refusal_on(record, Path(path))
    if refusal is not None:
        raise ReplicaRefusedError(f"{client.base_url} refuses {adapter}: {refusal}")
    if record is not None and record.resolver:
        # ``path`` is on this process's disk, which the replica may not share: it fetches
        # the version into its own cache (digest and base checked there) instead.
        return fetched_by_replica(client, adapter)
    return client.ensure_loaded(adapter, path)


def fetched_by_replica(client: VllmAdminClient, adapter: str) -> bool:
    """Have a replica running flywheel's resolver serve ``adapter`` from its own cache: a
    one-token request naming it makes vLLM ask the resolver, which fetches the version from
    the registry. True when this call had it fetched; False when it was served already.
    :class:`ReplicaRefusedError` when the replica answers that it cannot serve it (its log
    says why: digest, base, rolled back, registry unreachable)."""
    if client.served_adapter(adapter) is not None:
        return False
    try:
        client.chat(adapter, "Hi", max_tokens=1)
    except VllmRequestError as exc:
        raise ReplicaRefusedError(
            f"{client.base_url} did not fetch {adapter} ({exc}); its log has the resolver's reason"
        ) from None
    return True


def line_lora_limits(
    replicas: ReplicaStore,
    table: RoutingTable,
    upstreams: Sequence[str],
    *,
    max_loras_setting: int,
    max_lora_rank_setting: int,
    metrics: Callable[[str], str | None] | None = None,
) -> LoraLimits:
    """The limits a line's adapters must fit: the smallest over the replicas the line is
    placed on (every upstream without a placement; the settings without upstreams)."""
    home = placed(table, upstreams) if upstreams else []
    records = {record.url: record for record in replicas.all()}
    limits = read_lora_limits(
        home,
        records,
        max_loras_setting=max_loras_setting,
        max_lora_rank_setting=max_lora_rank_setting,
        metrics=metrics,
    )
    if not limits:
        return replica_limits(
            "",
            None,
            None,
            max_loras_setting=max_loras_setting,
            max_lora_rank_setting=max_lora_rank_setting,
        )
    return tightest_limits(list(limits.values()))


def serving_lora_limits(
    settings: Settings,
    replicas: ReplicaStore,
    table: RoutingTable,
    upstreams: Sequence[str] | None = None,
    *,
    metrics: Callable[[str], str | None] | None = None,
) -> LoraLimits:
    """:func:`line_lora_limits` over ``upstreams`` (the gateway's by default), falling back
    to ``FLYWHEEL_VLLM_MAX_LORAS`` and ``FLYWHEEL_VLLM_MAX_LORA_RANK``."""
    return line_lora_limits(
        replicas,
        table,
        settings.gateway.upstreams if upstreams is None else upstreams,
        max_loras_setting=settings.vllm_max_loras,
        max_lora_rank_setting=settings.vllm_max_lora_rank,
        metrics=metrics,
    )


def over_limits(held: Mapping[str, set[str]], limits: Mapping[str, LoraLimits]) -> list[str]:
    """Each replica whose routed adapters (``held``, by URL) are more than its own
    ``--max-loras``, said with where that limit was read."""
    problems = []
    for url, adapters in sorted(held.items()):
        limit = limits.get(replica_url(url))
        if limit is not None and len(adapters) > limit.max_loras:
            problems.append(
                f"{len(adapters)} adapters are routed to {url}, over its --max-loras "
                f"{limit.max_loras} ({limit.max_loras_source}): {', '.join(sorted(adapters))}"
            )
    return problems
