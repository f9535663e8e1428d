"""A stand-in for vLLM's OpenAI server, for unit tests of the gateway (and its overhead bench).

It answers instantly, names the model that served each request in the answer,
streams SSE like vLLM, can drop the connection mid-stream, and records what it
received. Integration tests use a real vLLM instead.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

BASE_MODEL = "stub-base"


@dataclass
class StubBehaviour:
    """What the stub does; tests change it while it runs."""

    adapters: set[str] = field(default_factory=set)
    words: int = 5
    break_stream_after: int | None = None
    status: int = 200
    delay_s: float = 0.0
    # A delay per model name instead of ``delay_s`` (e.g. a slow shadow adapter).
    delays: dict[str, float] = field(default_factory=dict)
    # A fixed answer per model name (base or adapter), instead of the numbered words.
    answers: dict[str, str] = field(default_factory=dict)
    # The runtime LoRA routes: the folder each adapter was loaded from, and vLLM's rank cap
    # (an adapter_config.json whose "r" is above it is refused, as vLLM does).
    roots: dict[str, str] = field(default_factory=dict)
    max_lora_rank: int = 16
    # Requests being answered, per model (what vLLM's /metrics report).
    running: dict[str, int] = field(default_factory=dict)
    # The context length the base model lists as max_model_len (None: not listed).
    max_model_len: int | None = None


@dataclass
class StubVllm:
    """A running stub: its URL, behaviour and the request bodies it saw."""

    base_url: str
    behaviour: StubBehaviour
    received: list[dict[str, Any]]


BEHAVIOUR = web.AppKey("behaviour", StubBehaviour)
RECEIVED = web.AppKey("received", list)


def _answer(model: str, words: int) -> list[str]:
    return [f"w{i}-{model} " for i in range(words)]


async def _models(request: web.Request) -> web.Response:
    behaviour: StubBehaviour = request.app[BEHAVIOUR]
    data: list[dict[str, Any]] = [
        {"id": BASE_MODEL, "object": "model", "root": BASE_MODEL, "parent": None}
    ]
    if behaviour.max_model_len is not None:
        data[0]["max_model_len"] = behaviour.max_model_len
    data += [
        {
            "id": name,
            "object": "model",
            "root": behaviour.roots.get(name, f"/adapters/{name}"),
            "parent": BASE_MODEL,
        }
        for name in sorted(behaviour.adapters)
    ]
    return web.json_response({"object": "list", "data": data})


async def _generate(request: web.Request) -> web.StreamResponse:
    behaviour: StubBehaviour = request.app[BEHAVIOUR]
    body = orjson.loads(await request.read())
    request.app[RECEIVED].append(body)
    chat = request.path.endswith("/chat/completions")
    model = body.get("model")
    delay_s = behaviour.delays.get(str(model), behaviour.delay_s)
    if delay_s:
        behaviour.running[str(model)] = behaviour.running.get(str(model), 0) + 1
        try:
            await asyncio.sleep(delay_s)
        finally:
            behaviour.running[str(model)] -= 1
    if behaviour.status != 200:
        error = {"error": {"message": "stub failure", "type": "InternalServerError"}}
        return web.json_response(error, status=behaviour.status)
    if model != BASE_MODEL and model not in behaviour.adapters:
        error = {"error": {"message": f"The model `{model}` does not exist.", "code": 404}}
        return web.json_response(error, status=404)
    if model in behaviour.answers:
        pieces = [f"{word} " for word in behaviour.answers[str(model)].split(" ")]
        pieces[-1] = pieces[-1].rstrip()
    else:
        pieces = _answer(str(model), behaviour.words)
    usage = {"prompt_tokens": 3, "completion_tokens": len(pieces), "total_tokens": 3 + len(pieces)}
    if not body.get("stream"):
        text = "".join(pieces)
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            if chat
            else {"index": 0, "text": text, "finish_reason": "stop"}
        )
        document = {"id": "cmpl-stub", "model": model, "choices": [choice], "usage": usage}
        return web.Response(body=orjson.dumps(document), content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    for index, piece in enumerate(pieces):
        if behaviour.break_stream_after is not None and index >= behaviour.break_stream_after:
            assert request.transport is not None
            request.transport.abort()
            return response
        # As vLLM: the first delta names the role, the last carries the finish reason.
        delta = {"content": piece} | ({"role": "assistant"} if index == 0 else {})
        choice = {"index": 0, "delta": delta} if chat else {"index": 0, "text": piece}
        choice["finish_reason"] = "stop" if index == len(pieces) - 1 else None
        event = {"id": "cmpl-stub", "model": model, "choices": [choice]}
        await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
    if (body.get("stream_options") or {}).get("include_usage"):
        event = {"id": "cmpl-stub", "model": model, "choices": [], "usage": usage}
        await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _metrics(request: web.Request) -> web.Response:
    """vLLM's request gauges and its LoRA info gauge (the newest series is the current one)."""
    behaviour: StubBehaviour = request.app[BEHAVIOUR]
    busy = sorted(m for m, n in behaviour.running.items() if n > 0 and m != BASE_MODEL)
    total = sum(behaviour.running.values())
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{model_name="{BASE_MODEL}"}} {float(total)}',
        "# TYPE vllm:num_requests_waiting gauge",
        f'vllm:num_requests_waiting{{model_name="{BASE_MODEL}"}} 0.0',
        "# TYPE vllm:lora_requests_info gauge",
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="stale-v1",'
        'waiting_lora_adapters=""} 1.0',
        f'vllm:lora_requests_info{{max_lora="4",running_lora_adapters="{",".join(busy)}",'
        f'waiting_lora_adapters=""}} 2.0',
    ]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


