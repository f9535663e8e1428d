"""The gateway over a stand-in vLLM: auth, routing, streaming, logging, feedback, errors."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import select

from composition.clients import build_clients
from feedback.schema import feedback_table, interactions_table
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from registry.routes import RouteStore
from registry.routing import choose_arm
from registry.vllm_server import free_port
from tests.routing import clear_canary, set_canary, set_champion
from tests.servers import serving
from tests.stub_vllm import BASE_MODEL, StubBehaviour, StubVllm, running_stub

CS_KEY, LEGAL_KEY, ALL_KEY = "fw-cs-secret", "fw-legal-secret", "fw-all-secret"
OPERATOR_KEY = "fw-operator-secret"
CHAMPION, CANARY = "customer_service-v1", "customer_service-v2"


def _keys() -> KeyRing:
    return KeyRing(
        [
            ApiKey(name="cs", sha256=key_digest(CS_KEY), business_lines=("customer_service",)),
            ApiKey(name="legal", sha256=key_digest(LEGAL_KEY), business_lines=("legal",)),
            ApiKey(name="ops", sha256=key_digest(ALL_KEY), business_lines=("*",)),
            ApiKey(name="prometheus", sha256=key_digest(OPERATOR_KEY), operator=True),
        ]
    )


@dataclass
class Running:
    """A gateway on a real port in front of a stub vLLM, with its store."""

    url: str
    stub: StubVllm
    store: FeedbackStore
    routes: RouteStore
    app: Any

    def client(self, key: str | None = CS_KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)

    def flush(self) -> None:
        assert self.app.state.gateway.recorder.flush(10)

    def interactions(self) -> list[Any]:
        self.flush()
        with self.store.engine.connect() as connection:
            return list(connection.execute(select(interactions_table)).all())

    def feedback(self) -> list[Any]:
        self.flush()
        with self.store.engine.connect() as connection:
            return list(connection.execute(select(feedback_table)).all())

    def served(self, response: httpx.Response) -> tuple[str | None, str | None]:
        """(arm, adapter) that answered, as the store logged it: no answer says."""
        self.flush()
        table = interactions_table.c
        query = select(table.arm, table.adapter_name).where(
            table.request_id == response.headers["x-request-id"]
        )
        with self.store.engine.connect() as connection:
            arm, adapter = connection.execute(query).one()
        return arm, adapter

    def arm(self, response: httpx.Response) -> str | None:
        return self.served(response)[0]

    def adapter(self, response: httpx.Response) -> str | None:
        return self.served(response)[1]


@pytest.fixture
def gateway(settings: Settings) -> Iterator[Running]:
    store = FeedbackStore.open(settings)
    routes = RouteStore(store.engine)
    set_champion(routes, "customer_service", CHAMPION, actor="test")
    set_canary(routes, "customer_service", CANARY, 0.05, actor="test")
    with running_stub(StubBehaviour(adapters={CHAMPION, CANARY})) as stub:
        config = GatewaySettings(
            upstreams=(stub.base_url,), routes_refresh_s=0.05, log_flush_s=0.02
        )
        app = create_app(
            settings, config, store=store, routes=RouteStore(store.engine), keys=_keys()
        )
        with serving(app, free_port()) as url:
            yield Running(url, stub, store, routes, app)
    store.close()


def _chat(client: httpx.Client, **extra: Any) -> httpx.Response:
    body = {"model": "customer_service", "messages": [{"role": "user", "content": "hi"}]}
    headers = extra.pop("headers", {})
    body.update(extra)
    return client.post("/v1/chat/completions", json=body, headers=headers)


def test_a_chat_is_served_by_the_routed_adapter_and_logged(gateway: Running) -> None:
    user = next(
        f"u{i}" for i in range(1000) if choose_arm(_table(gateway), f"u{i}")[0] == "champion"
    )
    with gateway.client() as client:
        response = _chat(client, user=user, max_tokens=5)
    assert response.status_code == 200, response.text
    assert gateway.served(response) == ("champion", CHAMPION)
    request_id = response.headers["x-request-id"]
    assert gateway.stub.received[-1]["model"] == CHAMPION
    assert gateway.stub.received[-1]["max_tokens"] == 5
    [row] = gateway.interactions()
    assert row.request_id == request_id
    assert (row.adapter_name, row.adapter_version, row.arm) == (CHAMPION, 1, "champion")
    assert row.user_id == user
    # The key by its name, never its secret: contributions are capped per key too.
    assert row.key_name == "cs"
    assert row.base_model == BASE_MODEL
    assert row.response == response.json()["choices"][0]["message"]["content"]
    assert row.status == "ok"
    assert row.latency_ms > 0
    assert row.ttft_ms > 0
    assert row.source == "gateway"


def _table(gateway: Running) -> Any:
    return gateway.routes.table("customer_service")


def test_no_answer_tells_the_caller_which_adapter_or_arm_served_it(gateway: Running) -> None:
    """A caller that could tell its arm would find the canary's users by trying ids and aim
    feedback at them: no header names the arm or the adapter, the answer's model is the
    line on every path, and an error names no adapter. The store knows which answered."""
    table = _table(gateway)
    users = {
        arm: next(f"u{i}" for i in range(1000) if choose_arm(table, f"u{i}")[0] == arm)
        for arm in ("champion", "canary")
    }
    served = {}
    with gateway.client() as client:
        for arm, user in users.items():
            plain = _chat(client, user=user)
            completion = client.post(
                "/v1/completions", json={"model": "customer_service", "prompt": "hi", "user": user}
            )
            body = {"model": "customer_service", "messages": [{"role": "user", "content": "x"}]}
            with client.stream(
                "POST", "/v1/chat/completions", json={**body, "stream": True, "user": user}
            ) as streamed:
                raw = b"".join(streamed.iter_bytes())
            for answer in (plain, completion, streamed):
                assert answer.status_code == 200
                told = {name for name in answer.headers if name.startswith("x-flywheel-")}
                assert told == {"x-flywheel-business-line"}
            events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: {")]
            models = {plain.json()["model"], completion.json()["model"]}
            assert models | {orjson.loads(event)["model"] for event in events} == {
                "customer_service"
            }
            served[arm] = gateway.served(plain)
    assert served == {"champion": ("champion", CHAMPION), "canary": ("canary", CANARY)}
    set_canary(gateway.routes, "customer_service", "customer_service-v7", 1.0, actor="test")
    time.sleep(0.3)
    with gateway.client() as client:
        missing = _chat(client, user="someone-else")
    assert missing.status_code == 503
    assert "customer_service-v" not in missing.text


def test_a_stream_is_relayed_and_logged_whole(gateway: Running) -> None:
    body = {
        "model": "customer_service",
        "messages": [{"role": "user", "content": "stream please"}],
        "stream": True,
    }
    with gateway.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_bytes())
    events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    text = "".join(orjson.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1])
    [row] = gateway.interactions()
    assert row.response == text
    assert row.status == "ok"
    assert 0 < row.ttft_ms <= row.latency_ms


def test_text_completions_are_proxied_too(gateway: Running) -> None:
    with gateway.client() as client:
        response = client.post("/v1/completions", json={"model": "customer_service", "prompt": "x"})
    assert response.status_code == 200, response.text
    [row] = gateway.interactions()
    assert row.messages == [{"role": "user", "content": "x"}]
    assert row.response == response.json()["choices"][0]["text"]


def test_callers_reach_only_their_own_lines(gateway: Running) -> None:
    with gateway.client(None) as anonymous:
        assert _chat(anonymous).status_code == 401
    with gateway.client("fw-wrong") as stranger:
        assert _chat(stranger).status_code == 401
    with gateway.client(LEGAL_KEY) as legal:
        refused = _chat(legal)
        assert refused.status_code == 404
        assert "customer_service" in refused.json()["error"]["message"]
        assert [m["id"] for m in legal.get("/v1/models").json()["data"]] == ["legal"]
        # Naming an adapter or the base model instead of a line is no way around it.
        for model in (CHAMPION, BASE_MODEL):
            assert _chat(legal, model=model).status_code == 404
    with gateway.client(CS_KEY) as cs:
        served = _chat(cs)
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            assert cs.post(path, json={"lora_name": "x", "lora_path": "/tmp"}).status_code == 404
    request_id = served.headers["x-request-id"]
    with gateway.client(LEGAL_KEY) as legal:
        answer = legal.post("/v1/feedback", json={"request_id": request_id, "type": "thumbs_down"})
        assert answer.status_code == 404
    assert len(gateway.stub.received) == 1


def _shape(response: httpx.Response, name: str) -> tuple[int, dict[str, Any]]:
    """A refusal's status and body with the name the caller sent taken out."""
    body = orjson.loads(response.content.replace(name.encode(), b"NAME"))
    return response.status_code, body


