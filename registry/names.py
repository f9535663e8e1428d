"""The names an adapter goes by, in one place.

A registered version of a line's adapter is served by vLLM, routed by the
gateway and logged under one immutable name, ``<line>-v<version>``; its MLflow
registered model is ``flywheel-<line>`` and its runs live in the experiment
``flywheel/<line>``. Everything that writes or reads such a name comes here.
"""

from __future__ import annotations

import re

from feedback.events import BUSINESS_LINE
from flywheel.errors import FlywheelError

ADAPTER_NAME = re.compile(
    BUSINESS_LINE.removesuffix("$").replace("^", "^(", 1) + r")-v([0-9]{1,9})$"
)


def checked_line(line: str) -> str:
    """``line`` when it is a business line name, else a clear error."""
    if not re.fullmatch(BUSINESS_LINE, line):
        raise FlywheelError(
            f"{line!r} is not a business line name (lowercase letters, digits, underscores)"
        )
    return line


def adapter_name(line: str, version: int) -> str:
    """The immutable name vLLM serves a registered version under (``<line>-v<version>``)."""
    return f"{checked_line(line)}-v{version}"


def parse_adapter_name(name: str) -> tuple[str, int] | None:
    """``("legal", 3)`` for ``legal-v3``; None for a name that is not ``<line>-v<version>``."""
    match = ADAPTER_NAME.fullmatch(name)
    if match is None:
        return None
    return match.group(1), int(match.group(2))


def version_of(adapter: str) -> int:
    """The registered version behind a flywheel adapter name."""
    parsed = parse_adapter_name(adapter)
    if parsed is None:
        raise FlywheelError(f"{adapter!r} is not a flywheel adapter name (<line>-v<version>)")
    return parsed[1]


def training_run_name(line: str, method: str, dataset_hash: str) -> str:
    """The MLflow run name of a training (``medical-dpo-1a2b3c4d``): what its candidate is
    called until the gate's verdict and the registry give it a version."""
    return f"{checked_line(line)}-{method}-{dataset_hash[:8]}"


def model_name(line: str) -> str:
    """The registered model that holds a business line's adapter versions."""
    return f"flywheel-{checked_line(line)}"


def experiment_name(line: str) -> str:
    """The MLflow experiment of a business line's training runs."""
    return f"flywheel/{checked_line(line)}"