def _error(message: str, status: int) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


async def _load(request: web.Request) -> web.Response:
    behaviour: StubBehaviour = request.app[BEHAVIOUR]
    body = orjson.loads(await request.read())
    name, path = body["lora_name"], body["lora_path"]
    if name in behaviour.adapters:
        return _error(f"The lora adapter '{name}' has already been loaded.", 400)
    config = Path(path) / "adapter_config.json"
    if not config.is_file():
        return _error(f"No adapter found for {path}", 404)
    rank = int(orjson.loads(config.read_bytes()).get("r", 8))
    if rank > behaviour.max_lora_rank:
        return _error(
            f"LoRA rank {rank} is greater than max_lora_rank {behaviour.max_lora_rank}.", 400
        )
    behaviour.adapters.add(name)
    behaviour.roots[name] = path
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def _unload(request: web.Request) -> web.Response:
    behaviour: StubBehaviour = request.app[BEHAVIOUR]
    name = orjson.loads(await request.read())["lora_name"]
    if name not in behaviour.adapters:
        return _error(f"The lora adapter '{name}' cannot be found.", 404)
    behaviour.adapters.discard(name)
    behaviour.roots.pop(name, None)
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")


def _application(behaviour: StubBehaviour, received: list[dict[str, Any]]) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[BEHAVIOUR] = behaviour
    app[RECEIVED] = received
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/chat/completions", _generate)
    app.router.add_post("/v1/completions", _generate)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/v1/load_lora_adapter", _load)
    app.router.add_post("/v1/unload_lora_adapter", _unload)
    return app


@contextmanager
def running_stub(behaviour: StubBehaviour | None = None, port: int = 0) -> Iterator[StubVllm]:
    """Run the stub on a thread of its own at ``127.0.0.1:port`` (0: any free port)."""
    behaviour = behaviour or StubBehaviour()
    received: list[dict[str, Any]] = []
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(_application(behaviour, received), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        holder["runner"] = runner
        holder["port"] = runner.addresses[0][1]
        ready.set()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()
        loop.run_until_complete(holder["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=serve, name="stub-vllm", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the stub vLLM did not start")
    try:
        yield StubVllm(f"http://127.0.0.1:{holder['port']}", behaviour, received)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def main() -> None:
    """``python -m tests.stub_vllm --port N [--words W]``: serve until killed (for benches)."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--words", type=int, default=8)
    parser.add_argument("--adapter", action="append", default=[])
    args = parser.parse_args()
    behaviour = StubBehaviour(adapters=set(args.adapter), words=args.words)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with running_stub(behaviour, port=args.port):
        print(f"stub vLLM on 127.0.0.1:{args.port}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