def test_another_tenants_line_or_request_is_answered_as_one_that_does_not_exist(
    gateway: Running,
) -> None:
    """A key learns nothing about other tenants: 'not yours' and 'does not exist' get the
    same status and body (and a request id the same wait before it)."""
    nowhere_id = "req-" + "0" * 32
    with gateway.client() as cs:
        theirs = _chat(cs, user="u1").headers["x-request-id"]
    with gateway.client(LEGAL_KEY) as legal:
        mine = _chat(legal, model="legal").headers["x-request-id"]
        not_mine = _chat(legal, model="customer_service")
        nowhere = _chat(legal, model="no_such_line")
        assert _shape(not_mine, "customer_service") == _shape(nowhere, "no_such_line")
        assert not_mine.status_code == 404
        started = time.monotonic()
        foreign = legal.post("/v1/feedback", json={"request_id": theirs, "type": "abandon"})
        foreign_s = time.monotonic() - started
        missing = legal.post("/v1/feedback", json={"request_id": nowhere_id, "type": "abandon"})
        assert _shape(foreign, theirs) == _shape(missing, nowhere_id)
        assert foreign.status_code == 404
        assert foreign_s >= 0.8 * GatewaySettings().feedback_lookup_wait_s
        replaced = [
            legal.post(
                "/v1/feedback",
                json={"request_id": mine, "type": "regenerate", "replaced_by": other},
            )
            for other in (theirs, nowhere_id)
        ]
        assert _shape(replaced[0], theirs) == _shape(replaced[1], nowhere_id)
        assert replaced[0].status_code == 404
    with gateway.client(ALL_KEY) as ops:
        # A key that may use both lines is told the truth: another line's request.
        crossed = ops.post(
            "/v1/feedback", json={"request_id": mine, "type": "regenerate", "replaced_by": theirs}
        )
        assert crossed.status_code == 400
        assert crossed.json()["error"]["param"] == "replaced_by"
    assert [e.type for e in gateway.feedback()] == []


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "'model'"),
        (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404, "nope"),
        (b'{"model": "customer_service"}', 400, "'messages'"),
        (b'{"model": "customer_service", "messages": [{"role": "robot"}]}', 400, "role"),
        (b'{"model": "customer_service", "messages": [{"role": "user", "content": 5}]}', 400, ""),
    ],
)
def test_bad_input_gets_a_clear_4xx(gateway: Running, body: bytes, status: int, words: str) -> None:
    with gateway.client() as client:
        response = client.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == status
    error = response.json()["error"]
    assert words in error["message"]
    assert error["code"] == status
    assert gateway.stub.received == []


_HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ({"max_tokens": -1}, "max_tokens", "greater than or equal to 1"),
        ({"max_tokens": 100_000}, "max_tokens", "over this gateway's 4096"),
        ({"max_completion_tokens": 5_000}, "max_completion_tokens", "over this gateway's"),
        ({"n": 100_000}, "n", "over this gateway's 4 choices"),
        ({"temperature": 5}, "temperature", "less than or equal to 2"),
        ({"chat_template": "{{ 7*7 }}"}, "chat_template", "may not send it"),
        ({"priority": -100}, "priority", "may not send it"),
        ({"messages": [{"role": "user", "content": "a\x00b"}]}, "messages.0.content", "NUL"),
        ({"messages": _HI * 600}, "messages", "over the 512 limit"),
        (
            {"messages": [{"role": "user", "content": "x" * 300_000}]},
            "messages.0.content",
            "character limit",
        ),
    ],
)
def test_what_vllm_or_the_store_would_refuse_is_a_400_naming_the_field(
    gateway: Running, extra: dict[str, Any], field: str, words: str
) -> None:
    body = {"model": "customer_service", "messages": _HI, **extra}
    with gateway.client() as client:
        response = client.post("/v1/chat/completions", json=body)
        feedback_for_nothing = client.post(
            "/v1/feedback", json={"request_id": "req-" + "1" * 32, "type": "thumbs_up"}
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field
    assert words in error["message"]
    assert gateway.stub.received == []
    assert gateway.interactions() == []
    assert feedback_for_nothing.status_code == 404  # nothing was logged to give feedback on


def test_vllm_sampling_extras_pass_and_a_key_may_allow_server_fields(gateway: Running) -> None:
    with gateway.client() as client:
        sampled = _chat(client, min_tokens=2, top_k=5, repetition_penalty=1.1)
        assert sampled.status_code == 200
        # OpenAI's developer role is accepted: vLLM and the store see a system message.
        developer = _chat(client, messages=[{"role": "developer", "content": "Be brief."}, *_HI])
        assert developer.status_code == 200, developer.text
    assert gateway.stub.received[-1]["messages"][0]["role"] == "system"
    stored = {row.request_id: row for row in gateway.interactions()}
    assert stored[developer.headers["x-request-id"]].messages[0]["role"] == "system"
    trusted = KeyRing(
        [
            ApiKey(
                name="ops",
                sha256=key_digest(ALL_KEY),
                business_lines=("*",),
                allow_server_fields=True,
            )
        ]
    )
    gateway.app.state.gateway.keys = trusted
    gateway.app.state.gateway.keys_watch = None
    with gateway.client(ALL_KEY) as client:
        assert _chat(client, chat_template="{{ messages }}").status_code == 200


def test_an_oversized_body_is_refused_before_it_is_read(gateway: Running) -> None:
    huge = "x" * (2 * 1024 * 1024)
    with gateway.client() as client:
        response = _chat(client, messages=[{"role": "user", "content": huge}])
    assert response.status_code == 413
    assert "limit" in response.json()["error"]["message"]


def test_no_upstream_gives_503_with_a_body_and_the_failure_is_logged(settings: Settings) -> None:
    store = FeedbackStore.open(settings)
    config = GatewaySettings(
        upstreams=(f"http://127.0.0.1:{free_port()}",), base_model_name="b", log_flush_s=0.02
    )
    app = create_app(settings, config, store=store, routes=RouteStore(store.engine), keys=_keys())
    with serving(app, free_port()) as url, httpx.Client(base_url=url) as client:
        headers = {"Authorization": f"Bearer {CS_KEY}"}
        body = {"model": "customer_service", "messages": [{"role": "user", "content": "hi"}]}
        response = client.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 503
        assert "unavailable" in response.json()["error"]["message"]
        request_id = response.headers["x-request-id"]
        assert app.state.gateway.recorder.flush(10)
    with store.engine.connect() as connection:
        row = connection.execute(select(interactions_table)).one()
    assert (row.request_id, row.status) == (request_id, "error")
    assert row.metadata["error_kind"] == "upstream_unavailable"  # the model side's: counted
    store.close()


def test_a_stream_broken_midway_ends_with_an_error_event_and_is_logged(gateway: Running) -> None:
    gateway.stub.behaviour.break_stream_after = 2
    body = {"model": "customer_service", "messages": [{"role": "user", "content": "x"}]}
    body["stream"] = True
    with gateway.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as r:
        raw = b"".join(r.iter_bytes())
    events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    assert orjson.loads(events[-2])["error"]["code"] == 502
    [row] = gateway.interactions()
    assert row.status == "error"
    # No user and no session: the request id picks the arm, so either adapter may serve.
    served = row.adapter_name
    # What reached the client before the cut is logged (an abort may drop unsent bytes).
    relayed = "".join(orjson.loads(e)["choices"][0]["delta"]["content"] for e in events[:-2])
    assert row.response == relayed
    assert served in {CHAMPION, CANARY}
    assert "".join(f"w{i}-{served} " for i in range(2)).startswith(relayed)


def test_the_split_is_sticky_and_a_rollback_reaches_the_gateway_within_a_second(
    gateway: Running,
) -> None:
    users = [f"user-{i}" for i in range(300)]
    with gateway.client() as client:
        first = {u: gateway.arm(_chat(client, user=u)) for u in users}
        again = {u: gateway.arm(_chat(client, user=u)) for u in users[:100]}
        assert all(first[u] == arm for u, arm in again.items())
        assert set(first.values()) == {"champion", "canary"}
        expected = {u: choose_arm(_table(gateway), u)[0] for u in users}
        assert first == expected
        canary_user = next(u for u, arm in first.items() if arm == "canary")
        clear_canary(gateway.routes, "customer_service", actor="test", reason="rollback")
        cleared = time.monotonic()
        while gateway.arm(_chat(client, user=canary_user)) != "champion":
            assert time.monotonic() - cleared < 1.0
            time.sleep(0.01)


def test_a_conversation_keeps_its_adapter_until_that_adapter_is_rolled_back(
    gateway: Running,
) -> None:
    table = _table(gateway)
    user = next(f"u{i}" for i in range(1000) if choose_arm(table, f"u{i}")[0] == "champion")
    headers = {"x-session-id": "conversation-1"}
    with gateway.client() as client:
        assert gateway.adapter(_chat(client, user=user, headers=headers)) == CHAMPION
        set_canary(gateway.routes, "customer_service", CANARY, 1.0, actor="test")
        time.sleep(0.3)
        # Every new user is on the canary now, but this conversation stays where it began.
        assert gateway.adapter(_chat(client, user="someone-new")) == CANARY
        assert gateway.adapter(_chat(client, user=user, headers=headers)) == CHAMPION
        other = {"x-session-id": "conversation-2"}
        assert gateway.adapter(_chat(client, user=user, headers=other)) == CANARY
        clear_canary(gateway.routes, "customer_service", actor="test")
        time.sleep(0.3)
        assert gateway.adapter(_chat(client, user=user, headers=other)) == CHAMPION


def test_the_same_prompt_again_in_a_session_is_a_regenerate(gateway: Running) -> None:
    headers = {"x-session-id": "s-42"}
    with gateway.client() as client:
        first = _chat(client, user="u1", headers=headers).headers["x-request-id"]
        second = _chat(client, user="u1", headers=headers).headers["x-request-id"]
        _chat(client, user="u1", headers={"x-session-id": "s-other"})
        _chat(client, user="u1", headers=headers, messages=[{"role": "user", "content": "new"}])
    [event] = gateway.feedback()
    assert (event.type, event.request_id, event.replaced_by) == ("regenerate", first, second)


def test_a_rephrased_question_and_a_complaint_are_read_as_signals(gateway: Running) -> None:
    """Users who never press a button still say the answer did not help: the same question
    in other words is a regenerate of the answer before it, a follow-up that complains a
    thumbs-down of it; both marked inferred, and only within one session."""
    headers = {"x-session-id": "s-implicit"}
    asked = "How do I return a damaged blender I bought last week?"
    again = "how can I return the damaged blender that I bought last week"
    with gateway.client() as client:
        first = _chat(
            client, user="u1", headers=headers, messages=[{"role": "user", "content": asked}]
        ).headers["x-request-id"]
        second = _chat(
            client, user="u1", headers=headers, messages=[{"role": "user", "content": again}]
        ).headers["x-request-id"]
        complaint = [
            {"role": "user", "content": again},
            {"role": "assistant", "content": "Please contact the manufacturer."},
            {"role": "user", "content": "That's not what I asked, I want my money back."},
        ]
        third = _chat(client, user="u1", headers=headers, messages=complaint)
        # Another session's similar question is no rephrase of this one.
        _chat(client, user="u2", headers={"x-session-id": "s-else"},
              messages=[{"role": "user", "content": asked}])  # fmt: skip
    events = {(e.type, e.request_id): e for e in gateway.feedback()}
    assert set(events) == {("regenerate", first), ("thumbs_down", second)}
    assert events["regenerate", first].replaced_by == second
    assert events["regenerate", first].metadata == {"inferred": "rephrase"}
    assert events["thumbs_down", second].metadata == {"inferred": "complaint"}
    assert third.status_code == 200


def test_another_lines_key_reusing_a_session_id_touches_nothing_of_this_line(
    gateway: Running,
) -> None:
    """Session ids are the caller's: scoped by line, another tenant reusing one can neither
    plant a regenerate on this line's answer nor move its conversation to another model."""
    table = _table(gateway)
    user = next(f"u{i}" for i in range(1000) if choose_arm(table, f"u{i}")[0] == "champion")
    headers = {"x-session-id": "shared-session"}
    with gateway.client() as cs, gateway.client(LEGAL_KEY) as legal:
        first = _chat(cs, user=user, headers=headers)
        assert gateway.adapter(first) == CHAMPION
        # The same session id and prompt from the legal line: its own conversation.
        other = _chat(legal, model="legal", user=user, headers=headers)
        assert other.status_code == 200, other.text
        assert gateway.arm(other) == "base"
        set_canary(gateway.routes, "customer_service", CANARY, 1.0, actor="test")
        time.sleep(0.3)
        follow_up = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
            {"role": "user", "content": "and then?"},
        ]
        again = _chat(cs, user=user, headers=headers, messages=follow_up)
        # Still on the champion it began on (the legal request did not re-pin it).
        assert gateway.adapter(again) == CHAMPION
    assert [e.type for e in gateway.feedback()] == []


