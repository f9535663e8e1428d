"""``flywheel forget``: erase a user from the store, the datasets and flag the adapters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from cli.commands.common import clients, out
from flywheel.settings import Settings, load_settings

if TYPE_CHECKING:
    from feedback.datasets import DatasetRewrite
    from feedback.store import FeedbackStore, UserErasure
    from registry.records import FlaggedModels
    from registry.tracking import Registry

TABLES = ("interactions", "feedback_events", "shadow_outputs", "quarantined")


@dataclass(slots=True)
class ForgetReport:
    """What forgetting one user did: rows per form of the id, datasets, adapters."""

    forms: tuple[str, ...]
    erasure: UserErasure
    datasets: list[DatasetRewrite] = field(default_factory=list)
    flagged: FlaggedModels | None = None


def forget_everywhere(
    settings: Settings,
    store: FeedbackStore,
    user_id: str,
    registry: Callable[[], Registry],
    *,
    now: datetime | None = None,
) -> ForgetReport:
    """Erase ``user_id`` (as given or as the gateway hashed it) from the store, rewrite
    every dataset that held the user without their examples, and flag the runs and model
    versions trained on those datasets. ``registry`` is called only when there is
    something to flag, so a forget on a home without MLflow creates none."""
    from feedback.datasets import forget_in_datasets
    from feedback.store import user_id_forms

    when = now or datetime.now(UTC)
    forms = user_id_forms(user_id)
    erasure = store.forget_user(user_id, now=when)
    rewrites = forget_in_datasets(settings.datasets_dir, forms, now=when)
    report = ForgetReport(forms, erasure, rewrites)
    hashes = {h for r in rewrites for h in r.former_hashes}
    if hashes:
        report.flagged = registry().flag_forgotten_data(hashes, day=when.date().isoformat())
    return report


def print_forget_report(user_id: str, report: ForgetReport) -> None:
    """The report in words: which form matched, rows per table, datasets, adapters."""
    stored = report.forms[-1]
    if stored != user_id:
        out.print(f"{user_id!r} is stored by the gateway as {stored} (hashed)")
    matched = report.erasure.matched()
    if matched:
        names = [f"the hashed id {f}" if f != user_id else "the id as given" for f in matched]
        out.print("found under " + " and ".join(names))
    else:
        out.print(f"no stored record of {user_id!r} under any form")
    out.print(
        "deleted " + ", ".join(f"{report.erasure.total(t)} {t.replace('_', ' ')}" for t in TABLES)
    )
    if report.datasets:
        out.print(f"{len(report.datasets)} dataset(s) held the user; rewritten without them:")
        for rewrite in report.datasets:
            after = rewrite.new_hash[:16] if rewrite.new_hash else "removed (nothing left)"
            out.print(
                f"  {rewrite.business_line}/{rewrite.old_hash[:16]} -> {after} "
                f"({rewrite.removed} examples removed)"
            )
    else:
        out.print("no dataset held the user")
    if report.flagged is not None:
        versions = ", ".join(f"{name} v{version}" for name, version in report.flagged.versions)
        out.print(
            f"tagged flywheel.forgotten_user_data on {len(report.flagged.versions)} model "
            f"version(s) ({versions or 'none'}) and {len(report.flagged.runs)} run(s): "
            "retrain or retire them"
        )
    out.print("the user is recorded as forgotten: spooled records made before now are dropped")


def forget(user_id: Annotated[str, typer.Argument(help="The user to erase.")]) -> None:
    """Erase a user (by raw id or the gateway's hashed id) from the store, rewrite the
    datasets that held them and tag the adapters trained on those in MLflow."""
    settings = load_settings()
    command = clients(settings)
    report = forget_everywhere(settings, command.store, user_id, lambda: command.registry)
    print_forget_report(user_id, report)


retention_app = typer.Typer(
    help="Raw prompts and answers past each line's retention.raw_days.", no_args_is_help=True
)


@retention_app.command("run")
def retention_run(
    line: Annotated[
        list[str] | None, typer.Option(help="Only this business line (repeatable).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count the rows it would change; change none.")
    ] = False,
) -> None:
    """Replace raw text older than each line's recipe retention by its scrubbed text (or
    delete those rows, with ``action: delete``): what the nightly flow does per line."""
    from composition.recipes import apply_line_retention

    settings = load_settings()
    command = clients(settings)
    store = command.store
    lines = line or sorted(set(store.business_lines()) | set(settings.business_lines))
    scrubber = None if dry_run else command.scrubber
    for name in lines:
        report = apply_line_retention(
            settings,
            store.engine,
            name,
            scrubber.scrub_records if scrubber is not None else _no_scrub,
            dry_run=dry_run,
        )
        verb = {"scrub": "scrubbed", "delete": "deleted"}[report.action]
        if dry_run:
            verb = f"would be {verb}"
        out.print(
            f"{name}: raw text before {report.cutoff:%Y-%m-%d %H:%M} UTC {verb}: "
            f"{report.interactions} interactions, {report.feedback_events} feedback "
            f"events, {report.shadow_outputs} shadow answers"
        )


def _no_scrub(records: list[dict[str, object]], fields: object) -> list[dict[str, object]]:
    raise AssertionError("a dry run scrubs nothing")
