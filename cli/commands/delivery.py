"""``flywheel adapters``: an adapter version fetched from the registry into a replica's cache.

``flywheel adapters fetch legal-v3 --cache DIR`` prints the verified folder's path and
nothing else on stdout: flywheel's LoRA resolver inside vLLM runs it for a name vLLM does
not know. A failure is one line on stderr and its exit code: 2 a name that is not
``<line>-v<version>`` or that no version has, 4 MLflow does not answer, 8 refused (the
files' digest is not the registered one, the version was rolled back, or it was trained
on another base model than ``--served-base``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flywheel.errors import FlywheelError, UsageError

if TYPE_CHECKING:
    from registry.tracking import Registry
    from training.base_model import BaseFingerprint

adapters_app = typer.Typer(
    help="Adapter versions fetched from the registry, digest and base model checked.",
    no_args_is_help=True,
)


@adapters_app.command("fetch")
def adapters_fetch(
    name: Annotated[str, typer.Argument(help="The adapter's name, <line>-v<version>.")],
    cache: Annotated[
        Path, typer.Option("--cache", help="This replica's adapter cache (a folder).")
    ],
    served_base: Annotated[
        Path | None,
        typer.Option(
            "--served-base",
            help="The base model folder this replica serves: an adapter trained on another "
            "base is refused.",
        ),
    ] = None,
) -> None:
    """Fetch ``NAME`` into ``--cache`` (once; later calls re-check the digest) and print
    the folder's path."""
    from registry.delivery import BaseMismatchError, base_refusal, fetch_adapter, recorded_base
    from registry.names import parse_adapter_name
    from training.base_model import read_base_record

    parsed = parse_adapter_name(name)
    if parsed is None:
        raise UsageError(f"{name!r} is not a flywheel adapter name (<line>-v<version>)")
    line, version = parsed
    served = _served(served_base)
    # The resolver reads stdout for the path alone: no progress bar may join it.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from cli.commands.common import clients
    from flywheel.settings import load_settings

    registry = clients(load_settings()).registry
    tags = _servable_tags(registry, name, line, version)
    folder = fetch_adapter(registry, line, version, cache)
    if served is not None:
        trained_on = read_base_record(folder) or recorded_base(tags)
        refusal = base_refusal(trained_on, served)
        if refusal is not None:
            raise BaseMismatchError(f"{name}: {refusal}; not served")
    typer.echo(str(folder))


def _served(served_base: Path | None) -> BaseFingerprint | None:
    """The fingerprint of the base model this replica serves, when given."""
    from training.base_model import base_fingerprint

    if served_base is None:
        return None
    try:
        return base_fingerprint(served_base)
    except FlywheelError as exc:
        raise UsageError(f"--served-base: {exc}") from None


def _servable_tags(registry: Registry, name: str, line: str, version: int) -> dict[str, str]:
    """The version's tags; refused for a version the registry lacks or one rolled back."""
    from registry.delivery import AdapterRefusedError, rejection_of
    from registry.tracking import VersionNotFoundError

    try:
        tags = registry.version_tags(line, version)
    except VersionNotFoundError as exc:
        raise UsageError(f"{name}: {exc}") from None
    rejected = rejection_of(tags)
    if rejected is not None:
        raise AdapterRefusedError(f"{name} was rolled back ({rejected}); not served")
    return tags