def test_idempotency_keys_are_per_line_and_a_reused_key_is_refused(gateway: Running) -> None:
    with gateway.client() as cs, gateway.client(LEGAL_KEY) as legal:
        mine = _chat(cs, user="u1").headers["x-request-id"]
        theirs = _chat(legal, model="legal", user="u1").headers["x-request-id"]
        # The legal tenant uses the key the customer-service tenant will use: no effect on it.
        planted = {"request_id": theirs, "type": "thumbs_up", "idempotency_key": "k-1"}
        assert legal.post("/v1/feedback", json=planted).status_code == 202
        thumbs = {"request_id": mine, "type": "thumbs_down", "idempotency_key": "k-1"}
        assert cs.post("/v1/feedback", json=thumbs).status_code == 202
        assert cs.post("/v1/feedback", json=thumbs).status_code == 202  # a replay
        gateway.flush()
        # The same key for another signal is refused, not accepted and then dropped.
        reused = cs.post("/v1/feedback", json={**thumbs, "type": "abandon"})
        assert reused.status_code == 409
        assert "k-1" in reused.json()["error"]["message"]
        # A regenerate may only be replaced by a request of its own line (another tenant's
        # request is not even known to this key).
        crossed = {"request_id": mine, "type": "regenerate", "replaced_by": theirs}
        refused = cs.post("/v1/feedback", json=crossed)
        assert refused.status_code == 404
        assert refused.json()["error"]["param"] == "replaced_by"
    stored = sorted((e.request_id, e.type) for e in gateway.feedback())
    assert stored == sorted([(theirs, "thumbs_up"), (mine, "thumbs_down")])


