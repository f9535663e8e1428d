"""The live part of ``flywheel demo``: vLLM and the gateway up, users through them, the nightly
flow to a 5% canary, canary traffic with feedback, and the canary flow to its decision.

Everything runs for real on this machine (vLLM on the CPU, the gateway as its own
process, Prefect's local API); only the users are simulated.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from flywheel.processes import service_process
from flywheel.settings import Settings
from gateway.routing import RoutingTable


@contextmanager
def gateway_process(settings: Settings, upstream: str, port: int, log_path: Path) -> Iterator[str]:
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
    url = f"http://127.0.0.1:{port}"
    with service_process(
        argv, name="the gateway", ready_url=f"{url}/healthz", log_path=log_path, env=env
    ):
        yield url


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
