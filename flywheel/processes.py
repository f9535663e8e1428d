"""A child service (gateway, Prefect server, stand-in) in its own process group, started,
waited on until its health URL answers, and stopped with the whole group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from flywheel.errors import FlywheelError
from flywheel.file_modes import open_private, private_dir


@contextmanager
def service_process(
    argv: Sequence[str],
    *,
    name: str,
    ready_url: str,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = 60.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` until the block ends; ready once ``ready_url`` answers below 500.

    Its output goes to ``log_path``; a child that exits or stays silent is an error
    naming that log. On the way out the process group gets SIGTERM, then SIGKILL.
    """
    private_dir(log_path.parent)
    with os.fdopen(open_private(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab") as log:
        process = subprocess.Popen(  # noqa: S603 (our own argv, no shell)
            list(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise FlywheelError(f"{name} exited with {process.returncode}; see {log_path}")
            try:
                if httpx.get(ready_url, timeout=2).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise FlywheelError(f"{name} did not start in {timeout_s:.0f} s; see {log_path}")
            time.sleep(0.2)
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
