"""The live part of ``flywheel demo``: vLLM and the gateway up, users through them, the nightly
flow to a 5% canary, canary traffic with feedback, and the canary flow to its decision.

Everything runs for real on this machine (vLLM on the CPU, the gateway as its own
process, Prefect's local API); only the users are simulated.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from flywheel.errors import FlywheelError
from flywheel.settings import Settings
from gateway.routing import RoutingTable

Say = Callable[[str], None]


@dataclass
class LoopResult:
    """What the live demo did."""

    nightly: list[dict[str, Any]] = field(default_factory=list)
    canary: list[dict[str, Any]] = field(default_factory=list)
    gateway_url: str = ""
    traffic: dict[str, Any] = field(default_factory=dict)


@contextmanager
def gateway_process(settings: Settings, upstream: str, port: int, log: Any) -> Iterator[str]:
    """The gateway as its own process (uvicorn), in front of ``upstream``; yields its URL."""
    env = {
        **os.environ,
        "FLYWHEEL_HOME": str(settings.home),
        "FLYWHEEL_GATEWAY_UPSTREAMS": upstream,
    }
    argv = [
        sys.executable, "-m", "uvicorn", "gateway.app:app_from_env", "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
    process = subprocess.Popen(  # noqa: S603 (our own argv, no shell)
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise FlywheelError(f"the gateway exited with {process.returncode}; see {log.name}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise FlywheelError(f"the gateway did not start in 60 s; see {log.name}")
            time.sleep(0.2)
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def canary_traffic(
    url: str,
    key: str,
    table: RoutingTable,
    *,
    canary_users: int,
    champion_users: int,
    canary_dislike: float,
    champion_dislike: float,
    seed: int = 0,
) -> dict[str, Any]:
    """Users for whom the gateway's sticky split says canary or champion, one question each,
    thumbs up or down at the given rates. Users are picked with the gateway's own split
    function so a 5% canary gets enough traffic in a minute; the gateway does the routing."""
    from gateway.routing import choose_arm

    line = table.business_line
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {key}"}
    served: dict[str, int] = {}
    thumbs: dict[str, int] = {}
    with httpx.Client(base_url=url, headers=headers, timeout=300) as client:
        wanted = {"canary": canary_users, "champion": champion_users, "base": champion_users}
        picked: list[str] = []
        counts = {"canary": 0, "champion": 0, "base": 0}
        index = 0
        while sum(counts.values()) < canary_users + champion_users and index < 200_000:
            user = f"demo-user-{seed}-{index}"
            arm, _ = choose_arm(table, user)
            if counts[arm] < wanted[arm]:
                counts[arm] += 1
                picked.append(user)
            index += 1
        for user in picked:
            question = rng.choice(QUESTIONS)
            body = {
                "model": line,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": 12,
                "user": user,
            }
            answer = client.post("/v1/chat/completions", json=body)
            if answer.status_code != 200:
                continue
            adapter = answer.headers["x-flywheel-adapter"]
            arm = answer.headers["x-flywheel-arm"]
            served[adapter] = served.get(adapter, 0) + 1
            dislike = canary_dislike if arm == "canary" else champion_dislike
            kind = "thumbs_down" if rng.random() < dislike else "thumbs_up"
            request_id = answer.headers["x-request-id"]
            client.post("/v1/feedback", json={"request_id": request_id, "type": kind})
            thumbs[f"{arm}:{kind}"] = thumbs.get(f"{arm}:{kind}", 0) + 1
    return {"served_by": served, "feedback": thumbs}


QUESTIONS = (
    "Where is my order?",
    "How do I reset my password?",
    "Can I get a refund for a damaged item?",
    "How do I change my delivery address?",
    "My package arrived late, what can I do?",
    "How do I cancel my subscription?",
)
