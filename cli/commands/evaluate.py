"""``flywheel eval``: a data scientist's own preference pairs against a line's model.

The pairs file is read, never stored. The chosen model (the base model, a
registered adapter version, or the line's champion) scores each pair's chosen
and rejected answer by mean log-probability per answer token, as the offline
evaluation of the nightly does (:mod:`eval.offline`); an adapter is also
compared with the base model on the same pairs (:mod:`eval.paired`).
Accuracies come with Wilson intervals, the comparison with Newcombe's paired
interval and the exact McNemar p-value. The result is printed, written as
JSON with ``--json``, and logged to MLflow as an evaluation run of the line's
experiment (tagged ``flywheel.run_kind=evaluation``: it trains nothing and
registers nothing).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.table import Table
from rich.text import Text

from cli.commands.common import clients, err, out
from flywheel.errors import UsageError
from flywheel.settings import load_settings

if TYPE_CHECKING:
    from eval.paired import PairedComparison
    from feedback.importers.hh_rlhf import PreferencePair
    from registry.tracking import Registry

TAG_RUN_KIND = "flywheel.run_kind"
RUN_KIND = "evaluation"
ARTIFACT = "eval/pairs_eval.json"
SCORING = "mean log-probability per answer token, chosen > rejected (a tie is a loss)"
CONFIDENCE = 0.95
SHOWN_SKIPS = 5
# Skipped rows whose reasons are kept (all are counted), and how much of each reason.
KEPT_SKIPS = 100
KEPT_REASON_CHARS = 500


@dataclass(frozen=True, slots=True)
class PairsFile:
    """The usable pairs of a file, how many rows were not usable, and the first
    :data:`KEPT_SKIPS` of those (line, reason)."""

    pairs: tuple[PreferencePair, ...]
    skipped: tuple[tuple[int, str], ...]
    skipped_rows: int


@dataclass(frozen=True, slots=True)
class ModelScore:
    """One model's results on the pairs: per-pair correctness and the mean margin."""

    name: str
    version: int | None
    wins: tuple[bool, ...]
    mean_margin: float

    @property
    def accuracy(self) -> float:
        """Share of pairs whose chosen answer scored higher."""
        return sum(self.wins) / len(self.wins)

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """The Wilson interval of the accuracy."""
        from flywheel.intervals import wilson_interval

        return wilson_interval(sum(self.wins), len(self.wins), confidence)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, without the per-pair vector."""
        low, high = self.interval()
        return {
            "name": self.name,
            "version": self.version,
            "preference_accuracy": self.accuracy,
            "accuracy_low": low,
            "accuracy_high": high,
            "confidence": CONFIDENCE,
            "mean_margin": self.mean_margin,
        }


def read_pairs_file(path: Path, pair_format: str | None, limit: int | None) -> PairsFile:
    """The first ``limit`` usable pairs of ``path`` and the rows skipped before them, read
    within bounds (:mod:`flywheel.user_files`: a file that cannot be read is an
    :class:`~flywheel.errors.InputFileError`)."""
    from feedback.importers.pairs import iter_pairs_file, read_pairs
    from feedback.jsonl import MalformedLine

    pairs: list[PreferencePair] = []
    skipped: list[tuple[int, str]] = []
    skipped_rows = 0
    for parsed in read_pairs(iter_pairs_file(path), pair_format):  # type: ignore[arg-type]
        if isinstance(parsed, MalformedLine):
            skipped_rows += 1
            if len(skipped) < KEPT_SKIPS:
                skipped.append((parsed.line_number, parsed.reason[:KEPT_REASON_CHARS]))
            continue
        pairs.append(parsed[1])
        if limit is not None and len(pairs) >= limit:
            break
    return PairsFile(tuple(pairs), tuple(skipped), skipped_rows)


def evaluation_result(
    line: str,
    pairs_file: Path,
    pair_format: str | None,
    data: PairsFile,
    model: ModelScore,
    base: ModelScore | None,
) -> tuple[dict[str, Any], PairedComparison | None]:
    """The JSON document of one evaluation, and the paired comparison with the base (pure)."""
    from eval.paired import compare_paired

    comparison = (
        compare_paired(model.wins, base.wins, confidence=CONFIDENCE) if base is not None else None
    )
    result: dict[str, Any] = {
        "business_line": line,
        "pairs_file": str(pairs_file),
        "format": pair_format or "auto",
        "pairs": len(data.pairs),
        "skipped_rows": data.skipped_rows,
        "skipped": [{"line": n, "reason": why} for n, why in data.skipped],
        "scoring": SCORING,
        "model": model.as_dict(),
        "base": base.as_dict() if base is not None else None,
        "paired_vs_base": comparison.as_dict() if comparison is not None else None,
        "pair_wins": {"model": list(model.wins), "base": list(base.wins) if base else None},
    }
    return result, comparison


def evaluation_metrics(result: dict[str, Any]) -> dict[str, float]:
    """What goes to MLflow as metrics: counts, both models' numbers, the comparison (pure)."""
    metrics: dict[str, float] = {
        "pairs": float(result["pairs"]),
        "skipped_rows": float(result["skipped_rows"]),
    }
    for side in ("model", "base"):
        values = result[side]
        if values is None:
            continue
        for key in ("preference_accuracy", "accuracy_low", "accuracy_high", "mean_margin"):
            metrics[f"{side}.{key}"] = float(values[key])
    paired = result["paired_vs_base"]
    if paired is not None:
        for key in ("difference", "difference_low", "difference_high", "p_value"):
            metrics[f"paired.{key}"] = float(paired[key])
        metrics["paired.b"] = float(paired["candidate_only"])
        metrics["paired.c"] = float(paired["baseline_only"])
    return metrics


