"""Streaming JSON Lines reading that never loses a line.

Every physical line of the input comes back either as a parsed object or as a
:class:`MalformedLine` that names the line and says what is wrong with it, with
the raw bytes kept so a caller can quarantine it untouched (of a line over
:data:`MAX_LINE_BYTES`, only its start: files are read through
:mod:`flywheel.user_files`, which never holds such a line whole).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from flywheel.user_files import MAX_LINE_BYTES, RawLine, iter_user_lines, read_lines


@dataclass(frozen=True, slots=True)
class JsonlRecord:
    """One well-formed JSON object and the 1-based line it came from."""

    line_number: int
    data: dict[str, Any]
    raw: bytes


@dataclass(frozen=True, slots=True)
class MalformedLine:
    """A line that is not a JSON object, with the reason and the raw bytes.

    Of a line over :data:`MAX_LINE_BYTES`, ``raw`` holds only the start: ``size`` is then
    the whole line's size and ``digest`` its SHA-256.
    """

    line_number: int
    reason: str
    raw: bytes
    size: int | None = None
    digest: str | None = None

    def describe(self, source: str = "input") -> str:
        """A one-line message naming the source and the line."""
        return f"{source}:{self.line_number}: {self.reason}"


JsonlItem = JsonlRecord | MalformedLine


def parse_jsonl_line(line_number: int, raw: bytes) -> JsonlItem | None:
    """Parse one physical line; ``None`` for a blank line (blank lines are allowed)."""
    stripped = raw.strip()
    if not stripped:
        return None
    if len(stripped) > MAX_LINE_BYTES:
        return MalformedLine(line_number, _too_long(len(stripped)), raw)
    try:
        stripped.decode("utf-8")
    except UnicodeDecodeError as exc:
        return MalformedLine(line_number, f"invalid UTF-8 at byte {exc.start}", raw)
    try:
        data = orjson.loads(stripped)
    except orjson.JSONDecodeError as exc:
        return MalformedLine(line_number, f"not valid JSON: {exc}", raw)
    if not isinstance(data, dict):
        return MalformedLine(line_number, f"expected a JSON object, got {type(data).__name__}", raw)
    return JsonlRecord(line_number, data, raw)


def _too_long(size: int) -> str:
    return f"line is {size:,} bytes, over the {MAX_LINE_BYTES:,} limit"


def parse_raw_line(line: RawLine) -> JsonlItem | None:
    """Parse one line read within bounds; an over-long one is malformed, its start kept."""
    if line.oversized:
        return MalformedLine(line.number, _too_long(line.size), line.data, line.size, line.digest)
    return parse_jsonl_line(line.number, line.data)


def iter_jsonl_lines(lines: Iterable[bytes]) -> Iterator[JsonlItem]:
    """Parse an iterable of raw lines (bytes in memory, newline optional) into items."""
    for line_number, raw in enumerate(lines, start=1):
        item = parse_jsonl_line(line_number, raw)
        if item is not None:
            yield item


def _parsed(lines: Iterable[RawLine]) -> Iterator[JsonlItem]:
    for line in lines:
        item = parse_raw_line(line)
        if item is not None:
            yield item


def iter_jsonl_stream(stream: BinaryIO, source: str = "input") -> Iterator[JsonlItem]:
    """Parse a binary stream line by line, in bounded memory (see :mod:`flywheel.user_files`)."""
    yield from _parsed(read_lines(stream, source=source))


def iter_jsonl(path: Path) -> Iterator[JsonlItem]:
    """Parse a user's ``.jsonl`` (or ``.jsonl.gz``) file line by line, in bounded memory;
    a file that cannot be read is an :class:`~flywheel.errors.InputFileError`."""
    yield from _parsed(iter_user_lines(path))


def dumps_line(data: Any) -> bytes:
    """Serialise one record as a JSONL line (UTF-8, newline-terminated)."""
    return orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS) + b"\n"
