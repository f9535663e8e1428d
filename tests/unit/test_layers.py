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
7. ``cli`` (the command line)

An import from a lower layer into a higher one runs back up the house. The lab (``lab/``:
simulated users, the loop runner, benchmarks, the ``demo``, ``loop`` and ``simulate``
commands) stands beside the house: it drives the product, and the product never imports it.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from registry.routes import RouteStore

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
    "cli": 7,
}
# Imports allowed to run back up, each with its reason (at most two).
ALLOWED_BACK: dict[tuple[str, str], str] = {}


def _package(module: str) -> str | None:
    top = module.split(".", 1)[0]
    return top if top in LAYERS else None


def _imports_of(path: Path) -> list[tuple[str, str]]:
    """(the file's module, imported module) for each absolute import in one file."""
    module = ".".join(path.relative_to(REPO).with_suffix("").parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(module, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((module, node.module))
    return found


def _imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every product module."""
    found = []
    for package in LAYERS:
        folder = REPO / package
        if not folder.is_dir():
            continue
        for path in folder.rglob("*.py"):
            if "migrations" not in path.relative_to(REPO).parts:
                found += _imports_of(path)
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


# The product's one import of the lab: the command line loads the lab's commands when one
# of them runs (or help lists them), through its command group.
LAB_HOOKS = {("cli.main", "lab.commands")}


def test_the_product_never_imports_the_lab() -> None:
    # Every Python file outside lab/ and tests/: the product, and whatever else the tree holds.
    skipped = {"lab", "tests"}
    found = set()
    for folder in REPO.iterdir():
        if folder.is_dir() and not folder.name.startswith(".") and folder.name not in skipped:
            for path in folder.rglob("*.py"):
                found |= {
                    (module, imported)
                    for module, imported in _imports_of(path)
                    if imported.split(".", 1)[0] == "lab"
                }
    assert found <= LAB_HOOKS, "\n".join(f"{a} -> {b}" for a, b in sorted(found - LAB_HOOKS))


# RouteStore's one write, which the rollout's door makes (tests arrange tables with
# tests/routing.py, itself a caller of it).
ROUTE_WRITES = {"change"}
# Modules outside registry/ still writing a routing table themselves, each with its reason.
ROUTE_WRITERS_ALLOWED: dict[str, str] = {
    "composition.experiments": "an A/B experiment's split in and out of the table: not yet an "
    "event of the state machine (it refuses a candidate while one is live)",
}


def _route_writers() -> set[str]:
    """Product modules outside ``registry`` that call one of RouteStore's writes."""
    found = set()
    for package in LAYERS:
        if package == "registry" or not (REPO / package).is_dir():
            continue
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ROUTE_WRITES
                ):
                    found.add(".".join(path.relative_to(REPO).with_suffix("").parts))
    return found


def test_only_the_registry_writes_routing_tables() -> None:
    # Every other change of a line's routing goes through registry.rollout's door, which
    # advances the state machine and applies its effects (loads, aliases, unloads) with it.
    writers = _route_writers()
    assert writers <= ROUTE_WRITERS_ALLOWED.keys(), sorted(writers - ROUTE_WRITERS_ALLOWED.keys())
    assert ROUTE_WRITERS_ALLOWED.keys() <= writers, "an allowed writer no longer writes: drop it"


def test_the_route_store_has_one_write() -> None:
    # The table-only writers (set_canary, clear_canary, ...) live in tests/routing.py: a
    # convenience write on RouteStore would be a second door to the rollout.
    public = {name for name in vars(RouteStore) if not name.startswith("_")}
    assert public == {"change", "table", "snapshot", "history"}


# Each table of the one database and the package that owns it: the one that declares it.
TABLE_OWNERS: dict[str, set[str]] = {
    "feedback": {
        "interactions",
        "feedback_events",
        "quarantine",
        "shadow_outputs",
        "line_watermarks",
        "signal_rollup",
        "rollup_watermarks",
        "forgotten_users",
        "trained_records",
    },
    "registry": {
        "routes",
        "route_changes",
        "canary_decisions",
        "experiments",
        "experiment_looks",
        "experiment_tallies",
        "experiment_tally_marks",
        "replicas",
    },
    "dashboard": {"dashboard_sessions", "review_claims"},
}


def _named(node: ast.expr) -> str:
    return getattr(node, "id", None) or getattr(node, "attr", "")


def _declared_tables() -> list[tuple[str, str]]:
    """(declaring module, table name) for each ``__tablename__ = "name"`` and each
    ``Table("name", <a metadata>, ...)`` in the product."""
    found = []
    for package in LAYERS:
        for path in (REPO / package).rglob("*.py") if (REPO / package).is_dir() else ():
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Assign)
                    and any(_named(target) == "__tablename__" for target in node.targets)
                    and isinstance(node.value, ast.Constant)
                ):
                    found.append((module, str(node.value.value)))
                elif (
                    isinstance(node, ast.Call)
                    and _named(node.func) == "Table"
                    and len(node.args) >= 2
                    and isinstance(node.args[0], ast.Constant)
                    and _named(node.args[1]).endswith("metadata")
                ):
                    found.append((module, str(node.args[0].value)))
    return found


def test_each_table_is_declared_once_by_its_owner() -> None:
    owner_of = {table: package for package, tables in TABLE_OWNERS.items() for table in tables}
    declared = _declared_tables()
    names = [table for _, table in declared]
    assert not {t for t in names if names.count(t) > 1}, "declared twice"
    misplaced = [(m, t) for m, t in declared if _package(m) != owner_of.get(t)]
    assert not misplaced, "\n".join(f"{m} declares {t}, {owner_of.get(t)}'s" for m, t in misplaced)
    assert set(names) == set(owner_of)
    # One migration history compares against them all: composition.tables loads each owner's.
    from composition.tables import metadata

    assert set(metadata.tables) == set(owner_of)


# The flows compose the packages and hold no business logic: they read like a table of
# contents, and so does the command line, one short function per step.
FLOWS_MAX_LINES = 1_500
FUNCTION_MAX_LINES = 60


def test_the_flows_stay_a_table_of_contents() -> None:
    lines = {
        str(path.relative_to(REPO)): len(path.read_text(encoding="utf-8").splitlines())
        for path in (REPO / "flows").rglob("*.py")
    }
    biggest = ", ".join(f"{p} {n}" for p, n in sorted(lines.items(), key=lambda i: -i[1])[:3])
    assert sum(lines.values()) < FLOWS_MAX_LINES, f"{sum(lines.values())} lines ({biggest})"


def _long_functions(package: str) -> list[str]:
    """Each function of ``package`` of FUNCTION_MAX_LINES lines or more, with its length."""
    found = []
    for path in (REPO / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length >= FUNCTION_MAX_LINES:
                    found.append(f"{path.relative_to(REPO)}:{node.name} {length} lines")
    return found


def test_no_function_of_the_flows_or_the_command_line_runs_long() -> None:
    # A long body is a use case that belongs to the package that owns it, or steps to name.
    long = _long_functions("flows") + _long_functions("cli")
    assert not long, "\n".join(sorted(long))
