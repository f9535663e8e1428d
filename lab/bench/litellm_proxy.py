"""LiteLLM's proxy in front of an OpenAI-compatible server, as a baseline for the gateway benchmark.

LiteLLM gets its own virtualenv (``<repo>/.venv-litellm`` by default): ``litellm[proxy]``
pins its own fastapi, pydantic and openai, which must not meet the project's.
:func:`ensure_litellm` builds it once; :class:`LitellmProxy` writes a one-model config,
runs ``litellm --config`` from that virtualenv in its own process group, waits until it
answers, and stops the whole group afterwards::

    python = ensure_litellm(DEFAULT_VENV)
    with LitellmProxy(python, "http://127.0.0.1:8000", "base", "flywheel", 4100, log) as proxy:
        proxy.warm_up()
        httpx.post(f"{proxy.base_url}/v1/chat/completions", headers=proxy.headers, json=...)

The upstream is declared as ``hosted_vllm/<served_model>`` with ``api_base: <upstream>/v1``:
the provider LiteLLM documents for vLLM (``openai/`` goes through the OpenAI SDK and
measured no faster on a stub upstream). Clients send ``model: <public_name>``; the
upstream sees ``<served_model>``.

What is set, and why (a fair default proxy, minus what an operator would switch off on a
benchmark host without internet):

- ``LITELLM_MASTER_KEY``: a random ``sk-`` key per run. This LiteLLM refuses to start
  without one (``UnsafeMasterKeyError``); clients send it as a bearer token
  (:attr:`LitellmProxy.headers`), as they do to our gateway. Without a database it is
  checked in memory.
- ``LITELLM_LOCAL_MODEL_COST_MAP=True``: otherwise the import fetches the cost map from
  GitHub (three tries with back-off) before falling back to the bundled copy.
- ``LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS``, ``_BLOG_POSTS``, ``_POLICY_TEMPLATES``,
  ``_AUTOROUTER_PRESETS=True``: the other files LiteLLM would fetch from GitHub (lazily).
- ``LITELLM_TELEMETRY_DISABLED=true``, ``DO_NOT_TRACK=1``, ``HF_HUB_OFFLINE=1``: no
  usage reports (LiteLLM's are opt-in; this is a veto) and no hub look-ups.
- ``LITELLM_MODE=PRODUCTION``: no ``.env`` is loaded from the working directory.
- ``DISABLE_ADMIN_UI=True``: the admin UI is not served (nothing here uses it).
- ``LITELLM_LOG=WARNING``: LiteLLM's default loggers already log at WARNING; setting it
  also sets uvicorn's level, which drops uvicorn's per-request access-log line
  (``access_log=True`` leaves it unset, LiteLLM's default). Debug logging stays off.
- No ``DATABASE_URL``, no ``REDIS_*`` (both would switch on spend tracking or shared
  caches): inherited ``LITELLM_*``, ``DATABASE_*``, ``REDIS_*`` and tracing variables are
  dropped, so a PostgreSQL or Redis meant for the project is never picked up.
- One uvicorn worker unless ``workers`` says otherwise (LiteLLM's default and its advice:
  one worker per container, scale out).

Left at LiteLLM's defaults: its per-request auth, routing, cost calculation and
``x-litellm-*`` response headers, and no forwarding of client headers upstream
(``forward_client_headers=True`` sets ``forward_client_headers_to_llm_api``, which
forwards every ``x-*`` header, ``x-request-id`` included).

Worth knowing when reading the numbers (LiteLLM 1.108.7, measured on a stub upstream on a
loaded 2-core machine): start-up takes about 9-15 s (one worker); the first request after
start imports provider code and takes 0.5-1 s (hence :meth:`LitellmProxy.warm_up`); a
non-streaming request costs the proxy about 14-20 ms of CPU; a streamed answer about
1 ms of CPU per chunk on top, and LiteLLM adds ``stream_options: {include_usage: true}``
to what it sends upstream. A request without a key answers 500, not 401 (the error path
imports ``prisma``, which the ``proxy`` extra does not install).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from flywheel.processes import ServerProcess

LITELLM_VERSION = "1.108.7"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO / ".venv-litellm"
MARKER_FILE = "flywheel-litellm.installed"
INSTALL_LOG_FILE = "flywheel-litellm-install.log"
INSTALL_TIMEOUT_S = 1_800.0
LOG_TAIL_LINES = 40
PROVIDER = "hosted_vllm"

# The environment LiteLLM runs with; see the module docstring for why each is set.
OFFLINE_ENV: Mapping[str, str] = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True",
    "LITELLM_TELEMETRY_DISABLED": "true",
    "LITELLM_MODE": "PRODUCTION",
    "DISABLE_ADMIN_UI": "True",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
}
# Inherited variables that would change what LiteLLM does (a database, Redis, tracing).
_DROPPED_PREFIXES = ("LITELLM_", "DATABASE_", "REDIS_", "OTEL_", "LANGFUSE_", "PROMETHEUS_")
_DROPPED_NAMES = frozenset(
    {
        "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PIP_REQUIRE_VIRTUALENV",
        "DIRECT_URL", "JSON_LOGS", "STORE_MODEL_IN_DB", "DISABLE_ADMIN_UI",
        "NUM_WORKERS", "DEFAULT_NUM_WORKERS_LITELLM_PROXY", "KEEPALIVE_TIMEOUT",
    }
)  # fmt: skip

logger = logging.getLogger(__name__)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file (empty when it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def clean_environment(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` less the variables that would leak a virtualenv or a service into LiteLLM."""
    return {
        key: value
        for key, value in base.items()
        if key not in _DROPPED_NAMES and not key.startswith(_DROPPED_PREFIXES)
    }


