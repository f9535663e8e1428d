"""A child service (gateway, Prefect server, vLLM, stand-in) in its own process group,
started, waited on until its health URL answers, and stopped with the whole group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO, Self

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
        stop_process_group(process, grace_s=20.0, name=name)


def stop_process_group(
    process: subprocess.Popen[bytes],
    *,
    grace_s: float,
    name: str,
    report: Callable[[str], None] | None = None,
    wait_gone_s: float = 5.0,
) -> None:
    """SIGTERM ``process``'s group, SIGKILL it after ``grace_s`` (said through ``report``),
    then SIGKILL whatever of the group is left (forked workers may outlive their parent)
    and wait up to ``wait_gone_s`` until the group is gone, so its port and memory are free."""
    if process.poll() is None:
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            if report is not None:
                report(f"{name} did not stop within {grace_s:.0f} s; killing it")
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
    _signal_group(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_gone_s
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)


class ServerProcess:
    """A server in its own process group, started by :meth:`start` and stopped (group and
    log) by :meth:`stop`; a context manager. Subclasses set ``_process`` and ``_log`` in
    ``start`` and name themselves by ``process_name``."""

    process_name = "the server"
    stop_grace_s = 30.0

    def __init__(self, report: Callable[[str], None]) -> None:
        self._report = report
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        """Start the process and wait until it answers."""
        raise NotImplementedError

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM the process group, then SIGKILL what is left after ``grace_s`` (the
        class's ``stop_grace_s`` by default); close the log."""
        process, self._process = self._process, None
        if process is not None:
            grace = self.stop_grace_s if grace_s is None else grace_s
            stop_process_group(process, grace_s=grace, name=self.process_name, report=self._report)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
