"""Drive simulated users through a running gateway: real answers from vLLM, real feedback calls.

The simulator's events come grouped per request: the interaction, a possible
retry of the same prompt in the same session, then feedback. Here each
interaction becomes a chat request to the gateway (user, session and messages
kept; the answer is whatever the served adapter says), a retry is sent again
so that the gateway infers the regenerate itself, and every other feedback
event is posted to ``/v1/feedback`` against the request id the gateway
returned. Groups run concurrently, each in order.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from gateway.app import ADAPTER_HEADER, ARM_HEADER, REQUEST_ID_HEADER, SESSION_HEADER


@dataclass
class TrafficReport:
    """What a drive sent and what came back."""

    requests: int = 0
    feedback: int = 0
    served_by: Counter[str] = field(default_factory=Counter)
    arms: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    request_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly summary."""
        return {
            "requests": self.requests,
            "feedback": self.feedback,
            "served_by": dict(self.served_by),
            "arms": dict(self.arms),
            "failures": dict(self.failures),
        }


def request_groups(events: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """The simulator's events cut into one group per first-asked interaction."""
    group: list[dict[str, Any]] = []
    for event in events:
        if event["type"] == "interaction" and group and not _is_retry(event, group):
            yield group
            group = []
        group.append(event)
    if group:
        yield group


def _is_retry(event: dict[str, Any], group: list[dict[str, Any]]) -> bool:
    first = group[0]
    return (
        first["type"] == "interaction"
        and event.get("session_id") == first.get("session_id")
        and event.get("prompt_hash") == first.get("prompt_hash")
    )


class GatewayDriver:
    """Sends request groups through the gateway with bounded concurrency."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        concurrency: int = 4,
        max_tokens: int = 48,
        timeout_s: float = 300.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.concurrency = concurrency
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s

    def run(
        self,
        events: Iterable[dict[str, Any]],
        on_request: Callable[[int], None] | None = None,
    ) -> TrafficReport:
        """Drive every group; returns what was sent and served."""
        return asyncio.run(self._run(events, on_request))

    async def _run(
        self, events: Iterable[dict[str, Any]], on_request: Callable[[int], None] | None
    ) -> TrafficReport:
        report = TrafficReport()
        groups: asyncio.Queue[list[dict[str, Any]] | None] = asyncio.Queue(self.concurrency * 2)
        headers = {"Authorization": f"Bearer {self.api_key}"}
        limits = httpx.Limits(max_connections=self.concurrency * 2)
        async with httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=self.timeout_s, limits=limits
        ) as client:

            async def worker() -> None:
                while (group := await groups.get()) is not None:
                    await self._group(client, group, report)
                    if on_request is not None:
                        on_request(sum(1 for e in group if e["type"] == "interaction"))

            workers = [asyncio.create_task(worker()) for _ in range(self.concurrency)]
            for group in request_groups(events):
                await groups.put(group)
            for _ in workers:
                await groups.put(None)
            await asyncio.gather(*workers)
        return report

    async def _group(
        self, client: httpx.AsyncClient, group: list[dict[str, Any]], report: TrafficReport
    ) -> None:
        served: dict[str, str] = {}
        for event in group:
            if event["type"] == "interaction":
                request_id = await self._ask(client, event, report)
                if request_id is not None:
                    served[event["request_id"]] = request_id
            elif event["type"] != "regenerate" and event["request_id"] in served:
                await self._tell(client, event, served[event["request_id"]], report)

    async def _ask(
        self, client: httpx.AsyncClient, event: dict[str, Any], report: TrafficReport
    ) -> str | None:
        body = {
            "model": event["business_line"],
            "messages": event["messages"],
            "max_tokens": self.max_tokens,
            "temperature": 0.7,
            "user": event.get("user_id"),
        }
        headers = {SESSION_HEADER: event["session_id"]} if event.get("session_id") else {}
        report.requests += 1
        try:
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
        except httpx.HTTPError as exc:
            report.failures[type(exc).__name__] += 1
            return None
        if response.status_code != 200:
            report.failures[f"http {response.status_code}"] += 1
            return response.headers.get(REQUEST_ID_HEADER)
        report.served_by[response.headers.get(ADAPTER_HEADER, "?")] += 1
        report.arms[response.headers.get(ARM_HEADER, "?")] += 1
        request_id = response.headers[REQUEST_ID_HEADER]
        report.request_ids.append(request_id)
        return request_id

    async def _tell(
        self,
        client: httpx.AsyncClient,
        event: dict[str, Any],
        request_id: str,
        report: TrafficReport,
    ) -> None:
        body = {"request_id": request_id, "type": event["type"]}
        for name in ("edited_text", "outcome"):
            if event.get(name) is not None:
                body[name] = event[name]
        try:
            response = await client.post("/v1/feedback", json=body)
        except httpx.HTTPError as exc:
            report.failures[f"feedback {type(exc).__name__}"] += 1
            return
        if response.status_code == 202:
            report.feedback += 1
        else:
            report.failures[f"feedback http {response.status_code}"] += 1
