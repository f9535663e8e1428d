"""The house drawn from the code's imports: layers that only look down, no package cycles.

Every ``import`` and ``from ... import`` in the product packages is read (at module level
and inside functions alike: a lazy import is still a dependency). Layers, lowest first:

0. ``flywheel`` (settings tree, errors, processes, file modes)
1. ``feedback`` (events, store, cleaning), ``training`` (trainer and its config)
2. ``eval`` (offline metrics, the gate and its policy)
3. ``registry`` (MLflow, the rollout state machine, routing table, canary policy)
4. ``gateway``, ``dashboard`` (the two servers)
5. ``composition`` (recipes composing the policies, the servers' entry points)
6. ``flows`` (Prefect flows)
7. ``simulation`` (simulated users and the loop runner, which drives the flows)
8. ``cli`` (the command line)

An import from a lower layer into a higher one runs back up the house.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS: dict[str, int] = {
    "flywheel": 0,
    "feedback": 1,
    "training": 1,
    "eval": 2,
    "registry": 3,
    "gateway": 4,
    "dashboard": 4,
    "composition": 5,
    "flows": 6,
    "simulation": 7,
    "cli": 8,
}
# Imports allowed to run back up, each with its reason (at most two).
ALLOWED_BACK: dict[tuple[str, str], str] = {}


def _package(module: str) -> str | None:
    top = module.split(".", 1)[0]
    return top if top in LAYERS else None


def _imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every product module."""
    found = []
    for package in LAYERS:
        folder = REPO / package
        if not folder.is_dir():
            continue
        for path in folder.rglob("*.py"):
            relative = path.relative_to(REPO).with_suffix("")
            if "migrations" in relative.parts:
                continue
            module = ".".join(relative.parts)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    found += [(module, alias.name) for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.append((module, node.module))
    return [(a, b) for a, b in found if _package(b) is not None]


def test_at_most_two_imports_run_back_up_the_layers() -> None:
    back = sorted(
        (a, b) for a, b in _imports() if LAYERS[_package(b) or ""] > LAYERS[_package(a) or ""]
    )
    unexplained = [pair for pair in back if pair not in ALLOWED_BACK]
    assert not unexplained, "\n".join(f"{a} -> {b}" for a, b in unexplained)
    assert len(back) <= 2


def test_no_package_depends_on_itself_through_another() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in _imports():
        pa, pb = _package(a), _package(b)
        if pa and pb and pa != pb and (a, b) not in ALLOWED_BACK:
            graph[pa].add(pb)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph[start]:
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    cycles = sorted(p for p in list(graph) if reaches(p, p, {p}))
    assert not cycles, cycles


def test_the_canary_judge_and_the_gate_never_climb_into_flows_or_servers() -> None:
    # The decisions are pure: the flows call them, never the other way round.
    for module in ("registry.canary", "registry.lifecycle", "eval.gate", "registry.shadow"):
        imported = {b for a, b in _imports() if a == module}
        assert not {b for b in imported if _package(b) in {"flows", "cli", "gateway"}}, module