def test_feedback_is_stored_once_and_bad_feedback_is_refused(gateway: Running) -> None:
    with gateway.client() as client:
        request_id = _chat(client, user="u7").headers["x-request-id"]
        thumbs = {"request_id": request_id, "type": "thumbs_up"}
        assert client.post("/v1/feedback", json=thumbs).status_code == 202
        again = client.post("/v1/feedback", json=thumbs)
        assert again.status_code == 200
        assert again.json()["status"] == "duplicate"
        edit = {"request_id": request_id, "type": "edit", "edited_text": "Better answer."}
        assert client.post("/v1/feedback", json=edit).status_code == 202
        outcome = {"request_id": request_id, "type": "task_outcome", "outcome": "success"}
        assert client.post("/v1/feedback", json=outcome).status_code == 202
        refused = client.post("/v1/feedback", json={"request_id": request_id, "type": "edit"})
        assert refused.status_code == 400
        assert "edited_text" in refused.json()["error"]["message"]
        unknown = client.post("/v1/feedback", json={"request_id": "req-nope", "type": "abandon"})
        assert unknown.status_code == 404
        assert client.post("/v1/feedback", json={"type": "abandon"}).status_code == 400
    with gateway.client(OPERATOR_KEY) as operator:
        metrics = operator.get("/metrics").text
    stored = gateway.feedback()
    assert sorted(e.type for e in stored) == ["edit", "task_outcome", "thumbs_up"]
    assert {e.user_id for e in stored} == {"u7"}
    assert 'flywheel_gateway_feedback_total{adapter="customer_service-v' in metrics


