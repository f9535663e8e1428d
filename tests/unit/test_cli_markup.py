"""User text is never read as rich markup: the command line's consoles are checked in its code.

Rich reads ``[bold]``, ``[/]`` and the like in what a console prints (strings, table cells,
titles) and in a status or progress line; text from a user (a record, a reason quoting it,
a file name, an exception's message) holding such a tag is then restyled, or refused
with a MarkupError traceback. So the command line's consoles are made with
``markup=False``, styles are given as ``rich.text.Text`` (never parsed), and a status or
progress line takes plain text. This reads ``cli/`` and the progress bars for any way
back to markup.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECKED = [*sorted((REPO / "cli").rglob("*.py")), REPO / "flywheel" / "progress.py"]
STYLES = "bold|dim|italic|underline|reverse|strike|red|green|yellow|blue|magenta|cyan|white"
# A rich tag in a literal: printed as is by a console without markup, so a style lost.
TAG = re.compile(rf"\[/\]|\[/?(?:{STYLES})\b[^\]\[]*\]")
TEXT_CALLS = {"Text", "assemble"}


def _called(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return None


def _is_false(call: ast.Call, keyword: str) -> bool:
    value = next((k.value for k in call.keywords if k.arg == keyword), None)
    return isinstance(value, ast.Constant) and value.value is False


def _literal(node: ast.expr) -> str | None:
    """A string constant's text, or None."""
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _problems(path: Path, root: Path = REPO) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = path.relative_to(root)
    for node in ast.walk(tree):
        at = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module in {"rich", "rich.markup"}:
            names = {alias.name for alias in node.names} & {"print", "escape", "render"}
            if names:
                yield f"{at}: imports {', '.join(sorted(names))} from {node.module}"
        text = _literal(node) if isinstance(node, ast.Constant) else None
        if text is not None and TAG.search(text):
            yield f"{at}: a rich tag in a literal: {TAG.search(text).group()}"  # type: ignore[union-attr]
        if not isinstance(node, ast.Call):
            continue
        name = _called(node)
        for keyword in node.keywords:
            if keyword.arg == "markup" and not _is_false(node, "markup"):
                yield f"{at}: markup={ast.unparse(keyword.value)}"
        if name in {"Console", "TextColumn"} and not _is_false(node, "markup"):
            yield f"{at}: {name} without markup=False"
        if name == "from_markup":
            yield f"{at}: Text.from_markup"
        if name == "status" and node.args:
            first = node.args[0]
            if _called(first) not in TEXT_CALLS and _literal(first) is None:
                yield f"{at}: a status line is read as markup: give it a Text"


def test_no_console_reads_markup() -> None:
    problems = [problem for path in CHECKED for problem in _problems(path)]
    assert not problems, "\n".join(problems)


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "out = Console(stderr=True)\n"
        "err.print('[yellow]quarantined[/]', message)\n"
        "err.print(message, markup=True)\n"
        "out.status(f'cleaning {line}')\n"
        "TextColumn('{task.description}')\n"
        "from rich.markup import escape\n"
        "err = Console(stderr=True, markup=False)\n"
        "err.print(Text.assemble(('error:', 'red'), f' {exc}'))\n"
        "out.status(Text(f'cleaning {line}'))\n"
        "TextColumn('{task.description}', markup=False)\n"
        "out.print('a list [1, 2] and [default: x]')\n",
        encoding="utf-8",
    )
    found = [problem.split(":")[1] for problem in _problems(sample, tmp_path)]
    assert sorted(found, key=int) == ["1", "2", "3", "4", "5", "6"]
