"""``flywheel serve gateway --workers 2``: one /metrics for both workers, whichever answers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.keys import key_digest
from registry.vllm_server import free_port
from tests.conftest import REPO

KEY = "fw-workers-key"
OPERATOR_KEY = "fw-workers-operator"


def _total(metrics: str, name: str) -> float:
    pattern = re.compile(rf"^{name}\{{[^}}]*\}} ([0-9.e+]+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(metrics))


def test_two_workers_report_every_request_in_one_metrics_page(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "gateway-keys.yaml").write_text(
        yaml.safe_dump(
            {
                "keys": [
                    {"name": "w", "sha256": key_digest(KEY), "business_lines": ["*"]},
                    {"name": "scrape", "sha256": key_digest(OPERATOR_KEY), "operator": True},
                ]
            }
        )
    )
    stub_port, port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env |= {
        "FLYWHEEL_HOME": str(home),
        "FLYWHEEL_GATEWAY_UPSTREAMS": f"http://127.0.0.1:{stub_port}",
    }
    env.pop("FLYWHEEL_DATABASE_URL", None)
    flywheel = str(Path(sys.executable).parent / "flywheel")
    stub = subprocess.Popen(
        [sys.executable, "-m", "tests.stub_vllm", "--port", str(stub_port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    server = subprocess.Popen(
        [flywheel, "serve", "gateway", "--port", str(port), "--workers", "2"],
        cwd=REPO,
        env=env,
        stdout=(tmp_path / "gateway.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the gateway did not start"
            assert server.poll() is None, (tmp_path / "gateway.log").read_text()[-3000:]
            time.sleep(0.3)
        body = {"model": "legal", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(30):  # a fresh connection each: the kernel spreads them over workers
            answer = httpx.post(
                f"{url}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {KEY}", "Connection": "close"},
                timeout=10,
            )
            assert answer.status_code == 200, answer.text
        scrape = {"Authorization": f"Bearer {OPERATOR_KEY}"}
        seen = {
            _total(
                httpx.get(f"{url}/metrics", headers=scrape, timeout=10).text,
                "flywheel_gateway_requests_total",
            )
            for _ in range(10)
        }
    finally:
        for process in (server, stub):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in (server, stub):
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
    # Every scrape, whichever worker answered it, counts all 30.
    assert seen == {30.0}


@pytest.fixture(autouse=True)
def _no_inherited_multiprocess_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