def evaluate(
    line: Annotated[str, typer.Argument(help="Business line whose model is evaluated.")],
    pairs: Annotated[
        Path, typer.Option("--pairs", help="Preference pairs file (.jsonl or .jsonl.gz).")
    ],
    version: Annotated[
        str,
        typer.Option(help="Adapter version N, 'champion' (the line's alias) or 'base'."),
    ] = "champion",
    pair_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="hh or trl; default: trl for rows with a prompt, else hh.",
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Only the first N usable pairs.")] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the result as JSON here.")
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, max=1_024)] = 8,
    max_length: Annotated[
        int, typer.Option(min=2, max=32_768, help="Tokens per prompt and answer.")
    ] = 512,
) -> None:
    """Preference accuracy of a line's model on your own pairs, with 95% intervals, compared
    with the base model; logged to MLflow as an evaluation run."""
    from registry.names import adapter_name
    from training.base_model import ensure_base_model

    data = _usable_pairs(line, pairs, pair_format, limit)
    settings = load_settings()
    registry = clients(settings).registry
    chosen_version = _version(registry, line, version)
    base_dir = ensure_base_model(settings.models_dir, settings.base_model)
    adapter = registry.adapter_path(line, chosen_version) if chosen_version is not None else None
    name = adapter_name(line, chosen_version) if chosen_version is not None else "base"
    model = _score(name, chosen_version, base_dir, adapter, data.pairs, batch_size, max_length)
    base = None
    if adapter is not None:
        base = _score("base", None, base_dir, None, data.pairs, batch_size, max_length)
    result, comparison = evaluation_result(line, pairs, pair_format, data, model, base)
    result["base_model"] = base_dir.name
    _print_result(result, model, base, comparison)
    result["mlflow_run_id"] = _log_run(registry, line, result)
    out.print(f"MLflow evaluation run {result['mlflow_run_id']} in flywheel/{line}")
    if json_path is not None:
        json_path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
        out.print(f"wrote {json_path}")


def _usable_pairs(line: str, pairs: Path, pair_format: str | None, limit: int | None) -> PairsFile:
    """The file's usable preference pairs (its skipped rows reported); refused for a bad line
    name, a missing file, an unknown format or no usable pair."""
    from feedback.events import BUSINESS_LINE
    from feedback.importers.pairs import PAIR_FORMATS

    if not re.fullmatch(BUSINESS_LINE, line):
        raise UsageError(f"{line!r} is not a business line name")
    if not pairs.is_file():
        raise UsageError(f"no such file: {pairs}")
    if pair_format is not None and pair_format not in PAIR_FORMATS:
        raise UsageError(f"unknown --format {pair_format!r}: use {' or '.join(PAIR_FORMATS)}")
    data = read_pairs_file(pairs, pair_format, limit)
    _report_skips(pairs, data)
    if not data.pairs:
        raise UsageError(f"{pairs} holds no usable preference pair")
    return data


