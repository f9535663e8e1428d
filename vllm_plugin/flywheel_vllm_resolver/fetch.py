"""Fetching a registered adapter by name, with no vLLM import: the resolver's logic.

vLLM calls the resolver for an adapter name it does not serve. This module runs
flywheel's own fetch command (``flywheel adapters fetch NAME --cache DIR
--served-base MODEL_DIR``, which downloads the adapter's artifacts from the
registry, verifies their digest and the base model they were trained on, and
prints the folder's path) as a subprocess: vLLM's virtualenv has none of
flywheel's dependencies, so flywheel runs from its own. Everything here is
stdlib, so it is tested without vLLM.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

FETCH_ENV = "FLYWHEEL_ADAPTER_FETCH"
CACHE_ENV = "FLYWHEEL_ADAPTER_CACHE"
SERVED_BASE_ENV = "FLYWHEEL_ADAPTER_SERVED_BASE"
TIMEOUT_ENV = "FLYWHEEL_ADAPTER_FETCH_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
# flywheel's adapter names: <business line>-v<version> (registry/names.py spells the same).
ADAPTER_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}-v[0-9]{1,9}")
# vLLM's LoRA ids are positive ints that must fit a C int on some kernels.
_ID_SPACE = 2**31 - 1

# (exit code, stdout, stderr) of one run of an argv.
RunResult = tuple[int, str, str]
Runner = Callable[[Sequence[str], float], Awaitable[RunResult]]


class ResolverConfigError(ValueError):
    """The environment `flywheel serve vllm` sets for the resolver is missing or malformed."""


@dataclass(frozen=True, slots=True)
class FetchSettings:
    """How the resolver fetches: the command's argv prefix, the cache, the served base."""

    command: tuple[str, ...]
    cache_dir: Path
    served_base: Path | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FetchSettings | None:
        """The settings in ``environ`` (this process's by default); None when the fetch
        command is not set (vLLM started by something other than `flywheel serve vllm`)."""
        env = os.environ if environ is None else environ
        raw = env.get(FETCH_ENV, "").strip()
        if not raw:
            return None
        try:
            command = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ResolverConfigError(f"{FETCH_ENV} is not a JSON list of strings: {exc}") from None
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(part, str) and part for part in command)
        ):
            raise ResolverConfigError(f"{FETCH_ENV} must be a non-empty JSON list of strings")
        cache = env.get(CACHE_ENV, "").strip()
        if not cache:
            raise ResolverConfigError(f"{CACHE_ENV} is not set: where fetched adapters go")
        base = env.get(SERVED_BASE_ENV, "").strip()
        try:
            timeout_s = float(env.get(TIMEOUT_ENV, "") or DEFAULT_TIMEOUT_S)
        except ValueError:
            raise ResolverConfigError(f"{TIMEOUT_ENV} is not a number of seconds") from None
        if timeout_s <= 0:
            raise ResolverConfigError(f"{TIMEOUT_ENV} must be positive")
        return cls(tuple(command), Path(cache), Path(base) if base else None, timeout_s)

    def argv(self, name: str) -> list[str]:
        """The fetch command for adapter ``name``."""
        argv = [*self.command, name, "--cache", str(self.cache_dir)]
        if self.served_base is not None:
            argv += ["--served-base", str(self.served_base)]
        return argv


@dataclass(frozen=True, slots=True)
class FetchOutcome:
    """A fetched adapter's folder, or why there is none."""

    name: str
    path: Path | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        """True when the adapter was fetched."""
        return self.path is not None


def is_adapter_name(name: str) -> bool:
    """True for a flywheel adapter name (``<line>-v<version>``); other names are not ours."""
    return ADAPTER_NAME.fullmatch(name) is not None


def stable_lora_id(name: str) -> int:
    """A positive id for ``name``, the same in every process (Python's ``hash`` of a str
    differs per process, so vLLM's built-in resolvers' ``abs(hash(name))`` does too)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % _ID_SPACE + 1


def outcome_of(name: str, result: RunResult) -> FetchOutcome:
    """Read one run of the fetch command: the last line of stdout is the folder on exit 0;
    otherwise the last line of stderr is the reason."""
    code, stdout, stderr = result
    if code == 0:
        lines = [line.strip() for line in stdout.splitlines() if line.strip()]
        if not lines:
            return FetchOutcome(name, None, "the fetch command printed no folder")
        path = Path(lines[-1])
        if not path.is_dir():
            return FetchOutcome(name, None, f"the fetch command printed {path}, not a folder")
        return FetchOutcome(name, path)
    said = [line.strip() for line in stderr.splitlines() if line.strip()]
    reason = said[-1] if said else "no reason given"
    return FetchOutcome(name, None, f"fetch exited with code {code}: {reason}")


async def run_subprocess(argv: Sequence[str], timeout_s: float) -> RunResult:
    """Run ``argv`` without a shell; (exit code, stdout, stderr), killed after ``timeout_s``."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        return 124, "", f"timed out after {timeout_s:.0f} s"
    assert process.returncode is not None
    return process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")


class AdapterFetcher:
    """Fetches adapters by name: concurrent first requests for one name share one fetch;
    a fetched folder is remembered, a failure is not (the next request tries again)."""

    def __init__(self, settings: FetchSettings, run: Runner = run_subprocess) -> None:
        self.settings = settings
        self._run = run
        self._locks: dict[str, asyncio.Lock] = {}
        self._fetched: dict[str, Path] = {}
        self.runs = 0

    async def fetch(self, name: str) -> FetchOutcome:
        """The adapter's folder in the cache, fetched now unless already; never raises."""
        if not is_adapter_name(name):
            return FetchOutcome(name, None, f"{name!r} is not a flywheel adapter name")
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            known = self._fetched.get(name)
            if known is not None and known.is_dir():
                return FetchOutcome(name, known)
            self.runs += 1
            try:
                result = await self._run(self.settings.argv(name), self.settings.timeout_s)
            # A failed fetch must never fail vLLM: its resolver caller does not catch.
            except Exception as exc:
                return FetchOutcome(name, None, f"the fetch command did not run: {exc}")
            outcome = outcome_of(name, result)
            if outcome.path is not None:
                self._fetched[name] = outcome.path
            return outcome
