"""Every replica serves what the routing tables name and place there; and the check of it.

- ``sync_adapters``: each adapter a table routes loaded (and probed) on the replicas its
  line is placed on, e.g. after a replica restarted; flywheel adapters no table names, and
  a placed line's adapters on the replicas it is not placed on, unloaded once drained.
- ``lifecycle_check``: routing vs MLflow's aliases vs loaded adapters vs the LoRA budget.
- ``repair_aliases``: MLflow's aliases moved back to what the tables serve.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flywheel.settings import Settings
from registry.lifecycle import LoraBudget, SetAlias, drift
from registry.names import adapter_name, version_of
from registry.placement import placed
from registry.rollout import LineClients
from registry.routing import RoutingTable


def desired_adapters(settings: Settings, clients: LineClients) -> tuple[dict[str, Any], set[str]]:
    """Every adapter a routing table names, with the folder vLLM loads it from; and the
    lines' gated candidates (loaded for a probe before they are routed: never unloaded)."""
    registry = clients.registry
    desired: dict[str, Any] = {}
    tables = clients.routes.snapshot().tables
    candidates = set()
    for line in sorted(set(settings.business_lines) | tables.keys()):
        table = tables.get(line)
        for adapter in sorted(table.adapters if table else ()):
            desired[adapter] = registry.adapter_path(line, version_of(adapter))
        candidate = registry.alias_version(line, "candidate")
        if candidate is not None:
            candidates.add(adapter_name(line, candidate))
    return desired, candidates


def sync_adapters(
    settings: Settings,
    clients: LineClients,
    upstreams: Sequence[str],
    *,
    in_flight: Callable[[str], int] | None = None,
) -> dict[str, Any]:
    """Load on every replica each adapter a routing table names (champion, canary, previous)
    and places there, e.g. after a replica restarted; unload (drained) flywheel adapters no
    table names, and a placed line's adapters from the replicas it is not placed on
    (drained on that replica alone). Returns what changed per replica."""
    from registry.replicas import refusal_on
    from registry.vllm_admin import reconcile

    desired, candidates = desired_adapters(settings, clients)
    records = {record.url: record for record in clients.replicas.all()}
    homes = {
        adapter: placed(table, upstreams)
        for table in clients.routes.snapshot().tables.values()
        for adapter in table.adapters
    }
    admins = {url: clients.vllm_admin(url) for url in upstreams}
    summary: dict[str, Any] = {}
    try:
        for url, client in admins.items():
            here = {a: path for a, path in desired.items() if client.base_url in homes[a]}
            # A replica serving another base than an adapter's never loads it.
            refused = {a: refusal_on(records.get(client.base_url), p) for a, p in here.items()}
            here = {a: path for a, path in here.items() if refused[a] is None}
            counter = _drain_counter(url, set(desired) - set(here), in_flight)
            report = reconcile([client], here, in_flight=counter, keep=candidates)
            [replica] = report.replicas
            # A load is not done until the probe shows the adapter answers and differs.
            failed = [f"{a}: refused: {why}" for a, why in sorted(refused.items()) if why]
            failed += [str(f) for f in replica.failures]
            for adapter in replica.loaded:
                probe = client.probe_adapter(adapter)
                if not probe.passed:
                    failed.append(f"{adapter}: probe failed: {'; '.join(probe.reasons)}")
            summary[replica.replica] = {
                "loaded": replica.loaded,
                "kept": replica.kept,
                "unloaded": replica.unloaded,
                "failed": failed,
            }
    finally:
        for client in admins.values():
            client.close()
    return summary


def _drain_counter(
    url: str, placed_elsewhere: set[str], in_flight: Callable[[str], int] | None
) -> Callable[[str], int] | None:
    """What an unload from ``url`` waits on: ``in_flight``, except for adapters still routed
    but placed on other replicas, whose requests there do not hold this one."""
    if in_flight is None or not placed_elsewhere:
        return in_flight
    from registry.vllm_admin import vllm_in_flight

    here = vllm_in_flight([url])
    return lambda adapter: (here if adapter in placed_elsewhere else in_flight)(adapter)


