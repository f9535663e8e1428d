"""Seeded sampling on vLLM's CPU backend that cannot kill the engine.

A request with a ``seed`` (the OpenAI API's field, which evaluation harnesses set) gets its
own generator. When vLLM throws away the token sampled for a prompt it is still prefilling in
chunks (many requests in flight, or a long prompt), it rewinds that generator by its offset,
``gen.set_offset(gen.get_offset() - 4)``: a CUDA (Philox) generator's. A CPU generator (a
Mersenne Twister) has no offset and raises, the engine core dies and every request in flight
answers 500 (vLLM 0.32; met at 64 requests in flight). :func:`install` makes each CPU generator
vLLM keys into its input batch a :class:`RewindableCpuGenerator`, whose rewind keeps the stream
where it is: the engine lives, and a seeded answer is still drawn from its own seed's stream,
though it may differ by how its prompt was prefilled (CUDA's rewind keeps it exact).

No vLLM import: :func:`install` patches the class it is given.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


class RewindableCpuGenerator(torch.Generator):
    """A CPU generator with the offset calls vLLM makes on a CUDA one: no position to move,
    so a rewind keeps the stream where it is."""

    def get_offset(self) -> int:  # type: ignore[override]
        """Always 0: a Mersenne Twister has no offset."""
        return 0

    def set_offset(self, offset: int) -> RewindableCpuGenerator:  # type: ignore[override]
        """Nothing to move (vLLM's rewind of a discarded token's draws)."""
        return self


def rewindable(generator: torch.Generator | None) -> torch.Generator | None:
    """``generator`` as a :class:`RewindableCpuGenerator` in the same state when it is a CPU
    generator; any other (None, a CUDA one, one already rewindable) as it is."""
    if generator is None or generator.device.type != "cpu":
        return generator
    if isinstance(generator, RewindableCpuGenerator):
        return generator
    replacement = RewindableCpuGenerator(device="cpu")
    replacement.set_state(generator.get_state())
    return replacement


def install(input_batch: type[Any]) -> str:
    """Make ``input_batch.add_request`` (vLLM's ``InputBatch``) keep rewindable generators; the
    name of what was patched. Installing twice patches once."""
    original = input_batch.add_request
    if getattr(original, "flywheel_rewindable", False):
        return f"{input_batch.__module__}.{input_batch.__qualname__}.add_request"

    @functools.wraps(original)
    def add_request(self: Any, request: Any) -> Any:
        request.generator = rewindable(request.generator)
        return original(self, request)

    add_request.flywheel_rewindable = True  # type: ignore[attr-defined]
    input_batch.add_request = add_request
    return f"{input_batch.__module__}.{input_batch.__qualname__}.add_request"