def test_one_users_repeated_feedback_on_one_answer_counts_once(gateway: Running) -> None:
    with gateway.client() as client:
        request_id = _chat(client, user="u8").headers["x-request-id"]
        statuses = [
            client.post(
                "/v1/feedback",
                json={"request_id": request_id, "type": "thumbs_down", "idempotency_key": f"k{i}"},
            ).status_code
            for i in range(50)
        ]
        # A different signal counts; a different edit replaces the user's earlier one.
        edits = [
            client.post(
                "/v1/feedback",
                json={"request_id": request_id, "type": "edit", "edited_text": text},
            ).status_code
            for text in ("Shorter.", "Shorter.", "Kinder.")
        ]
    assert statuses == [202] + [200] * 49
    assert edits == [202, 200, 202]
    stored = gateway.feedback()
    assert sorted((e.type, e.edited_text) for e in stored) == [
        ("edit", "Kinder."),
        ("thumbs_down", None),
    ]


def test_one_live_edit_per_answer_and_user_the_newest_replacing_the_older(
    gateway: Running,
) -> None:
    with gateway.client() as client:
        request_id = _chat(client, user="u9").headers["x-request-id"]
        texts = [f"Edit {i}: " + "long answer " * 1_000 for i in range(30)]
        for text in texts:
            edit = {"request_id": request_id, "type": "edit", "edited_text": text}
            assert client.post("/v1/feedback", json=edit).status_code == 202
        gateway.flush()
        # Going back to an earlier text is a change, not a copy of the live edit.
        back = {"request_id": request_id, "type": "edit", "edited_text": texts[0]}
        assert client.post("/v1/feedback", json=back).status_code == 202
        assert client.post("/v1/feedback", json=back).status_code == 200
    stored = [e for e in gateway.feedback() if e.type == "edit"]
    assert [(e.user_id, e.edited_text) for e in stored] == [("u9", texts[0])]


def test_feedback_sent_to_another_replica_right_after_the_answer_is_accepted(
    settings: Settings,
) -> None:
    with running_stub(StubBehaviour()) as stub:
        apps = []
        for _ in range(2):
            config = GatewaySettings(upstreams=(stub.base_url,), log_flush_s=0.5)
            replica = build_clients(settings)  # its own set, as in a process of its own
            app = create_app(
                settings,
                config,
                store=replica.store,
                routes=replica.routes,
                keys=_keys(),
                on_shutdown=replica.close,
            )
            apps.append(app)
        with serving(apps[0], free_port()) as first, serving(apps[1], free_port()) as second:
            headers = {"Authorization": f"Bearer {CS_KEY}"}
            answer = httpx.post(
                f"{first}/v1/chat/completions",
                json={"model": "customer_service", "messages": [{"role": "user", "content": "x"}]},
                headers=headers,
                timeout=10,
            )
            request_id = answer.headers["x-request-id"]
            # The first replica has not written it yet (it flushes every 0.5 s).
            given = httpx.post(
                f"{second}/v1/feedback",
                json={"request_id": request_id, "type": "thumbs_up"},
                headers=headers,
                timeout=10,
            )
            assert given.status_code == 202, given.text
            unknown = httpx.post(
                f"{second}/v1/feedback",
                json={"request_id": "req-" + "0" * 32, "type": "thumbs_up"},
                headers=headers,
                timeout=10,
            )
            assert unknown.status_code == 404


def test_metrics_count_requests_latency_and_ttft_per_line_and_adapter(gateway: Running) -> None:
    with gateway.client() as client:
        for index in range(5):
            _chat(client, user=f"m{index}")
    with gateway.client(OPERATOR_KEY) as operator:
        text = operator.get("/metrics").text
    assert "flywheel_gateway_requests_total{" in text
    assert 'business_line="customer_service"' in text
    assert "flywheel_gateway_latency_seconds_bucket{" in text
    assert "flywheel_gateway_ttft_seconds_count{" in text
    assert 'flywheel_gateway_routes_revision{business_line="customer_service"} 2.0' in text
    assert "flywheel_gateway_store_up 1.0" in text


