"""Rate limits shared by two gateway processes through one Redis, on one PostgreSQL store:
the line over its limit gets 429 on both, the other line is untouched, and the limit
holds within 5% whichever process a request reaches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from feedback.store import FeedbackStore
from flywheel.settings import load_settings
from gateway.keys import key_digest
from registry.vllm_server import free_port
from tests.conftest import REPO

pytestmark = pytest.mark.integration

KEY = "fw-rate-limited"
LIMITED, FREE = "customer_service", "legal"
LIMIT = 100


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _wait_up(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{url} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{url} did not start: {log.read_text()[-2000:]}")


@pytest.fixture
def two_gateways(
    postgres_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[str]]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "gateway-keys.yaml").write_text(
        yaml.safe_dump(
            {
                "keys": [{"name": "app", "sha256": key_digest(KEY), "business_lines": ["*"]}],
                "lines": {LIMITED: {"requests_per_min": LIMIT}},
            }
        )
    )
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.setenv("FLYWHEEL_DATABASE_URL", postgres_url)
    FeedbackStore.open(load_settings()).close()  # the schema, once, before two processes use it
    stub_port = free_port()
    env = {
        **os.environ,
        "FLYWHEEL_HOME": str(home),
        "FLYWHEEL_DATABASE_URL": postgres_url,
        "FLYWHEEL_REDIS_URL": redis_url,
        # Shared counting is what is measured: a busy test machine is not a Redis outage.
        "FLYWHEEL_GATEWAY_REDIS_TIMEOUT_S": "5",
        "FLYWHEEL_GATEWAY_UPSTREAMS": f"http://127.0.0.1:{stub_port}",
        # A fresh namespace: counters of earlier runs on this Redis do not count here.
        "FLYWHEEL_GATEWAY_RATE_LIMIT_NAMESPACE": f"test-{uuid.uuid4().hex[:12]}",
    }
    processes = [
        _start(
            [sys.executable, "-m", "tests.stub_vllm", "--port", str(stub_port)],
            env,
            tmp_path / "stub.log",
        )
    ]
    urls = []
    try:
        for i in range(2):
            port = free_port()
            # As an operator runs it (and docker-compose): `flywheel serve gateway`.
            flywheel = str(Path(sys.executable).parent / "flywheel")
            argv = [flywheel, "serve", "gateway", "--host", "127.0.0.1", "--port", str(port)]
            log = tmp_path / f"gateway-{i}.log"
            processes.append(_start(argv, env, log))
            urls.append(f"http://127.0.0.1:{port}")
            _wait_up(urls[-1], processes[-1], log)
        yield urls
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def test_a_line_over_its_limit_gets_429_on_every_replica_and_the_other_line_is_untouched(
    two_gateways: list[str],
) -> None:
    def ask(i: int, line: str) -> int:
        url = two_gateways[i % 2]
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"model": line, "messages": [{"role": "user", "content": f"q{i}"}]},
            timeout=30,
        )
        if answer.status_code == 429:
            assert int(answer.headers["retry-after"]) >= 1
            assert f"line {LIMITED!r}" in answer.json()["error"]["message"]
        return answer.status_code

    with ThreadPoolExecutor(8) as pool:
        limited = list(pool.map(lambda i: ask(i, LIMITED), range(int(LIMIT * 1.6))))
        free = list(pool.map(lambda i: ask(i, FREE), range(60)))
    admitted = limited.count(200)
    print(f"admitted {admitted} of {len(limited)}; other line {free.count(200)} of {len(free)}")
    assert set(limited) == {200, 429}
    # Shared through Redis: the two processes together admit the line's limit, within 5%
    # (each alone would have admitted up to twice as many).
    assert LIMIT * 0.95 <= admitted <= LIMIT * 1.05, admitted
    assert free == [200] * 60