def ensure_litellm(
    venv: Path = DEFAULT_VENV,
    *,
    version: str = LITELLM_VERSION,
    base_python: str = "python3.11",
    report: Callable[[str], None] | None = None,
) -> Path:
    """Build the LiteLLM virtualenv at ``venv`` if needed (about 90 s, 750 MB); return its python.

    Idempotent: a marker file holding the version is written last, so a finished install is
    reused and an interrupted one is removed and rebuilt. The pip output goes to
    ``<venv>/flywheel-litellm-install.log``; a failed step raises :class:`RuntimeError`
    with that log's tail. Safe to call from several processes at once.
    """
    say = report or logger.info
    python = venv / "bin" / "python"
    marker = venv / MARKER_FILE
    if _installed(marker, python, version):
        return python
    with _lock(venv.absolute().parent, say, venv):
        if _installed(marker, python, version):
            return python
        started = time.monotonic()
        _remove_unfinished(venv, say)
        venv.mkdir(parents=True, exist_ok=True)
        # As Python 3.13's venv does: a virtualenv inside a checkout stays out of git and ruff.
        (venv / ".gitignore").write_text("*\n", encoding="utf-8")
        install_log = venv / INSTALL_LOG_FILE
        install_log.write_text("", encoding="utf-8")
        steps: list[tuple[str, list[str | Path]]] = [
            (f"creating {venv}", [base_python, "-m", "venv", venv]),
            ("upgrading pip", [python, "-m", "pip", "install", "--upgrade", "pip"]),
            (
                f"installing litellm[proxy]=={version} (a minute or two)",
                [python, "-m", "pip", "install", f"litellm[proxy]=={version}"],
            ),
            (
                "checking that the proxy imports",
                [python, "-c", "import litellm.proxy.proxy_server"],
            ),
        ]
        for description, argv in steps:
            _step(description, argv, install_log, say)
        marker.write_text(version + "\n", encoding="utf-8")
        say(f"LiteLLM {version} ready in {venv} after {time.monotonic() - started:.0f} s")
    return python