def test_metrics_and_health_detail_need_an_operator_key(gateway: Running) -> None:
    """Every line's counts, adapters (the canary's too) and routing revisions are for an
    operator's key; without one /healthz says only that the replica is alive."""
    with gateway.client() as cs:
        assert _chat(cs, user="m1").status_code == 200
    for key, status in ((None, 401), ("fw-wrong", 401), (CS_KEY, 403), (ALL_KEY, 403)):
        with gateway.client(key) as client:
            scraped = client.get("/metrics")
            assert scraped.status_code == status, (key, scraped.text[:200])
            assert "customer_service" not in scraped.text
    with gateway.client(None) as anonymous:
        health = anonymous.get("/healthz")
    assert health.status_code == 200
    assert set(health.json()) == {"status", "store_up", "routes_age_s"}
    with gateway.client(CS_KEY) as cs:
        assert cs.get("/healthz").status_code == 403
    with gateway.client(OPERATOR_KEY) as operator:
        detail = operator.get("/healthz").json()
        metrics = operator.get("/metrics")
        # The operator's key reads the state of every line; it sends no traffic.
        assert _chat(operator).status_code == 404
    assert detail["routes_revisions"]["customer_service"] == 2
    assert detail["base_model"] == BASE_MODEL
    assert metrics.status_code == 200
    assert 'business_line="customer_service"' in metrics.text


def test_requests_in_flight_are_visible_to_the_unload_drain(gateway: Running) -> None:
    """The drain reads vLLM's own metrics (the stub serves vLLM's gauges)."""
    import threading

    from registry.vllm_admin import vllm_in_flight, wait_drained

    gateway.stub.behaviour.delay_s = 0.8
    in_flight = vllm_in_flight([gateway.stub.base_url])
    table = _table(gateway)
    user = next(f"u{i}" for i in range(1000) if choose_arm(table, f"u{i}")[0] == "champion")
    with gateway.client() as client:
        worker = threading.Thread(target=_chat, args=(client,), kwargs={"user": user})
        worker.start()
        deadline = time.monotonic() + 5
        while in_flight(CHAMPION) == 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert in_flight(CANARY) == 0
        started = time.monotonic()
        wait_drained(CHAMPION, in_flight, timeout_s=10, poll_s=0.05)
        assert time.monotonic() - started > 0.2
        worker.join()
    # Idle: the stale LoRA series does not count, nor does a replica that is gone.
    assert in_flight("stale-v1") == 0
    assert vllm_in_flight([f"http://127.0.0.1:{free_port()}"])(CHAMPION) == 0


