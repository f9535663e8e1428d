"""``flywheel dedup``: mark exact and near-duplicate records of a JSONL file."""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from feedback.dedup import DedupBatch, DedupDecision, DedupInputError
from feedback.jsonl import JsonlRecord, MalformedLine, dumps_line, iter_jsonl
from flywheel.progress import progress_bar
from flywheel.settings.cleaning import DedupSettings


def dedup(
    in_path: Annotated[
        Path,
        typer.Option(
            "--in",
            help="Input JSONL file, one record per line.",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ],
    out_path: Annotated[
        Path,
        typer.Option(
            "--out", help="Output JSONL file (replaced when the run ends).", dir_okay=False
        ),
    ],
    field: Annotated[
        str, typer.Option("--field", help="Record field holding the text to compare.")
    ],
    max_kept: Annotated[
        int,
        typer.Option("--max-kept", min=1, help="Earliest records kept per cluster (flood cap)."),
    ] = 1,
    threshold: Annotated[
        float,
        typer.Option("--threshold", help="Estimated Jaccard similarity at which records merge."),
    ] = 0.7,
    exact_only: Annotated[
        bool, typer.Option("--exact-only", help="Skip the near-duplicate search.")
    ] = False,
) -> None:
    """Mark exact and near-duplicate records, per business line and signal.

    Every good input record is written, in input order, with "cluster" (the
    input line of the cluster's first record), "keep" and "dedup_reason"
    (e.g. "near_duplicate_of:17", naming an input line) added or replaced.
    The earliest records of a cluster (by "created_at", then input order) are
    kept. Bad lines are reported on stderr and left out; the exit code is then 1.
    """
    settings = _dedup_settings(threshold, max_kept, exact_only)
    _check_paths(in_path, out_path)
    try:
        bad_lines = _mark_duplicates(in_path, out_path, field, settings)
    except OSError as exc:
        typer.echo(f"error: {exc.filename or in_path}: {exc.strerror or exc}", err=True)
        raise typer.Exit(1) from None
    if bad_lines:
        typer.echo(f"{in_path}: {bad_lines} bad line(s) left out of {out_path}", err=True)
        raise typer.Exit(1)


def _dedup_settings(threshold: float, max_kept: int, exact_only: bool) -> DedupSettings:
    """The options as dedup settings; exit 2 on a bad one."""
    try:
        return DedupSettings(
            threshold=threshold, max_kept_per_cluster=max_kept, near_duplicates=not exact_only
        )
    except ValidationError as exc:
        problems = "; ".join(error["msg"].removeprefix("Value error, ") for error in exc.errors())
        typer.echo(f"error: invalid dedup settings: {problems}", err=True)
        raise typer.Exit(2) from None


def _check_paths(in_path: Path, out_path: Path) -> None:
    """Exit 2 when the output would replace the input or has no folder to go in."""
    if in_path.resolve() == out_path.resolve():
        typer.echo("error: --out must be a different file from --in", err=True)
        raise typer.Exit(2)
    if not out_path.parent.is_dir():
        typer.echo(f"error: {out_path.parent} is not a directory; create it first", err=True)
        raise typer.Exit(2)


def _mark_duplicates(in_path: Path, out_path: Path, field: str, settings: DedupSettings) -> int:
    """Two streaming passes: sign every record, then write each with its decision."""
    source = str(in_path)
    batch = DedupBatch(field=field, settings=settings)
    good_lines = array("q")
    bad_lines = 0
    with progress_bar(f"signing {in_path.name}") as advance:
        for item in iter_jsonl(in_path):
            advance(1)
            if isinstance(item, MalformedLine):
                typer.echo(item.describe(source), err=True)
                bad_lines += 1
                continue
            try:
                batch.add(item.data)
            except DedupInputError as exc:
                typer.echo(f"{source}:{item.line_number}: {exc}", err=True)
                bad_lines += 1
                continue
            good_lines.append(item.line_number)
    decisions = batch.decide()

    # Written beside the target and renamed at the end, so a failed run never
    # leaves a half-written output behind.
    partial = out_path.with_name(f".{out_path.name}.partial")
    try:
        with (
            progress_bar(f"writing {out_path.name}", total=len(decisions)) as advance,
            partial.open("wb") as sink,
        ):
            for position, record in enumerate(_good_records(in_path, good_lines)):
                sink.write(dumps_line(_with_decision(record, decisions[position], good_lines)))
                advance(1)
        os.replace(partial, out_path)
    finally:
        partial.unlink(missing_ok=True)

    kept = sum(decision.keep for decision in decisions)
    clusters = len({decision.cluster for decision in decisions})
    typer.echo(f"{out_path}: {len(decisions)} records, {clusters} clusters, {kept} kept", err=True)
    return bad_lines


def _good_records(in_path: Path, good_lines: array[int]) -> Iterator[JsonlRecord]:
    expected = iter(good_lines)
    wanted = next(expected, None)
    for item in iter_jsonl(in_path):
        if isinstance(item, JsonlRecord) and item.line_number == wanted:
            yield item
            wanted = next(expected, None)
    if wanted is not None:
        raise OSError(f"{in_path} changed while it was being read")


def _with_decision(
    record: JsonlRecord, decision: DedupDecision, lines: array[int]
) -> dict[str, Any]:
    reason = decision.kind.value
    if decision.ref is not None:
        reason = f"{reason}:{lines[decision.ref]}"
    return {
        **record.data,
        "cluster": lines[decision.cluster],
        "keep": decision.keep,
        "dedup_reason": reason,
    }
