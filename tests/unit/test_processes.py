"""Child services: ready when their health URL answers, stopped with their group, failures named."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from flywheel.errors import FlywheelError
from flywheel.processes import service_process
from registry.vllm_server import free_port
from tests.conftest import REPO


def test_a_service_is_ready_then_stopped_with_its_group(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "tests.stub_vllm", "--port", str(port)]
    url = f"http://127.0.0.1:{port}/v1/models"
    with service_process(
        argv, name="stub", ready_url=url, log_path=tmp_path / "stub.log", cwd=REPO
    ) as process:
        assert httpx.get(url).status_code == 200
    assert process.poll() is not None
    with pytest.raises(httpx.ConnectError):
        httpx.get(url)


def test_a_service_that_exits_is_a_clear_error(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "raise SystemExit(3)"]
    with (
        pytest.raises(FlywheelError, match=r"broken exited with 3; see .*broken\.log"),
        service_process(
            argv,
            name="broken",
            ready_url=f"http://127.0.0.1:{free_port()}/",
            log_path=tmp_path / "broken.log",
        ),
    ):
        pass