def test_a_replica_killed_before_answering_gives_503_not_502(settings: Settings) -> None:
    """The connection sits in a frozen server's backlog, then the kill resets it."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    port = free_port()
    stub = subprocess.Popen(
        [sys.executable, "-m", "tests.stub_vllm", "--port", str(port)],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert stub.stdout is not None
        stub.stdout.readline()  # it prints once it listens
        store = FeedbackStore.open(settings)
        config = GatewaySettings(upstreams=(f"http://127.0.0.1:{port}",), base_model_name="b")
        app = create_app(
            settings, config, store=store, routes=RouteStore(store.engine), keys=_keys()
        )
        with serving(app, free_port()) as url, httpx.Client(base_url=url, timeout=30) as client:
            os.kill(stub.pid, signal.SIGSTOP)
            result: dict[str, httpx.Response] = {}
            body = {"model": "customer_service", "messages": [{"role": "user", "content": "x"}]}
            headers = {"Authorization": f"Bearer {CS_KEY}"}
            worker = threading.Thread(
                target=lambda: result.update(
                    answer=client.post("/v1/chat/completions", json=body, headers=headers)
                )
            )
            worker.start()
            time.sleep(0.5)
            os.kill(stub.pid, signal.SIGKILL)
            worker.join(20)
        assert result["answer"].status_code == 503
        assert "unavailable" in result["answer"].json()["error"]["message"]
        store.close()
    finally:
        if stub.poll() is None:
            os.killpg(stub.pid, signal.SIGKILL)
        stub.wait()


def test_a_key_added_while_the_gateway_runs_works_without_a_restart(settings: Settings) -> None:
    from gateway.keys import add_key

    store = FeedbackStore.open(settings)
    with running_stub(StubBehaviour(adapters=set())) as stub:
        config = GatewaySettings(upstreams=(stub.base_url,), routes_refresh_s=0.05)
        app = create_app(settings, config, store=store, routes=RouteStore(store.engine))
        with serving(app, free_port()) as url, httpx.Client(base_url=url) as client:
            key = add_key(config.resolved_keys_file(settings.home), "late", ["legal"])
            headers = {"Authorization": f"Bearer {key}"}
            deadline = time.monotonic() + 2
            while client.get("/v1/models", headers=headers).status_code == 401:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert [m["id"] for m in client.get("/v1/models", headers=headers).json()["data"]] == [
                "legal"
            ]
    store.close()


def _champion_user(gateway: Running) -> str:
    return next(
        f"u{i}" for i in range(1000) if choose_arm(_table(gateway), f"u{i}")[0] == "champion"
    )


def test_a_plain_answer_is_timed_through_a_stream_and_rebuilt(gateway: Running) -> None:
    """A non-streamed request goes to vLLM as a stream with usage (its first token timed)
    and comes back as the one JSON answer the caller asked for."""
    with gateway.client() as client:
        response = _chat(client, user=_champion_user(gateway))
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion"
    [choice] = answer["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "".join(f"w{i}-{CHAMPION} " for i in range(5))
    assert choice["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == 5
    sent = gateway.stub.received[-1]
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    [row] = gateway.interactions()
    assert 0 < row.ttft_ms <= row.latency_ms
    assert row.metadata["output_tokens"] == 5
    assert row.metadata["tpot_ms"] >= 0
    assert "refusal" not in row.metadata


def test_a_request_whose_answer_cannot_be_rebuilt_goes_as_sent(gateway: Running) -> None:
    """Log-probabilities are not rebuilt from a stream: sent as is, its TTFT unknown (null),
    never its total latency."""
    with gateway.client() as client:
        response = _chat(client, user=_champion_user(gateway), logprobs=True)
    assert response.status_code == 200, response.text
    assert "stream" not in gateway.stub.received[-1]
    [row] = gateway.interactions()
    assert row.ttft_ms is None
    assert row.latency_ms > 0
    assert row.metadata["output_tokens"] == 5


@pytest.mark.parametrize("asked", [False, True])
def test_a_stream_carries_usage_only_when_the_caller_asked(gateway: Running, asked: bool) -> None:
    body: dict[str, Any] = {
        "model": "customer_service",
        "messages": [{"role": "user", "content": "stream please"}],
        "stream": True,
        "user": _champion_user(gateway),
    }
    if asked:
        body["stream_options"] = {"include_usage": True}
    with gateway.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as r:
        raw = b"".join(r.iter_bytes())
    events = [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
    usage = [e for e in events if e.get("usage")]
    assert len(usage) == (1 if asked else 0)
    assert gateway.stub.received[-1]["stream_options"] == {"include_usage": True}
    [row] = gateway.interactions()
    assert row.metadata["output_tokens"] == 5  # vLLM's count, kept whether or not relayed
    assert row.metadata["tpot_ms"] >= 0


def test_a_refusal_is_marked_on_the_interaction(gateway: Running) -> None:
    gateway.stub.behaviour.answers[CHAMPION] = "I'm sorry, but I can't help with that."
    with gateway.client() as client:
        assert _chat(client, user=_champion_user(gateway)).status_code == 200
    [row] = gateway.interactions()
    assert row.metadata["refusal"] is True


def test_answer_timing_can_be_turned_off(settings: Settings) -> None:
    store = FeedbackStore.open(settings)
    with running_stub(StubBehaviour()) as stub:
        config = GatewaySettings(upstreams=(stub.base_url,), log_flush_s=0.02, time_answers=False)
        app = create_app(
            settings, config, store=store, routes=RouteStore(store.engine), keys=_keys()
        )
        with serving(app, free_port()) as url, httpx.Client(base_url=url, timeout=10) as client:
            client.headers["Authorization"] = f"Bearer {CS_KEY}"
            assert _chat(client).status_code == 200
            assert app.state.gateway.recorder.flush(10)
        assert "stream" not in stub.received[-1]
    with store.engine.connect() as connection:
        [row] = connection.execute(select(interactions_table)).all()
    assert row.ttft_ms is None
    store.close()


def test_log_lines_name_the_line_adapter_and_request(
    gateway: Running, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A line logged while serving a request, or by a task it spawned, carries the request's
    line, adapter and id; a background line carries dashes."""
    import asyncio
    import logging

    import gateway.app as app_module

    original = app_module._discover_base_model
    log = logging.getLogger("gateway.test")

    async def spawned() -> None:
        log.warning("from a spawned task")

    async def logging_discovery(state: Any) -> str:
        log.warning("looking up the base model")
        await asyncio.create_task(spawned())
        return await original(state)

    monkeypatch.setattr(app_module, "_discover_base_model", logging_discovery)
    user = _champion_user(gateway)
    with gateway.client() as client:
        response = _chat(client, user=user)
    log.warning("not about a request")
    request_id = response.headers["x-request-id"]
    lines = capsys.readouterr().err.splitlines()
    ids = f"line=customer_service adapter={CHAMPION} request={request_id}"
    assert any(ids in line and "looking up the base model" in line for line in lines)
    assert any(ids in line and "from a spawned task" in line for line in lines)
    assert any("line=- adapter=- request=- not about a request" in line for line in lines)
