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
        VLLM_VERSION,
        VllmEnvironment,
    )

    # No index at all: the resolver is built by the virtualenv's own setuptools.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    folder = tmp_path / "vllm-venv"
    venv.EnvBuilder(with_pip=True).create(folder)
    (folder / MARKER_FILE).write_text(VLLM_VERSION + "\n")
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


# --- `flywheel serve vllm`: what it registers at start and how it switches the resolver on --


def test_flywheel_and_the_plugin_name_the_same_variables() -> None:
    from flywheel_vllm_resolver import CPU_LORA_PLUGIN_NAME, CPU_SEEDED_PLUGIN_NAME, PLUGIN_NAME
    from flywheel_vllm_resolver import fetch as plugin

    from registry import vllm_server

    assert vllm_server.RESOLVER_PLUGIN == PLUGIN_NAME
    assert vllm_server.CPU_LORA_PLUGIN == CPU_LORA_PLUGIN_NAME
    assert vllm_server.CPU_SEEDED_PLUGIN == CPU_SEEDED_PLUGIN_NAME
    assert vllm_server.RESOLVER_FETCH_ENV == plugin.FETCH_ENV
    assert vllm_server.RESOLVER_CACHE_ENV == plugin.CACHE_ENV
    assert vllm_server.RESOLVER_SERVED_BASE_ENV == plugin.SERVED_BASE_ENV
    entry = (vllm_server.RESOLVER_SOURCE / "pyproject.toml").read_text()
    assert f'{PLUGIN_NAME} = "flywheel_vllm_resolver:register"' in entry
    assert f'{CPU_LORA_PLUGIN_NAME} = "flywheel_vllm_resolver:register_cpu_lora"' in entry
    assert f'{CPU_SEEDED_PLUGIN_NAME} = "flywheel_vllm_resolver:register_cpu_seeded"' in entry


def test_the_resolver_environment_is_what_the_plugin_reads(tmp_path: Path) -> None:
    from registry.vllm_server import resolver_environment

    env = resolver_environment(["/venv/bin/flywheel", "adapters", "fetch"], tmp_path, tmp_path)
    assert env["VLLM_PLUGINS"] == "flywheel_lora_resolver,flywheel_cpu_lora,flywheel_cpu_seeded"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    settings = FetchSettings.from_env(env)
    assert settings is not None
    assert settings.argv("legal-v1")[:4] == ["/venv/bin/flywheel", "adapters", "fetch", "legal-v1"]


def test_lora_modules_are_passed_in_a_form_vllm_parses(tmp_path: Path) -> None:
    from registry.vllm_server import VllmServerSettings, lora_module

    assert lora_module("legal-v1", "/cache/legal-v1") == "legal-v1=/cache/legal-v1"
    # vLLM reads an item with a comma as JSON.
    odd = lora_module("legal-v1", "/cache,x/legal-v1")
    assert json.loads(odd) == {"name": "legal-v1", "path": "/cache,x/legal-v1"}
    argv = VllmServerSettings(
        model=tmp_path, lora_modules=(("legal-v1", "/c/legal-v1"), ("medical-v2", "/c/m"))
    ).command()
    at = argv.index("--lora-modules")
    assert argv[at + 1 : at + 3] == ["legal-v1=/c/legal-v1", "medical-v2=/c/m"]
    assert "--lora-modules" not in VllmServerSettings(model=tmp_path).command()


def test_routed_adapters_are_those_of_the_lines_placed_on_the_replica() -> None:
    from cli.commands.vllm import routed_adapters
    from registry.routing import RoutingTable

    a, b = "http://10.0.0.1:8000", "http://10.0.0.2:8000/"
    tables = [
        RoutingTable(business_line="legal", champion="legal-v2", canary="legal-v3",
                     previous="legal-v1"),
        RoutingTable(business_line="medical", champion="medical-v4", replicas=(b,)),
        RoutingTable(business_line="general"),
        # A placement naming no replica the gateway knows strands nothing: every replica.
        RoutingTable(business_line="retail", champion="retail-v1", replicas=("http://old:1",)),
    ]  # fmt: skip
    upstreams = [a, b]
    assert routed_adapters(tables, a, upstreams) == [
        "legal-v2", "legal-v3", "legal-v1", "retail-v1",
    ]  # fmt: skip
    assert routed_adapters(tables, b, upstreams) == [
        "legal-v2", "legal-v3", "legal-v1", "medical-v4", "retail-v1",
    ]  # fmt: skip