def _installed(marker: Path, python: Path, version: str) -> bool:
    try:
        return marker.read_text(encoding="utf-8").strip() == version and python.exists()
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def _lock(folder: Path, say: Callable[[str], None], venv: Path) -> Iterator[None]:
    # The parent folder is the lock: a rebuild deletes the virtualenv itself.
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another process to finish building {venv}")
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _remove_unfinished(venv: Path, say: Callable[[str], None]) -> None:
    if not venv.exists():
        return
    entries = {entry.name for entry in venv.iterdir()}
    if entries and not entries & {"pyvenv.cfg", INSTALL_LOG_FILE, MARKER_FILE}:
        raise RuntimeError(
            f"{venv} exists and is not a virtualenv; move it away or pick another folder"
        )
    say(f"removing the unfinished LiteLLM virtualenv at {venv}")
    shutil.rmtree(venv)


def _step(
    description: str, argv: Sequence[str | Path], install_log: Path, say: Callable[[str], None]
) -> None:
    say(description)
    command = [str(part) for part in argv]
    with install_log.open("a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        try:
            completed = subprocess.run(  # our own argv, no shell
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**clean_environment(os.environ), **OFFLINE_ENV},
                timeout=INSTALL_TIMEOUT_S,
                check=False,
            )
            returncode = completed.returncode
        except subprocess.TimeoutExpired:
            log.write(f"timed out after {INSTALL_TIMEOUT_S:.0f} s\n")
            returncode = -1
        except OSError as error:  # e.g. no python3.11 on PATH
            log.write(f"{error}\n")
            returncode = -1
    if returncode != 0:
        raise RuntimeError(
            f"{description} failed (exit {returncode}); see {install_log}:\n"
            + log_tail(install_log)
        )


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((host, port)) == 0


