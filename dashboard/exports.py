"""The visible bucket as a file: CSV for spreadsheets, JSONL for programs.

A spreadsheet reads a cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a
carriage return as a formula (``=HYPERLINK(...)`` in a prompt becomes a live link
that can leak the sheet's other cells). Every CSV cell is text here, and the ids,
adapter names, prompts, answers and edits come from callers, so every cell is
checked, not only the free-text ones: one that starts with such a character gets
a leading ``'`` (OWASP's advice; the spreadsheet shows the text, not a formula).
The JSONL export is not for spreadsheets and keeps every text exactly.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import orjson

from dashboard.lineage import DatasetIndex
from dashboard.scrubbed import Sample

CSV_COLUMNS = (
    "request_id", "created_at", "adapter", "status", "signals",
    "prompt", "response", "edit", "pii_replaced", "training",
)  # fmt: skip
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_cell(text: str) -> str:
    """``text`` as a spreadsheet shows it as text: prefixed with ``'`` when it starts
    like a formula, unchanged otherwise."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def _training_of(uses: DatasetIndex, line: str, sample: Sample) -> list[dict[str, str]]:
    return [use.as_dict() for use in uses.uses(line, sample.request_id)]


def csv_lines(rows: Iterator[Sample], line: str, uses: DatasetIndex) -> Iterator[str]:
    """The samples as CSV, a header then one record per sample, every cell spreadsheet-safe."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    yield buffer.getvalue()
    for sample in rows:
        buffer.seek(0)
        buffer.truncate()
        training = _training_of(uses, line, sample)
        cells = [
            sample.request_id,
            sample.created_at.isoformat(),
            sample.adapter,
            sample.status,
            "|".join(sample.signals),
            sample.prompt,
            sample.response,
            sample.edit or "",
            orjson.dumps(sample.pii).decode(),
            "|".join(f"{u['dataset']}:{u['kind']}:{u['split']}" for u in training),
        ]
        writer.writerow([spreadsheet_cell(cell) for cell in cells])
        yield buffer.getvalue()


def jsonl_lines(rows: Iterator[Sample], line: str, uses: DatasetIndex) -> Iterator[bytes]:
    """The samples as JSON lines with their training use, texts exactly as scrubbed."""
    for sample in rows:
        body = sample.as_dict() | {"training": _training_of(uses, line, sample)}
        yield orjson.dumps(body) + b"\n"
