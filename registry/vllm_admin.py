"""The vLLM adapter admin client: load, unload, list, probe, and reconcile replicas.

vLLM's runtime LoRA API (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``,
needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) answers success in plain text
and errors as JSON ``{"error": {"message", "type", ...}}``; when the switch is
off the routes do not exist and answer a bare ``{"detail": "Not Found"}``. Each
answer becomes a return value or one of the :class:`VllmAdminError` subclasses
below, so callers never parse vLLM's strings.

Adapter names are immutable (``<business_line>-v<version>``): vLLM can reuse
stale prefix-cache entries when a different adapter is reloaded under the same
name (vLLM #30931, #42125), so :meth:`VllmAdminClient.ensure_loaded` refuses to
do that, and :meth:`VllmAdminClient.probe_adapter` checks that a loaded adapter
answers and differs from the base model before any traffic reaches it (an
adapter on modules vLLM does not serve silently answers like the base, #55193).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from flywheel.errors import FlywheelError, ServiceUnavailableError
from flywheel.reachability import what_happened
from registry.names import ADAPTER_NAME, adapter_name

__all__ = [
    "ADAPTER_NAME",
    "AdapterAlreadyLoadedError",
    "AdapterBusyError",
    "AdapterNameConflictError",
    "AdapterNotFoundError",
    "AdapterNotLoadedError",
    "AdapterRejectedError",
    "ChatAnswer",
    "ProbeAnswer",
    "ProbeResult",
    "ReconcileFailure",
    "ReconcileReport",
    "ReplicaReport",
    "RuntimeLoraDisabledError",
    "ServedModel",
    "VllmAdminClient",
    "VllmAdminError",
    "VllmRequestError",
    "VllmUnavailableError",
    "adapter_name",
    "busy_adapters",
    "judge_probe",
    "reconcile",
    "vllm_in_flight",
    "wait_drained",
]

DEFAULT_TIMEOUT_S = 30.0
# A replica that does not accept a connection this soon is down (the gateway's default).
DEFAULT_CONNECT_TIMEOUT_S = 2.0
DEFAULT_PROBE_PROMPTS = (
    "What is the capital of France?",
    "Give me one tip for writing a clear email.",
    "Explain what a refund is in one sentence.",
)


class VllmAdminError(FlywheelError):
    """A vLLM admin call failed; ``status_code`` and ``error_type`` are vLLM's when it answered."""

    def __init__(
        self, message: str, *, status_code: int | None = None, error_type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.error_type = error_type


class VllmUnavailableError(VllmAdminError, ServiceUnavailableError):
    """vLLM could not be reached (connection refused, timeout, broken connection)."""

    exit_code = 7


class VllmRequestError(VllmAdminError):
    """vLLM answered with an error this client has no more specific exception for."""


class RuntimeLoraDisabledError(VllmAdminError):
    """The server runs without ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``: no load/unload routes."""


class AdapterAlreadyLoadedError(VllmAdminError):
    """An adapter is already loaded under this name."""


class AdapterNotFoundError(VllmAdminError):
    """vLLM found no adapter at the path it was asked to load."""


class AdapterRejectedError(VllmRequestError):
    """vLLM refused to load the adapter (e.g. its rank is above ``--max-lora-rank``)."""


class AdapterNotLoadedError(VllmAdminError):
    """No adapter is loaded under this name."""


class AdapterNameConflictError(VllmAdminError):
    """The name is loaded with a different path; names are immutable, so it is not reloaded."""


class AdapterBusyError(VllmAdminError):
    """Requests for the adapter did not drain in time, so it was not unloaded."""


@dataclass(frozen=True)
class ServedModel:
    """One entry of ``GET /v1/models``: the base model, or an adapter on top of it."""

    id: str
    root: str | None
    parent: str | None

    @property
    def is_adapter(self) -> bool:
        """True for a LoRA adapter (vLLM lists its base model as ``parent``)."""
        return self.parent is not None


@dataclass(frozen=True)
class ChatAnswer:
    """The text of one chat completion and how long it took."""

    model: str
    text: str
    latency_s: float


@dataclass(frozen=True)
class ProbeAnswer:
    """One probe prompt with the adapter's and the base model's greedy answers."""

    prompt: str
    adapter_answer: str | None
    base_answer: str
    adapter_error: str | None = None

    @property
    def answered(self) -> bool:
        """True when the adapter gave a non-empty answer."""
        return bool(self.adapter_answer and self.adapter_answer.strip())

    @property
    def differs(self) -> bool:
        """True when the adapter answered something other than the base model."""
        return self.answered and self.adapter_answer != self.base_answer


@dataclass(frozen=True)
class ProbeResult:
    """Whether an adapter may take traffic, with every answer and the reasons."""

    adapter: str
    base_model: str
    passed: bool
    reasons: tuple[str, ...]
    answers: tuple[ProbeAnswer, ...]


def judge_probe(answers: Sequence[ProbeAnswer]) -> tuple[bool, tuple[str, ...]]:
    """Pass when the adapter answered every prompt and at least one answer differs from base."""
    if not answers:
        return False, ("no probe prompts were given",)
    reasons: list[str] = []
    silent = [answer.prompt for answer in answers if not answer.answered]
    if silent:
        reasons.append(f"the adapter gave no answer to {len(silent)} of {len(answers)} prompts")
    differing = sum(answer.differs for answer in answers)
    if differing == 0:
        reasons.append(
            "every answer equals the base model's: the adapter has no effect (does it target "
            "modules vLLM serves LoRA on, and the same base model?)"
        )
    else:
        reasons.append(f"{differing} of {len(answers)} answers differ from the base model's")
    return not silent and differing > 0, tuple(reasons)


def _same_path(served_root: str | None, path: Path | str) -> bool:
    # vLLM reports the path exactly as it was loaded, resolved on the server's disk.
    return served_root is not None and os.path.normpath(served_root) == os.path.normpath(path)


def _error_body(response: httpx.Response) -> tuple[str, str | None, bool]:
    """``(message, error type, is the bare route-level 404)`` of an error response."""
    try:
        body: Any = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase, None, False
    if not isinstance(body, dict):
        return str(body), None, False
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("message", "")), error.get("type"), False
    if "message" in body:
        # Older vLLM releases put the error fields at the top level.
        return str(body["message"]), body.get("type"), False
    detail = body.get("detail")
    return str(detail if detail is not None else body), None, "detail" in body


