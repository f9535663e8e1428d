"""Reading a user's files within bounds: lines, gzip, small YAML or JSON documents.

Whatever a file holds, reading it costs bounded memory and time. A line is read at most
:data:`MAX_LINE_BYTES` at a time; a longer one is skipped to its newline and comes back
as its first :data:`KEPT_BYTES` with its full size and digest (a 400 MB line in a 400 KB
gzip file costs a few MB, not 400). A gzip file is read to at most
:func:`decompression_bound` bytes, a multiple of its own size (a gzip bomb is refused,
not inflated). A configuration file is read whole only up to its caller's bound.

Every failure to read (missing, unreadable, corrupt gzip, not UTF-8, too large, not
valid YAML) is an :class:`~flywheel.errors.InputFileError` naming the file: exit 2 at
the command line.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

from flywheel.errors import InputFileError

MAX_LINE_BYTES = 8 * 1024 * 1024
# What is kept of a refused line or row: enough to see what it was.
KEPT_BYTES = 4 * 1024
_SKIP_CHUNK = 1024 * 1024
# A gzip file may decompress to this many times its size, and to this much whatever its
# size: JSON Lines of chat compress a few times (HH-RLHF's test split 4.4 times), a bomb
# a thousand times.
MAX_COMPRESSION_RATIO = 100
MIN_DECOMPRESSION_BOUND = 256 * 1024 * 1024
_READ_ERRORS = (OSError, EOFError, zlib.error)


@dataclass(frozen=True, slots=True)
class RawLine:
    """One physical line: its bytes, or only their start when it is over the bound.

    ``size`` counts the line's bytes but its final newline; ``digest`` (SHA-256 of the
    whole line) is set when ``data`` holds only the start.
    """

    number: int
    data: bytes
    size: int
    digest: str | None = None

    @property
    def oversized(self) -> bool:
        """Whether the line was over the bound, ``data`` holding only its start."""
        return self.digest is not None


def decompression_bound(compressed_bytes: int) -> int:
    """How many bytes a gzip file of ``compressed_bytes`` may decompress to."""
    return max(MIN_DECOMPRESSION_BOUND, MAX_COMPRESSION_RATIO * compressed_bytes)


def read_lines(
    stream: BinaryIO,
    *,
    source: str = "input",
    max_line_bytes: int = MAX_LINE_BYTES,
    max_total_bytes: int | None = None,
) -> Iterator[RawLine]:
    """The lines of a binary stream, each read at most ``max_line_bytes`` at a time; past
    ``max_total_bytes`` read in all, an :class:`InputFileError` naming ``source``."""
    number = total = 0
    while True:
        chunk = stream.readline(max_line_bytes + 1)
        if not chunk:
            return
        number += 1
        total += len(chunk)
        if len(chunk) <= max_line_bytes or chunk.endswith(b"\n"):
            _check_total(total, max_total_bytes, source)
            yield RawLine(number, chunk, len(chunk) - chunk.endswith(b"\n"))
            continue
        head, digest, size = chunk[:KEPT_BYTES], hashlib.sha256(chunk), len(chunk)
        del chunk
        while rest := stream.readline(_SKIP_CHUNK):
            total += len(rest)
            _check_total(total, max_total_bytes, source)
            digest.update(rest)
            size += len(rest)
            if rest.endswith(b"\n"):
                size -= 1
                break
        yield RawLine(number, head, size, digest.hexdigest())


def _check_total(total: int, bound: int | None, source: str) -> None:
    if bound is not None and total > bound:
        raise InputFileError(
            f"{source}: decompresses to more than {bound:,} bytes, the bound for a gzip file "
            f"of its size ({MAX_COMPRESSION_RATIO} times its size, at least "
            f"{_size(MIN_DECOMPRESSION_BOUND)}): refused as a likely gzip bomb; a genuine "
            "file can be given decompressed"
        )


@contextmanager
def open_user_file(path: Path) -> Iterator[tuple[BinaryIO, int | None]]:
    """``path`` opened for reading (``.gz``: decompressed), with its decompression bound
    (``None`` for a plain file); a file that cannot be opened is an :class:`InputFileError`."""
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise InputFileError(f"{path}: cannot be opened: {exc.strerror or exc}") from None
    with raw:
        if path.suffix != ".gz":
            yield raw, None
            return
        size = path.stat().st_size
        with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
            yield cast(BinaryIO, stream), decompression_bound(size)


def iter_user_lines(path: Path, *, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[RawLine]:
    """The lines of a user's ``.jsonl`` (or ``.jsonl.gz``) file, within bounds (see
    :func:`read_lines`); a file corrupt or cut short is an :class:`InputFileError`."""
    with open_user_file(path) as (stream, bound):
        try:
            yield from read_lines(
                stream, source=str(path), max_line_bytes=max_line_bytes, max_total_bytes=bound
            )
        except _READ_ERRORS as exc:
            raise InputFileError(f"{path}: cannot be read to the end: {exc}") from None


def read_user_text(path: Path, *, max_bytes: int, what: str = "file") -> str:
    """The whole text of a small file (UTF-8), at most ``max_bytes``; larger, unreadable or
    not UTF-8: an :class:`InputFileError` naming the file."""
    try:
        with path.open("rb") as source:
            data = source.read(max_bytes + 1)
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InputFileError(f"{path}: larger than {_size(max_bytes)}; a {what} is smaller")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{path}: not UTF-8 (byte {exc.start})") from None


def load_user_yaml(path: Path, *, max_bytes: int, what: str = "file") -> Any:
    """A small YAML (or JSON) document from a user's file, read within ``max_bytes``; not
    valid: an :class:`InputFileError` naming the file and where."""
    import yaml

    text = read_user_text(path, max_bytes=max_bytes, what=what)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputFileError(f"{path}: not valid YAML{at}: {problem}") from None


def _size(count: int) -> str:
    if count % (1024 * 1024) == 0:
        return f"{count // (1024 * 1024)} MB"
    return f"{count // 1024} KB"