def _adapter(folder: Path, rank: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    return folder


def test_a_routed_adapter_that_fails_to_fetch_is_left_out_with_a_warning(tmp_path: Path) -> None:
    from cli.commands.vllm import fetch_routed
    from flywheel.errors import FlywheelError

    folders = {
        "legal-v2": _adapter(tmp_path / "legal-v2", 8),
        "legal-v3": _adapter(tmp_path / "legal-v3", 64),
    }

    def fetch(name: str) -> Path:
        if name == "medical-v4":
            raise FlywheelError("medical-v4: the fetched files' digest sha256:aa is not sha256:bb")
        return folders[name]

    warnings: list[str] = []
    kept = fetch_routed(["legal-v2", "medical-v4", "legal-v3"], fetch, 16, warnings.append)
    assert kept == [("legal-v2", folders["legal-v2"])]
    assert len(warnings) == 2
    assert warnings[0].startswith("medical-v4 is left out: medical-v4: the fetched files' digest")
    assert "rank 64 is over this replica's --max-lora-rank 16" in warnings[1]


def test_serve_vllm_switches_the_resolver_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    home = tmp_path / "home"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.setenv("FLYWHEEL_BASE_MODEL", str(model))
    result = CliRunner().invoke(
        app, ["serve", "vllm", "--port", "8124", "--max-loras", "2", "--print-command"]
    )
    assert result.exit_code == 0, result.output
    line = result.stdout.replace("\n", "")
    assert "VLLM_PLUGINS=flywheel_lora_resolver,flywheel_cpu_lora" in line
    assert f"FLYWHEEL_ADAPTER_CACHE={home / 'adapter-cache'}" in line
    assert f"FLYWHEEL_ADAPTER_SERVED_BASE={model}" in line
    assert "adapters" in line.split("FLYWHEEL_ADAPTER_FETCH=", 1)[1].split(" FLYWHEEL_")[0]
    assert "--max-loras 2" in line


# --- the rollout's loads on a replica that runs the resolver ------------------------------


class ResolvingReplica:
    """The two members of the admin client a load on a resolver replica uses: what vLLM
    lists, and a chat request that makes its resolver fetch (or refuse) the adapter."""

    def __init__(self, fetchable: set[str]) -> None:
        self.base_url = "http://gpu-1:8000"
        self.fetchable = fetchable
        self.served: set[str] = set()
        self.asked: list[str] = []

    def served_adapter(self, name: str) -> object | None:
        return name if name in self.served else None

    def chat(self, model: str, prompt: str, *, max_tokens: int = 32) -> None:
        from registry.vllm_admin import VllmRequestError

        self.asked.append(model)
        if model not in self.fetchable:
            raise VllmRequestError(f"{model} does not exist", status_code=404)
        self.served.add(model)

    def ensure_loaded(self, name: str, path: Path | str) -> bool:
        raise AssertionError(f"a path on the operator's disk was sent to the replica: {path}")


def test_a_resolver_replica_fetches_into_its_own_cache_instead_of_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import UTC, datetime

    from feedback.store import FeedbackStore
    from flywheel.settings import load_settings
    from registry.replicas import ReplicaRecord, ReplicaRefusedError, ReplicaStore, load_checked

    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    store = FeedbackStore.open(load_settings())
    replicas = ReplicaStore(store.engine)
    replica = ResolvingReplica({"legal-v1"})
    replicas.record(
        ReplicaRecord(replica.base_url, "SmolLM2-135M-Instruct", "sha256:" + "ab" * 32, 2, 16,
                      True, datetime.now(UTC))
    )  # fmt: skip
    operator_copy = _adapter(tmp_path / "operator" / "legal-v1", 8)
    try:
        assert load_checked(replica, "legal-v1", operator_copy, replicas)  # type: ignore[arg-type]
        assert not load_checked(replica, "legal-v1", operator_copy, replicas)  # type: ignore[arg-type]
        assert replica.asked == ["legal-v1"]
        with pytest.raises(ReplicaRefusedError, match="did not fetch legal-v2"):
            load_checked(replica, "legal-v2", operator_copy, replicas)  # type: ignore[arg-type]
    finally:
        store.close()