class VllmAdminClient:
    """Admin calls to one vLLM replica over its OpenAI-compatible HTTP API.

    ``timeout`` bounds each answer (loading an adapter, a probe's generations);
    ``connect_timeout`` the connection, so a replica that is down fails in seconds.
    ``url_setting`` and ``connect_timeout_setting`` name the settings behind the URL and
    the connect timeout, for the messages.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        api_key: str | None = None,
        url_setting: str | None = None,
        connect_timeout_setting: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout, connect=min(connect_timeout, timeout))
        self._settings = (url_setting, connect_timeout_setting)
        self._http = httpx.Client(
            base_url=self.base_url, timeout=self._timeout, transport=transport, headers=headers
        )

    def __repr__(self) -> str:
        return f"VllmAdminClient({self.base_url!r})"

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _send(
        self, method: str, path: str, payload: Mapping[str, Any] | None = None
    ) -> httpx.Response:
        try:
            return self._http.request(method, path, json=payload)
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: httpx.TransportError) -> VllmUnavailableError:
        connecting = isinstance(exc, httpx.ConnectTimeout)
        waited = self._timeout.connect if connecting else self._timeout.read
        url_setting, timeout_setting = self._settings
        named = [url_setting] if url_setting else []
        if connecting and timeout_setting:
            named.append(f"{timeout_setting} sets the wait")
        return VllmUnavailableError(
            f"vLLM at {self.base_url} is unreachable: it {what_happened(exc, waited or 0.0)}"
            + (f" ({'; '.join(named)})" if named else "")
            + "; is the server running?"
        )

    def _disabled(self, response: httpx.Response) -> RuntimeLoraDisabledError:
        return RuntimeLoraDisabledError(
            f"vLLM at {self.base_url} has no runtime LoRA API ({response.request.url.path} "
            "answered 404 Not Found): start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True "
            "and --enable-lora",
            status_code=response.status_code,
        )

    def _unexpected(self, action: str, response: httpx.Response) -> VllmRequestError:
        message, error_type, _ = _error_body(response)
        status = " ".join(str(part) for part in (response.status_code, error_type) if part)
        return VllmRequestError(
            f"{action} on vLLM at {self.base_url} failed with {status}: {message}",
            status_code=response.status_code,
            error_type=error_type,
        )

    def load_adapter(self, name: str, path: Path | str) -> None:
        """Load the LoRA adapter at ``path`` (a folder on the server's disk) as ``name``."""
        response = self._send(
            "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}
        )
        if response.status_code == 200:
            return
        message, error_type, bare = _error_body(response)
        if response.status_code == 404 and bare:
            raise self._disabled(response)
        if response.status_code == 400 and "already been loaded" in message:
            raise AdapterAlreadyLoadedError(
                f"an adapter is already loaded as {name!r} on {self.base_url}",
                status_code=400,
                error_type=error_type,
            )
        if response.status_code == 404:
            raise AdapterNotFoundError(
                f"vLLM at {self.base_url} found no LoRA adapter at {path} (is the folder on the "
                f"server's disk, with adapter_config.json?): {message}",
                status_code=404,
                error_type=error_type,
            )
        if response.status_code in {400, 422, 500}:
            raise AdapterRejectedError(
                f"vLLM at {self.base_url} refused adapter {name!r} from {path}: {message}",
                status_code=response.status_code,
                error_type=error_type,
            )
        raise self._unexpected(f"loading adapter {name!r} from {path}", response)

    def unload_adapter(self, name: str) -> None:
        """Unload the adapter served as ``name``."""
        response = self._send("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        if response.status_code == 200:
            return
        message, error_type, bare = _error_body(response)
        if response.status_code == 404 and bare:
            raise self._disabled(response)
        if response.status_code == 404 or (
            response.status_code == 400 and "cannot be found" in message
        ):
            raise AdapterNotLoadedError(
                f"no adapter is loaded as {name!r} on {self.base_url}",
                status_code=response.status_code,
                error_type=error_type,
            )
        raise self._unexpected(f"unloading adapter {name!r}", response)

    def list_models(self) -> list[ServedModel]:
        """The base model and every adapter the server serves now."""
        response = self._send("GET", "/v1/models")
        if response.status_code != 200:
            raise self._unexpected("listing models", response)
        return [
            ServedModel(id=entry["id"], root=entry.get("root"), parent=entry.get("parent"))
            for entry in response.json().get("data", [])
        ]

    def served_adapter(self, name: str) -> ServedModel | None:
        """The adapter served as ``name``, or None."""
        return next(
            (model for model in self.list_models() if model.id == name and model.is_adapter), None
        )

    def ensure_loaded(self, name: str, path: Path | str) -> bool:
        """Load ``path`` as ``name`` unless it already is; True when this call loaded it.

        Raises :class:`AdapterNameConflictError` when ``name`` is loaded from another
        path: names are immutable, so the fix is a new version, never a reload.
        """
        served = self.served_adapter(name)
        if served is None:
            try:
                self.load_adapter(name, path)
            except AdapterAlreadyLoadedError:
                # Another caller won the race; check it loaded the same thing.
                served = self.served_adapter(name)
            else:
                return True
        if served is not None and _same_path(served.root, path):
            return False
        raise AdapterNameConflictError(
            f"{name!r} is already loaded on {self.base_url} from "
            f"{served.root if served else 'an unknown path'}, not {path}; adapter names are "
            "immutable (vLLM can serve stale cache entries after a reload): register a new "
            "version instead",
            error_type="NameConflict",
        )

    def chat(
        self, model: str, prompt: str, *, max_tokens: int = 32, temperature: float = 0.0
    ) -> ChatAnswer:
        """One chat completion of a single user message (greedy by default)."""
        payload = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        started = time.monotonic()
        response = self._send("POST", "/v1/chat/completions", payload)
        latency = time.monotonic() - started
        if response.status_code != 200:
            raise self._unexpected(f"a chat completion with {model!r}", response)
        content = response.json()["choices"][0]["message"].get("content") or ""
        return ChatAnswer(model=model, text=content, latency_s=latency)

    def probe_adapter(
        self,
        name: str,
        *,
        prompts: Sequence[str] = DEFAULT_PROBE_PROMPTS,
        max_tokens: int = 32,
        base_model: str | None = None,
    ) -> ProbeResult:
        """Ask the adapter and its base model the same prompts greedily; judge the answers.

        The base model defaults to the adapter's ``parent`` in ``/v1/models``.
        An error answer from the adapter fails the probe; one from the base
        model, or an unreachable server, raises.
        """
        if base_model is None:
            served = self.served_adapter(name)
            if served is None or served.parent is None:
                raise AdapterNotLoadedError(
                    f"cannot probe {name!r}: it is not loaded on {self.base_url}"
                )
            base_model = served.parent
        answers = []
        for prompt in prompts:
            base = self.chat(base_model, prompt, max_tokens=max_tokens).text
            try:
                adapter: str | None = self.chat(name, prompt, max_tokens=max_tokens).text
                error = None
            except VllmRequestError as exc:
                adapter, error = None, str(exc)
            answers.append(ProbeAnswer(prompt, adapter, base, error))
        passed, reasons = judge_probe(answers)
        return ProbeResult(name, base_model, passed, reasons, tuple(answers))


def busy_adapters(metrics_text: str) -> set[str]:
    """Adapters with requests running or waiting, read off a vLLM server's ``/metrics``.

    ``vllm:lora_requests_info`` is a gauge per label set (running and waiting adapters,
    comma-joined) set to the time it was last true, so the newest series is the current
    one; it is only refreshed while the engine steps, so a server whose request gauges
    (``vllm:num_requests_running`` / ``_waiting``) read 0 has nothing in flight.
    """
    from prometheus_client.parser import text_string_to_metric_families

    requests = 0.0
    newest: tuple[float, set[str]] | None = None
    for family in text_string_to_metric_families(metrics_text):
        if family.name in {"vllm:num_requests_running", "vllm:num_requests_waiting"}:
            requests += sum(sample.value for sample in family.samples)
        elif family.name == "vllm:lora_requests_info":
            for sample in family.samples:
                names = {
                    name
                    for key in ("running_lora_adapters", "waiting_lora_adapters")
                    for name in sample.labels.get(key, "").split(",")
                    if name
                }
                if newest is None or sample.value > newest[0]:
                    newest = (sample.value, names)
    if requests <= 0 or newest is None:
        return set()
    return newest[1]


def vllm_in_flight(upstreams: Sequence[str], timeout_s: float = 5.0) -> Callable[[str], int]:
    """``in_flight(adapter)``: on how many replicas ``adapter`` has requests in flight, from
    vLLM's own metrics (a replica that does not answer serves nothing and counts 0)."""

    def in_flight(adapter: str) -> int:
        busy = 0
        for url in upstreams:
            try:
                response = httpx.get(f"{url.rstrip('/')}/metrics", timeout=timeout_s)
                response.raise_for_status()
            except httpx.HTTPError:
                continue
            busy += adapter in busy_adapters(response.text)
        return busy

    return in_flight


def wait_drained(
    name: str,
    in_flight: Callable[[str], int],
    *,
    timeout_s: float,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once ``in_flight(name)`` is 0; raise :class:`AdapterBusyError` after ``timeout_s``."""
    deadline = clock() + timeout_s
    while True:
        running = in_flight(name)
        if running <= 0:
            return
        if clock() >= deadline:
            raise AdapterBusyError(
                f"{running} requests for {name!r} were still in flight after {timeout_s:.0f} s; "
                "it stays loaded (retry the reconcile once its traffic is routed away)"
            )
        sleep(poll_s)


@dataclass(frozen=True)
class ReconcileFailure:
    """One thing reconcile could not do on one replica."""

    adapter: str | None
    error: VllmAdminError

    def __str__(self) -> str:
        return f"{self.adapter}: {self.error}" if self.adapter else str(self.error)


@dataclass
class ReplicaReport:
    """What reconcile did on one replica."""

    replica: str
    loaded: list[str] = field(default_factory=list)
    unloaded: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    failures: list[ReconcileFailure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the replica now serves exactly the desired adapters."""
        return not self.failures


@dataclass(frozen=True)
class ReconcileReport:
    """Per replica, what reconcile loaded, unloaded, kept, left alone, and failed to do."""

    replicas: tuple[ReplicaReport, ...]

    @property
    def ok(self) -> bool:
        """True when every replica reached the desired set."""
        return all(replica.ok for replica in self.replicas)

    def raise_for_failures(self) -> None:
        """Raise one :class:`VllmAdminError` that lists every failure, if there was any."""
        lines = [
            f"{replica.replica}: {failure}"
            for replica in self.replicas
            for failure in replica.failures
        ]
        if lines:
            raise VllmAdminError("reconciling vLLM adapters failed:\n" + "\n".join(lines))


def _no_requests(_name: str) -> int:
    return 0


def reconcile(
    replicas: Iterable[VllmAdminClient],
    desired: Mapping[str, Path | str],
    *,
    in_flight: Callable[[str], int] | None = None,
    keep: Collection[str] = (),
    drain_timeout_s: float = 60.0,
    poll_s: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ReconcileReport:
    """Make every replica serve exactly the ``desired`` flywheel adapters (name to path).

    Loads come before unloads, so a switch-over never leaves a gap. Only
    ``<line>-v<n>`` names are unloaded; others belong to someone else and are
    reported as ignored, and so are the names in ``keep`` (a candidate loaded for its
    probe, not routed yet). An adapter is unloaded only after ``in_flight(name)``
    (the gateway's count of running requests) reaches 0. A failing replica or
    adapter is reported and the rest carry on.
    """
    wrong = sorted(name for name in desired if not ADAPTER_NAME.fullmatch(name))
    if wrong:
        raise FlywheelError(f"adapter names must look like <business_line>-v<version>: {wrong}")
    counter = in_flight or _no_requests
    reports = []
    for replica in replicas:
        report = ReplicaReport(replica=replica.base_url)
        reports.append(report)
        try:
            served = {model.id: model for model in replica.list_models() if model.is_adapter}
        except VllmAdminError as exc:
            report.failures.append(ReconcileFailure(None, exc))
            continue
        for name, path in sorted(desired.items()):
            try:
                if replica.ensure_loaded(name, path):
                    report.loaded.append(name)
                else:
                    report.kept.append(name)
            except VllmAdminError as exc:
                report.failures.append(ReconcileFailure(name, exc))
        for name in sorted(set(served) - set(desired)):
            if not ADAPTER_NAME.fullmatch(name) or name in keep:
                report.ignored.append(name)
                continue
            try:
                wait_drained(
                    name,
                    counter,
                    timeout_s=drain_timeout_s,
                    poll_s=poll_s,
                    sleep=sleep,
                    clock=clock,
                )
                replica.unload_adapter(name)
            except AdapterNotLoadedError:
                pass  # already gone, which is the goal
            except VllmAdminError as exc:
                report.failures.append(ReconcileFailure(name, exc))
                continue
            report.unloaded.append(name)
    return ReconcileReport(tuple(reports))