class LitellmProxy(ServerProcess):
    """One LiteLLM proxy process serving one upstream model; a context manager.

    ``upstream_base_url`` is the OpenAI-compatible server's root (``/v1`` is added when
    missing), ``served_model`` the name it serves the model under, ``public_name`` the
    name clients ask for. The config is written beside ``log_path`` (``<stem>.yaml``);
    the master key travels in the environment, not in that file.
    """

    process_name = "LiteLLM"
    stop_grace_s = 15.0

    def __init__(
        self,
        python: Path,
        upstream_base_url: str,
        served_model: str,
        public_name: str,
        port: int,
        log_path: Path,
        workers: int = 1,
        *,
        host: str = "127.0.0.1",
        master_key: str | None = None,
        upstream_api_key: str = "EMPTY",
        access_log: bool = False,
        forward_client_headers: bool = False,
        start_timeout_s: float = 180.0,
        report: Callable[[str], None] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.python = python
        self.upstream_base_url = upstream_base_url
        self.served_model = served_model
        self.public_name = public_name
        self.host = host
        self.port = port
        self.log_path = log_path
        self.workers = workers
        self.api_key = master_key or f"sk-{secrets.token_hex(24)}"
        self.upstream_api_key = upstream_api_key
        self.access_log = access_log
        self.forward_client_headers = forward_client_headers
        self.start_timeout_s = start_timeout_s
        self.startup_s: float | None = None
        super().__init__(report or logger.info)

    @property
    def base_url(self) -> str:
        """The proxy's root URL (the OpenAI API is under ``/v1``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header a client sends (the master key as a bearer token)."""
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def config_path(self) -> Path:
        """Where the config YAML is written."""
        return self.log_path.with_name(f"{self.log_path.stem}.yaml")

    @property
    def pid(self) -> int | None:
        """The proxy's process id (and process group) while it runs."""
        return self._process.pid if self._process else None

    def config(self) -> dict[str, Any]:
        """The proxy config: one model, no database, no callbacks."""
        api_base = self.upstream_base_url.rstrip("/")
        if not api_base.endswith("/v1"):
            api_base += "/v1"
        config: dict[str, Any] = {
            "model_list": [
                {
                    "model_name": self.public_name,
                    "litellm_params": {
                        "model": f"{PROVIDER}/{self.served_model}",
                        "api_base": api_base,
                        "api_key": self.upstream_api_key,
                    },
                }
            ],
            "general_settings": {},
        }
        if self.forward_client_headers:
            config["general_settings"]["forward_client_headers_to_llm_api"] = True
        return config

    def command(self) -> list[str]:
        """The proxy's argv (``python -m litellm`` is not a module entry point; the CLI is)."""
        argv = [
            str(self.python.parent / "litellm"),
            "--config", str(self.config_path),
            "--host", self.host,
            "--port", str(self.port),
        ]  # fmt: skip
        if self.workers > 1:
            argv += ["--num_workers", str(self.workers)]
        return argv

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The proxy's environment: ``base`` (this process's by default), cleaned, plus ours."""
        env = clean_environment(os.environ if base is None else base)
        env.update(OFFLINE_ENV)
        if not self.access_log:
            env["LITELLM_LOG"] = "WARNING"
        env["LITELLM_MASTER_KEY"] = self.api_key
        return env

    def start(self) -> None:
        """Start the proxy and wait until it answers (RuntimeError with the log tail if not)."""
        if self._process is not None:
            raise RuntimeError(f"the LiteLLM proxy on {self.base_url} is already running")
        executable = Path(self.command()[0])
        if not executable.exists():
            raise RuntimeError(f"{executable} does not exist: run ensure_litellm() first")
        if _port_in_use(self.host, self.port):
            raise RuntimeError(f"something already listens on {self.base_url}; pick another port")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False), "utf-8")
        self._log = self.log_path.open("wb")
        started = time.monotonic()
        self._report(f"starting LiteLLM on {self.base_url} (log: {self.log_path})")
        self._process = subprocess.Popen(  # our own argv, no shell
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            cwd=self.log_path.parent,
            # Its own process group, so stop() reaches every uvicorn worker.
            start_new_session=True,
        )
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        self._report(f"LiteLLM answers on {self.base_url} after {self.startup_s:.1f} s")

    def _wait_ready(self, started: float) -> None:
        assert self._process is not None
        deadline = started + self.start_timeout_s
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                code = self._process.poll()
                if code is not None:
                    raise RuntimeError(
                        f"LiteLLM exited with code {code} while starting; last lines of "
                        f"{self.log_path}:\n{log_tail(self.log_path)}"
                    )
                try:
                    models = client.get(f"{self.base_url}/v1/models", headers=self.headers)
                except httpx.TransportError:
                    time.sleep(0.25)
                    continue
                if models.status_code == 200:
                    names = {entry.get("id") for entry in models.json().get("data", [])}
                    if self.public_name in names:
                        return
                    raise RuntimeError(
                        f"LiteLLM on {self.base_url} lists {sorted(map(str, names))}, "
                        f"not {self.public_name!r}; see {self.log_path}"
                    )
                time.sleep(0.25)
        raise RuntimeError(
            f"LiteLLM did not answer on {self.base_url} within {self.start_timeout_s:.0f} s; "
            f"last lines of {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def warm_up(self, requests: int = 3, max_tokens: int = 1) -> None:
        """Send a few small chat completions, plain and streamed, through the proxy.

        LiteLLM imports its provider code on the first request (about a second); a
        benchmark should not count that. Each request reaches the upstream.
        """
        body: dict[str, Any] = {
            "model": self.public_name,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": max_tokens,
        }
        url = f"{self.base_url}/v1/chat/completions"
        with httpx.Client(timeout=120.0, headers=self.headers, trust_env=False) as client:
            for _ in range(requests):
                client.post(url, json=body).raise_for_status()
                with client.stream("POST", url, json={**body, "stream": True}) as streamed:
                    streamed.raise_for_status()
                    for _line in streamed.iter_lines():
                        pass