def loaded_adapters(clients: LineClients, upstreams: Sequence[str]) -> dict[str, list[str] | None]:
    """The adapters each replica serves now (None for one that does not answer)."""
    from registry.vllm_admin import VllmAdminError

    loaded: dict[str, list[str] | None] = {}
    for url in upstreams:
        try:
            with clients.vllm_admin(url) as client:
                loaded[url] = sorted(m.id for m in client.list_models() if m.is_adapter)
        except VllmAdminError:
            loaded[url] = None
    return loaded


def repair_aliases(settings: Settings, clients: LineClients) -> dict[str, tuple[SetAlias, ...]]:
    """Per line with a routing table or a recipe: MLflow's ``champion`` and ``canary``
    aliases moved to what the table serves, the moves made (none where they agree)."""
    from registry.rollout import repair_aliases as repair

    tables = clients.routes.snapshot().tables
    lines = sorted(set(settings.business_lines) | tables.keys())
    return {line: repair(clients.routes, clients.registry, line) for line in lines}


def lifecycle_check(
    settings: Settings, clients: LineClients, upstreams: Sequence[str]
) -> dict[str, Any]:
    """Per line: routing, MLflow aliases, what each replica serves, and what differs; plus the
    LoRA budget over all lines. ``ok`` is False on any drift."""
    registry = clients.registry
    snapshot = clients.routes.snapshot()
    loaded = loaded_adapters(clients, upstreams)
    lines: dict[str, Any] = {}
    problems: list[str] = []
    for line in sorted(set(settings.business_lines) | snapshot.tables.keys()):
        table = snapshot.table(line)
        aliases = registry.aliases(line)
        found = drift(table, aliases, loaded)
        problems += found
        lines[line] = {
            "routing": table.model_dump(),
            "aliases": aliases,
            "loaded": {
                url: [a for a in (names or []) if a.startswith(f"{line}-v")]
                for url, names in loaded.items()
            },
            "drift": found,
        }
    served, max_loras, over = _budget_check(settings, clients, snapshot.tables, upstreams)
    problems += over
    for url, names in loaded.items():
        others = [n for n in names or [] if not any(n.startswith(f"{line}-v") for line in lines)]
        if others:
            problems.append(f"{url} serves adapters of no configured line: {', '.join(others)}")
    return {
        "ok": not problems,
        "lines": lines,
        "budget": {"routed": served, "max_loras": max_loras},
        "problems": problems,
    }


def _budget_check(
    settings: Settings,
    clients: LineClients,
    tables: dict[str, RoutingTable],
    upstreams: Sequence[str],
) -> tuple[int, int, list[str]]:
    """(adapters routed to the fullest replica, the smallest --max-loras, each replica over
    its own --max-loras): the limits as the replicas recorded them, else as vLLM reports
    them, else ``FLYWHEEL_VLLM_MAX_LORAS``."""
    from registry.placement import adapters_by_replica
    from registry.replicas import over_limits, read_lora_limits

    records = {record.url: record for record in clients.replicas.all()}
    if not upstreams:
        budget = LoraBudget(settings.vllm_max_loras, tables)
        served = budget.most_on_one_replica()
        over = (
            []
            if served <= budget.max_loras
            else [
                f"{served} adapters are routed, over --max-loras {budget.max_loras} "
                f"(the setting FLYWHEEL_VLLM_MAX_LORAS): {budget.describe()}"
            ]
        )
        return served, budget.max_loras, over
    limits = read_lora_limits(
        upstreams,
        records,
        max_loras_setting=settings.vllm_max_loras,
        max_lora_rank_setting=settings.vllm_max_lora_rank,
    )
    held = adapters_by_replica(tables.values(), upstreams)
    served = max(len(adapters) for adapters in held.values())
    smallest = min(limit.max_loras for limit in limits.values())
    return served, smallest, over_limits(held, limits)
