"""Clients are built in one place: ``composition/clients.py`` (issue 16).

Every call in the product packages is read; a call that constructs a client — the
feedback store (``FeedbackStore.open``), its routing tables (``RouteStore(...)``), the
MLflow registry (``Registry.for_home``), a vLLM admin client (``VllmAdminClient(...)``),
the PII scrubber (``build_scrubber(...)``) or Redis (``redis.Redis(...)``,
``....from_url(...)``) — anywhere else fails the test with its file and line. Code that
needs one takes it as an argument, or asks the edge's set (``composition.clients``).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (
    "flywheel",
    "feedback",
    "training",
    "eval",
    "registry",
    "gateway",
    "dashboard",
    "composition",
    "flows",
    "simulation",
    "cli",
)
THE_ONE_PLACE = "composition/clients.py"
# (file, enclosing class.function, constructor): each with its reason.
JUSTIFIED: dict[tuple[str, str, str], str] = {}


def _called(node: ast.Call) -> str | None:
    """The constructor a call names, when it is one of the clients'."""
    func = node.func
    if isinstance(func, ast.Name) and func.id in {"RouteStore", "VllmAdminClient"}:
        return func.id
    if isinstance(func, ast.Name) and func.id == "build_scrubber":
        return "build_scrubber"
    if isinstance(func, ast.Attribute):
        owner = func.value
        owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
        if func.attr in {"RouteStore", "VllmAdminClient", "build_scrubber"}:
            return func.attr
        if (owner_name, func.attr) in {("FeedbackStore", "open"), ("Registry", "for_home")}:
            return f"{owner_name}.{func.attr}"
        if func.attr == "Redis" and owner_name == "redis":
            return "redis.Redis"
        if func.attr == "from_url":
            return f"{owner_name}.from_url"
    return None


def _constructions(path: Path) -> list[tuple[int, str, str]]:
    """(line, enclosing function, constructor) for every client built in ``path``."""
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, where: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inside = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inside = [*where, child.name]
            if isinstance(child, ast.Call) and (name := _called(child)) is not None:
                found.append((child.lineno, ".".join(where) or "<module>", name))
            visit(child, inside)

    visit(ast.parse(path.read_text(encoding="utf-8")), [])
    return found


def _outside_the_one_place() -> list[str]:
    rows = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative == THE_ONE_PLACE or "/migrations/" in relative:
                continue
            for line, where, name in _constructions(path):
                if (relative, where, name) not in JUSTIFIED:
                    rows.append(f"{relative}:{line} {name}(...) in {where}")
    return rows


def test_no_client_is_built_outside_composition_clients() -> None:
    found = _outside_the_one_place()
    assert not found, "clients built outside composition/clients.py:\n" + "\n".join(found)


def test_the_one_place_builds_every_client() -> None:
    built = {name for _, _, name in _constructions(REPO / THE_ONE_PLACE)}
    assert {
        "FeedbackStore.open",
        "RouteStore",
        "Registry.for_home",
        "VllmAdminClient",
        "build_scrubber",
        "Redis.from_url",
    } <= built, built


def test_the_reader_finds_each_kind_of_construction(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import redis\n"
        "def f(settings, engine):\n"
        "    FeedbackStore.open(settings)\n"
        "    routes.RouteStore(engine)\n"
        "    Registry.for_home(settings.home)\n"
        "    with VllmAdminClient('http://x') as c: pass\n"
        "    build_scrubber(settings.scrubber)\n"
        "    redis.Redis(host='h')\n"
        "    redis.asyncio.Redis.from_url('redis://h')\n"
    )
    names = [name for _, _, name in _constructions(sample)]
    assert names == [
        "FeedbackStore.open",
        "RouteStore",
        "Registry.for_home",
        "VllmAdminClient",
        "build_scrubber",
        "redis.Redis",
        "Redis.from_url",
    ]
