"""Seeded requests on vLLM's CPU backend: the generator vLLM rewinds by a CUDA-only offset."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

# The plugin is installed into vLLM's own virtualenv, not this one: imported from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vllm_plugin"))

from flywheel_vllm_resolver import cpu_seeded


class _Request:
    def __init__(self, generator: torch.Generator | None) -> None:
        self.generator = generator


class _InputBatch:
    """vLLM's InputBatch as far as generators go: add_request keys the request's own one."""

    def __init__(self) -> None:
        self.generators: dict[int, Any] = {}

    def add_request(self, request: _Request) -> int:
        index = len(self.generators)
        if request.generator is not None:
            self.generators[index] = request.generator
        return index


def test_a_plain_cpu_generator_cannot_be_rewound_as_vllm_does() -> None:
    """What killed the engine: vLLM's rewind of a discarded token's draws."""
    generator = torch.Generator(device="cpu").manual_seed(7)
    with pytest.raises(RuntimeError, match="does not use offset"):
        generator.set_offset(generator.get_offset() - 4)


def test_the_input_batch_keeps_rewindable_generators_that_draw_the_seeds_stream() -> None:
    cls = type("InputBatch", (_InputBatch,), {})
    patched = cpu_seeded.install(cls)
    assert patched.endswith("InputBatch.add_request")
    assert cpu_seeded.install(cls) == patched  # twice patches once
    batch = cls()
    seeded = torch.Generator(device="cpu").manual_seed(7)
    index = batch.add_request(_Request(seeded))
    assert batch.add_request(_Request(None)) == 1
    generator = batch.generators[index]
    assert isinstance(generator, cpu_seeded.RewindableCpuGenerator)
    assert isinstance(generator, torch.Generator)
    generator.set_offset(generator.get_offset() - 4)  # vLLM's rewind: the stream stays put
    expected = torch.rand(5, generator=torch.Generator(device="cpu").manual_seed(7))
    torch.testing.assert_close(torch.rand(5, generator=generator), expected)
    # Sampling ops vLLM runs with it take it as any generator.
    torch.empty(4).exponential_(generator=generator)
    assert torch.multinomial(torch.ones(3), 1, generator=generator).shape == (1,)


def test_only_cpu_generators_are_replaced() -> None:
    assert cpu_seeded.rewindable(None) is None
    already = cpu_seeded.RewindableCpuGenerator(device="cpu")
    assert cpu_seeded.rewindable(already) is already
    # A CUDA generator has its offset: left as it is (stood in for: no GPU in the unit tier).
    cuda = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    assert cpu_seeded.rewindable(cuda) is cuda  # type: ignore[arg-type]
