"""The ``flywheel`` CLI in a subprocess, as a user runs it: its own home, no inherited settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_cli(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``flywheel ARGS`` with ``FLYWHEEL_HOME=home`` and only ``env`` besides PATH; never
    raises on a non-zero exit (the tests check the code and stderr)."""
    return subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        env={"FLYWHEEL_HOME": str(home), "PATH": "/usr/bin", **env},
        check=False,
    )