def _version(registry: Registry, line: str, version: str) -> int | None:
    """The adapter version to evaluate (``None``: the base model)."""
    if version == "base":
        return None
    if version == "champion":
        champion = registry.alias_version(line, "champion")
        if champion is None:
            raise UsageError(f"{line} has no champion yet: pass --version base or a version number")
        return champion
    if version.isdigit() and int(version) > 0:
        return int(version)
    raise UsageError(f"--version {version!r}: expected a number, 'champion' or 'base'")


def _report_skips(path: Path, data: PairsFile) -> None:
    if not data.skipped_rows:
        return
    skipped = (f"skipped {data.skipped_rows} unusable row(s)", "yellow")
    err.print(Text.assemble(skipped, f" of {path.name}:"))
    for line_number, reason in data.skipped[:SHOWN_SKIPS]:
        err.print(f"  {path.name}:{line_number}: {reason}", highlight=False)
    if data.skipped_rows > SHOWN_SKIPS:
        err.print(f"  ... and {data.skipped_rows - SHOWN_SKIPS} more")


def _score(
    name: str,
    version: int | None,
    base_dir: Path,
    adapter: Path | None,
    pairs: Sequence[PreferencePair],
    batch_size: int,
    max_length: int,
) -> ModelScore:
    """Load one model, score every pair's two answers, and let the model go."""
    from eval.offline import answer_logprobs, load_for_eval, pair_wins, preference_metrics
    from flywheel.progress import progress_bar

    model, tokenizer = load_for_eval(base_dir, adapter)
    prompts = [list(p.prompt) for p in pairs]
    answers = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    with progress_bar(f"scoring {name}", total=len(answers)) as advance:
        scores = answer_logprobs(
            model,
            tokenizer,
            prompts + prompts,
            answers,
            batch_size=batch_size,
            max_length=max_length,
            advance=advance,
        )
    del model
    chosen, rejected = scores[: len(pairs)], scores[len(pairs) :]
    _, margin = preference_metrics(chosen, rejected)
    return ModelScore(name, version, pair_wins(chosen, rejected), float(margin or 0.0))


def _print_result(
    result: dict[str, Any],
    model: ModelScore,
    base: ModelScore | None,
    comparison: PairedComparison | None,
) -> None:
    out.print(
        f"{result['pairs']} pairs from {Path(result['pairs_file']).name} "
        f"({result['skipped_rows']} rows skipped); scored by {SCORING}"
    )
    table = Table(title=f"preference accuracy on {result['business_line']}'s pairs")
    for column in ("model", "accuracy", f"{CONFIDENCE:.0%} CI (Wilson)", "mean margin"):
        table.add_column(column, justify="right")
    for score in (model, base):
        if score is None:
            continue
        low, high = score.interval()
        table.add_row(
            score.name,
            f"{score.accuracy:.3f}",
            f"{low:.3f} to {high:.3f}",
            f"{score.mean_margin:+.4f}",
        )
    out.print(table)
    if comparison is not None:
        out.print(f"paired with the base model: {comparison.describe(model.name, 'base')}")


def _log_run(registry: Registry, line: str, result: dict[str, Any]) -> str:
    """An MLflow run of the line's experiment holding the evaluation; returns its id."""
    from mlflow.entities import Metric, Param

    from registry.records import TAG_BASE_MODEL, TAG_LINE, truncate

    client = registry.client
    model = result["model"]
    run = client.create_run(
        registry.experiment_id(line),
        run_name=f"eval-{model['name']}-{Path(result['pairs_file']).stem[:40]}",
        tags={
            TAG_LINE: line,
            TAG_RUN_KIND: RUN_KIND,
            TAG_BASE_MODEL: result["base_model"],
            "flywheel.eval.model": model["name"],
        },
    )
    run_id = str(run.info.run_id)
    try:
        params = {
            "pairs_file": truncate(result["pairs_file"], 6_000),
            "format": result["format"],
            "model": model["name"],
            "model_version": str(model["version"]),
            "scoring": SCORING,
            "confidence": str(CONFIDENCE),
        }
        stamp = int(time.time() * 1000)
        client.log_batch(
            run_id,
            metrics=[
                Metric(key, value, stamp, 0) for key, value in evaluation_metrics(result).items()
            ],
            params=[Param(key, value) for key, value in params.items()],
        )
        client.log_dict(run_id, result, ARTIFACT)
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    return run_id
