"""Simulated users through the gateway's real API, reacting to the answers they got.

Each request is one user asking one prompt in a session. The answer comes back
from vLLM through the gateway; only then does the user model react. A
``regenerate`` re-asks the same prompt in the same session (the gateway infers
the regenerate and links the two answers) and the user reacts to the new
answer; thumbs, edits and abandons are posted to ``/v1/feedback`` at once; task
outcomes arrive late, after every request of the batch.

The sampling settings of all simulated traffic (and of the loop's final
evaluation) live in :class:`Sampling`, in one place.

The gateway tells no caller which adapter or arm answered (that would let a client find
the canary's users). The simulation knows it the way the gateway decides it: the line's
routing table, read once per batch after the gateway has re-read it, and the same sticky
split (:func:`registry.routing.choose_arm`) on each user's id. Without a routing table the
arm and adapter of each answer are unknown (``?``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from lab.simulation.protocol import LoadedUsers, Reaction, reaction_seed
from registry.routing import RoutingTable, choose_arm

REQUEST_ID_HEADER = "x-request-id"
SESSION_HEADER = "x-session-id"
LATE_OUTCOMES = {"task_success": "success", "task_failure": "failure"}


class Sampling(BaseModel):
    """How simulated traffic asks the model to answer (one place for every simulation)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(default=0.7, ge=0, le=2)
    top_p: float = Field(default=0.9, gt=0, le=1)
    max_tokens: int = Field(default=96, ge=1, le=4_096)


@dataclass(frozen=True, slots=True)
class UserRequest:
    """One simulated request: who asks what, in which session."""

    user_id: str
    session_id: str
    prompt: str


@dataclass(slots=True)
class ServedAnswer:
    """What one request got and what the user made of it."""

    request: UserRequest
    request_id: str | None
    adapter: str | None
    arm: str | None
    answer: str
    satisfied: bool
    reaction: str
    error: str | None = None


