"""What this machine can do, and the choices that depend on it: the precision a model trains
and is scored in, gradient checkpointing, 4-bit quantization, vLLM's CPU dtype and threads.

The device is found once (:func:`detect_accelerator`, the one place that asks torch); every
decision below is a pure function of an :class:`Accelerator` value or the CPU's flags.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from flywheel.errors import UsageError

CPUINFO = Path("/proc/cpuinfo")
X86_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686"})


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (empty where it does not)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_has_bf16(flags: Collection[str] | None = None) -> bool:
    """Whether this CPU runs bfloat16 matmuls natively (AVX512-BF16 or AMX).

    There, mixed precision trains several times faster than float32; elsewhere
    bfloat16 is emulated and slower, so training stays in float32.
    """
    found = cpu_flags() if flags is None else flags
    return "avx512_bf16" in found or "amx_bf16" in found


def cpu_serving_dtype(flags: Collection[str] | None = None, machine: str | None = None) -> str:
    """The ``--dtype`` vLLM's CPU backend should serve with here: ``auto`` (vLLM's own
    choice, bfloat16) where the CPU does bfloat16 natively (AVX512-BF16 or AMX),
    ``float32`` on any other x86 CPU.

    Elsewhere vLLM emulates bfloat16: on a 2-core AMD EPYC with AVX2 the same 64 answers
    came out at 11.8 tokens/s in bfloat16 against 35.0 in float32 (2026-12-03), and on a
    2-core Xeon with AVX-512 but not its bfloat16 extension float32 answered 1.5x faster
    (2026-12-06). Other architectures, and a CPU whose flags cannot be read, keep vLLM's
    choice.
    """
    arch = (machine if machine is not None else platform.machine()).lower()
    if arch not in X86_MACHINES:
        return "auto"
    found = cpu_flags() if flags is None else flags
    if not found or cpu_has_bf16(found):
        return "auto"
    return "float32"


# Below this many CPUs, vLLM's reserved scheduler core costs more than sharing it.
SMALL_MACHINE_CPUS = 4


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return frozenset(affinity(0))
    return frozenset(range(os.cpu_count() or 1))


def cpu_threads_bind(cpus: Collection[int]) -> str | None:
    """``VLLM_CPU_OMP_THREADS_BIND`` for a vLLM CPU server allowed on ``cpus``: every one
    of them on a machine of fewer than :data:`SMALL_MACHINE_CPUS`, else None (vLLM's own
    binding).

    vLLM keeps a core for its scheduler process, which waits on the model by spinning; on
    2 cores that leaves the model one, and binding its threads to both answered 1.2-1.3x
    faster at the same dtype, the scheduler sharing a core with it (2026-12-06). On larger
    machines the reserved core is a small share and is left as vLLM sets it.
    """
    if not cpus or len(cpus) >= SMALL_MACHINE_CPUS:
        return None
    return ",".join(str(cpu) for cpu in sorted(cpus))


# transformers refuses 4-bit loading with an older bitsandbytes (its BITSANDBYTES_MIN_VERSION).
BITSANDBYTES_MIN_VERSION = (0, 46, 1)
Precision = Literal["auto", "bf16", "fp32"]
Quantization = Literal["none", "4bit"]
GradientCheckpointing = bool | Literal["auto"]
WeightsDtype = Literal["float32", "bfloat16", "float16"]
MixedPrecision = Literal["none", "bf16", "fp16"]


@dataclass(frozen=True, slots=True)
class Accelerator:
    """The device a model trains or is scored on and what it can do, found once by
    :func:`detect_accelerator`; the decisions below take it as a plain value, so a test
    states a GPU by its fields instead of patching torch."""

    device: str = "cpu"
    bf16: bool = False
    bitsandbytes: bool = False
    name: str = "cpu"

    @property
    def is_cuda(self) -> bool:
        """Whether the device is an NVIDIA GPU (``cuda`` or ``cuda:N``)."""
        return self.device.split(":", 1)[0] == "cuda"


@dataclass(frozen=True, slots=True)
class NumberFormat:
    """How a model's numbers are held on a device: the dtype its weights load in and the
    mixed precision its trainer runs under (``bf16`` / ``fp16``: the trainer's flags)."""

    weights: WeightsDtype
    mixed: MixedPrecision

    @property
    def autocast_bf16(self) -> bool:
        """Float32 weights computed under bfloat16 autocast (a CPU with native bfloat16): the
        offline scorer's ``mixed_precision``; weights already in 16 bits need no autocast."""
        return self.weights == "float32" and self.mixed == "bf16"


def number_format(precision: Precision, accelerator: Accelerator) -> NumberFormat:
    """The weights' dtype and the mixed precision for a recipe's ``precision`` on a device;
    training and offline evaluation both follow it.

    On CUDA, ``auto`` is bfloat16 weights and bfloat16 mixed precision where the GPU has
    bfloat16, else float16 weights under float16 mixed precision (the LoRA weights stay float32,
    as peft keeps them); ``bf16`` forces bfloat16. On the CPU the weights stay float32 and
    bfloat16 is autocast only, where the CPU has it natively (``auto``) or forced (``bf16``).
    ``fp32`` is float32 everywhere.
    """
    if precision == "fp32":
        return NumberFormat("float32", "none")
    wants_bf16 = precision == "bf16" or accelerator.bf16
    if accelerator.is_cuda:
        return NumberFormat("bfloat16", "bf16") if wants_bf16 else NumberFormat("float16", "fp16")
    return NumberFormat("float32", "bf16" if wants_bf16 else "none")


def uses_gradient_checkpointing(setting: GradientCheckpointing, accelerator: Accelerator) -> bool:
    """Whether a training recomputes activations in the backward pass instead of keeping them.

    ``auto`` is on: on CUDA it is what lets a larger model or batch fit in the GPU's memory,
    and on the CPU it is what trl has always done here (its trainers' default), so a CPU
    training is unchanged. ``True`` / ``False`` force it.
    """
    if setting == "auto":
        return True
    return bool(setting)


def quantization_refusal(quantization: Quantization, accelerator: Accelerator) -> str | None:
    """Why a recipe's ``quantization`` cannot train on this device, or ``None`` when it can.

    ``4bit`` (QLoRA: the base model's weights in 4-bit NF4, the adapter trained over them) needs
    an NVIDIA GPU and bitsandbytes (the ``gpu`` extra).
    """
    if quantization == "none":
        return None
    missing = []
    if not accelerator.is_cuda:
        missing.append(f"a CUDA GPU (training here runs on {accelerator.device})")
    if not accelerator.bitsandbytes:
        least = ".".join(map(str, BITSANDBYTES_MIN_VERSION))
        missing.append(f"bitsandbytes >= {least} (pip install 'flywheel[gpu]')")
    if not missing:
        return None
    needs = " and ".join(missing)
    return (
        f"quantization: {quantization} (QLoRA) needs {needs}; set quantization: none to train here"
    )


def detect_accelerator(device: str | None = None) -> Accelerator:
    """The device to train and score on: ``device`` when given, else the first CUDA GPU when
    torch sees one, else the CPU; what it can do is read from torch and the CPU's flags."""
    import torch

    chosen = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if chosen.split(":", 1)[0] != "cuda":
        return Accelerator(device=chosen, bf16=cpu_has_bf16())
    if not torch.cuda.is_available():
        raise UsageError(f"device {chosen!r} asked for, but torch sees no CUDA GPU here")
    index = torch.device(chosen).index or 0
    return Accelerator(
        device=chosen,
        bf16=bool(torch.cuda.is_bf16_supported()),
        bitsandbytes=bitsandbytes_installed(),
        name=torch.cuda.get_device_name(index),
    )


def bitsandbytes_installed() -> bool:
    """Whether a bitsandbytes that transformers accepts for 4-bit loading is installed (read
    from its metadata; not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return bitsandbytes_usable(version("bitsandbytes"))
    except PackageNotFoundError:
        return False


def bitsandbytes_usable(version: str | None) -> bool:
    """Whether bitsandbytes at ``version`` (``None``: not installed) loads models in 4 bits."""
    if version is None:
        return False
    numbers = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
    return numbers >= BITSANDBYTES_MIN_VERSION
