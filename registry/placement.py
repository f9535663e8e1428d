"""Where each business line's adapters live across the vLLM replicas (pure).

Each vLLM replica keeps at most ``--max-loras`` adapters in GPU memory, so loading
every line's adapters on every replica spends that budget once per replica. A
placement (``RoutingTable.replicas``) puts a line's adapters on some replicas
only; :func:`plan_placement` proposes one from each line's traffic:

- a hot line (at least ``hot_share`` of all requests in the window) goes on every
  replica: it needs their throughput;
- a cold line is packed onto ``cold_replicas`` replicas, picked by rendezvous
  (highest-random-weight) hashing: each line ranks the replicas by a hash of its
  name with each replica's URL and takes the top ones. A line's ranking does not
  depend on the other lines or replicas, so adding a replica moves only the cold
  lines that now rank it on top (about 1/N of them) and removing one moves only
  the lines that were on it;
- with one replica, or no more replicas than ``cold_replicas``, every line is on
  every replica.

The gateway sends a placed line's requests to its replicas first and fails over
to the others only when none of them is up; the rollout loads a line's adapters
only where it is placed; ``flywheel placement plan --apply`` moves them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

from registry.routing import RoutingTable

Placement = tuple[str, ...] | None


def replica_url(url: str) -> str:
    """A replica's root URL as the gateway and the placement spell it (no trailing slash)."""
    return url.rstrip("/")


def rendezvous_order(line: str, replicas: Iterable[str]) -> list[str]:
    """``replicas`` ranked for ``line``, highest rendezvous weight first."""

    def weight(url: str) -> int:
        digest = hashlib.blake2b(f"{line}\x1f{url}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big")

    return sorted({replica_url(url) for url in replicas}, key=lambda url: (-weight(url), url))


def traffic_shares(requests_per_line: Mapping[str, int]) -> dict[str, float]:
    """Each line's share of all requests (0 for every line when there were none)."""
    total = sum(max(count, 0) for count in requests_per_line.values())
    return {
        line: (max(count, 0) / total if total else 0.0) for line, count in requests_per_line.items()
    }


def plan_placement(
    requests_per_line: Mapping[str, int],
    replicas: Sequence[str],
    *,
    hot_share: float = 0.25,
    cold_replicas: int = 1,
) -> dict[str, Placement]:
    """Each line's placement: None (every replica) for a line with at least ``hot_share``
    of the requests, or when there are no more replicas than ``cold_replicas``; otherwise
    the line's top ``cold_replicas`` replicas by rendezvous hashing, in ``replicas``' order.
    A window without requests makes every line cold."""
    if not 0 < hot_share <= 1:
        raise ValueError(f"hot_share must be in (0, 1], not {hot_share}")
    if cold_replicas < 1:
        raise ValueError(f"cold_replicas must be at least 1, not {cold_replicas}")
    urls = list(dict.fromkeys(replica_url(url) for url in replicas))
    if not urls:
        raise ValueError("no replicas to place lines on")
    shares = traffic_shares(requests_per_line)
    plan: dict[str, Placement] = {}
    for line in sorted(requests_per_line):
        if len(urls) <= cold_replicas or shares[line] >= hot_share:
            plan[line] = None
            continue
        chosen = set(rendezvous_order(line, urls)[:cold_replicas])
        plan[line] = tuple(url for url in urls if url in chosen)
    return plan


def placed_replicas(placement: Sequence[str] | None, replicas: Sequence[str]) -> tuple[str, ...]:
    """The replicas of ``replicas`` a placement names, in ``replicas``' order; all of them
    when the placement is None or names none of them (a stale placement never strands a
    line)."""
    urls = tuple(replica_url(url) for url in replicas)
    if placement is None:
        return urls
    wanted = {replica_url(url) for url in placement}
    return tuple(url for url in urls if url in wanted) or urls


def placed(table: RoutingTable, replicas: Sequence[str]) -> tuple[str, ...]:
    """The replicas of ``replicas`` that hold ``table``'s line (see :func:`placed_replicas`)."""
    return placed_replicas(table.replicas, replicas)


def placement_moves(
    before: Placement, after: Placement, replicas: Sequence[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(replicas that gain the line, replicas that lose it) when its placement changes from
    ``before`` to ``after``."""
    old, new = placed_replicas(before, replicas), placed_replicas(after, replicas)
    return tuple(u for u in new if u not in old), tuple(u for u in old if u not in new)


def adapters_by_replica(
    tables: Iterable[RoutingTable], replicas: Sequence[str]
) -> dict[str, set[str]]:
    """Per replica, the adapters the tables place on it (each may be requested at any time)."""
    held: dict[str, set[str]] = {replica_url(url): set() for url in replicas}
    for table in tables:
        for url in placed(table, replicas):
            held[url] |= table.adapters
    return held