@dataclass(slots=True)
class TrafficReport:
    """What a batch of simulated users sent, got and felt, per arm."""

    answers: list[ServedAnswer] = field(default_factory=list)
    feedback_posted: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)

    def served(self) -> dict[str, int]:
        """Answered requests per arm (a regenerated answer counts too)."""
        return dict(Counter(a.arm or "?" for a in self.answers if a.error is None))

    def satisfied(self) -> dict[str, float]:
        """Share of answered requests whose user was satisfied, per arm."""
        totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for answer in self.answers:
            if answer.error is None:
                totals[answer.arm or "?"][0] += answer.satisfied
                totals[answer.arm or "?"][1] += 1
        return {arm: hits / n for arm, (hits, n) in totals.items() if n}

    def served_by(self) -> dict[str, int]:
        """Answered requests per adapter name (``base`` for the base model, ``?`` unknown)."""
        return dict(
            Counter(
                a.adapter or ("base" if a.arm else "?") for a in self.answers if a.error is None
            )
        )

    def reactions(self) -> dict[str, int]:
        """How often each reaction type was given."""
        return dict(Counter(a.reaction for a in self.answers if a.error is None))

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly summary."""
        return {
            "served": self.served(),
            "served_by": self.served_by(),
            "satisfied": {arm: round(rate, 4) for arm, rate in self.satisfied().items()},
            "reactions": self.reactions(),
            "feedback_posted": dict(self.feedback_posted),
            "failures": dict(self.failures),
        }


class UserTraffic:
    """Sends simulated users' requests through a gateway and posts their reactions."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        users: LoadedUsers,
        *,
        sampling: Sampling | None = None,
        concurrency: int = 4,
        timeout_s: float = 300.0,
        transport: httpx.AsyncBaseTransport | None = None,
        routes: Callable[[str], RoutingTable] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # The line's routing table as the gateway reads it (from the store): each answer's
        # arm and adapter, derived by the gateway's own sticky split.
        self.routes = routes
        self.api_key = api_key
        self.users = users
        self.sampling = sampling or Sampling()
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.transport = transport

    def run(
        self,
        business_line: str,
        requests: Sequence[UserRequest],
        *,
        seed: int,
        on_request: Callable[[int], None] | None = None,
    ) -> TrafficReport:
        """Every request, its reaction and, after all of them, the late task outcomes."""
        return asyncio.run(self._run(business_line, requests, seed, on_request))

    async def _run(
        self,
        line: str,
        requests: Sequence[UserRequest],
        seed: int,
        on_request: Callable[[int], None] | None,
    ) -> TrafficReport:
        report = TrafficReport()
        started = time.monotonic()
        late: list[tuple[str, str]] = []
        queue: asyncio.Queue[UserRequest | None] = asyncio.Queue()
        for request in requests:
            queue.put_nowait(request)
        for _ in range(self.concurrency):
            queue.put_nowait(None)
        async with self._client() as client:
            await self._routes_read_since(client, started)
            table = self.routes(line) if self.routes is not None else None

            async def worker() -> None:
                while (request := await queue.get()) is not None:
                    await self._serve(client, line, request, seed, report, late, table)
                    if on_request is not None:
                        on_request(1)

            await asyncio.gather(*(worker() for _ in range(self.concurrency)))
            for request_id, outcome in late:
                await self._post(
                    client, report, {"request_id": request_id, "type": "task_outcome",
                                     "outcome": outcome},
                )  # fmt: skip
        return report

    async def _routes_read_since(
        self, client: httpx.AsyncClient, since: float, timeout_s: float = 5.0
    ) -> None:
        """Wait until the gateway has re-read its routing tables after ``since`` (a routing
        change made just before this batch must route all of it)."""
        while time.monotonic() - since < timeout_s:
            asked = time.monotonic()
            try:
                health = (await client.get("/healthz")).json()
            except (httpx.HTTPError, ValueError):
                return
            age = health.get("routes_age_s")
            if age is None or asked - float(age) > since:
                return
            await asyncio.sleep(0.05)

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=self.timeout_s,
            # Idle connections are dropped before the gateway's keep-alive (5 s) drops them.
            limits=httpx.Limits(max_connections=self.concurrency * 2, keepalive_expiry=2.0),
            transport=self.transport,
        )

    async def _serve(
        self,
        client: httpx.AsyncClient,
        line: str,
        request: UserRequest,
        seed: int,
        report: TrafficReport,
        late: list[tuple[str, str]],
        table: RoutingTable | None = None,
    ) -> None:
        for attempt in range(2):
            served = await self.ask(client, line, request, table)
            if served.error is not None:
                report.failures[served.error] += 1
                report.answers.append(served)
                return
            served.satisfied = self.users.satisfied(line, request.prompt, served.answer)
            reaction = self.users.react(
                line,
                request.prompt,
                served.answer,
                reaction_seed(seed, request.session_id, request.prompt, str(attempt)),
            )
            if reaction.type == "regenerate" and attempt == 1:
                # A second retry in a row reads as giving up.
                reaction = Reaction("abandon")
            served.reaction = reaction.type
            report.answers.append(served)
            if reaction.type == "regenerate":
                continue  # the gateway infers it from the same prompt in the same session
            await self._tell(client, served.request_id or "", reaction, report, late)
            return

    async def ask(
        self,
        client: httpx.AsyncClient,
        line: str,
        request: UserRequest,
        table: RoutingTable | None = None,
    ) -> ServedAnswer:
        """One chat request through the gateway, with the configured sampling; its arm and
        adapter as ``table`` routes the user (None: unknown)."""
        body = {
            "model": line,
            "messages": [{"role": "user", "content": request.prompt}],
            "user": request.user_id,
            **self.sampling.model_dump(),
        }
        headers = {SESSION_HEADER: request.session_id}
        try:
            try:
                response = await client.post("/v1/chat/completions", json=body, headers=headers)
            except (httpx.ConnectError, httpx.RemoteProtocolError):
                # Once more on a new connection, as the OpenAI SDK's clients do.
                response = await client.post("/v1/chat/completions", json=body, headers=headers)
        except httpx.HTTPError as exc:
            return ServedAnswer(request, None, None, None, "", False, "none", type(exc).__name__)
        if response.status_code != 200:
            return ServedAnswer(
                request, None, None, None, "", False, "none", f"http {response.status_code}"
            )
        choice = response.json()["choices"][0]
        arm, adapter = choose_arm(table, request.user_id) if table is not None else (None, None)
        return ServedAnswer(
            request,
            response.headers.get(REQUEST_ID_HEADER),
            adapter,
            arm,
            str(choice["message"].get("content") or ""),
            False,
            "none",
        )

    async def _tell(
        self,
        client: httpx.AsyncClient,
        request_id: str,
        reaction: Reaction,
        report: TrafficReport,
        late: list[tuple[str, str]],
    ) -> None:
        if not reaction.says_something or not request_id:
            return
        if reaction.type in LATE_OUTCOMES:
            late.append((request_id, LATE_OUTCOMES[reaction.type]))
            return
        body: dict[str, Any] = {"request_id": request_id, "type": reaction.type}
        if reaction.type == "edit":
            body["edited_text"] = reaction.text
        await self._post(client, report, body)

    async def _post(
        self, client: httpx.AsyncClient, report: TrafficReport, body: dict[str, Any]
    ) -> None:
        try:
            response = await client.post("/v1/feedback", json=body)
        except httpx.HTTPError as exc:
            report.failures[f"feedback {type(exc).__name__}"] += 1
            return
        if response.status_code == 202:
            report.feedback_posted[body["type"]] += 1
        elif response.status_code == 200:
            pass  # the same signal on the same answer again: counted once, not a failure
        else:
            report.failures[f"feedback http {response.status_code}"] += 1


def user_requests(
    users: LoadedUsers, business_line: str, user_ids: Sequence[str], seed: int, tag: str
) -> list[UserRequest]:
    """One request per user id, with prompts from the user model (or the built-in ones)."""
    prompts = users.prompts(business_line, len(user_ids), seed)
    return [
        UserRequest(user_id, f"{tag}-{index}", prompt)
        for index, (user_id, prompt) in enumerate(zip(user_ids, prompts, strict=True))
    ]
