"""flywheel's CPU LoRA ops for vLLM: the same results as vLLM's per-token ops, whatever the
mix of adapters in a batch, except that a token without an adapter gets none (vLLM's CPU ops
give it the last slot's); installed in place of vLLM's by name."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

# The plugin is installed into vLLM's own virtualenv, not this one: imported from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vllm_plugin"))

from flywheel_vllm_resolver import cpu_lora


def _vllms(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """vLLM's own computation (vllm.lora.ops.torch_ops): each token's slot weights gathered,
    then one einsum; a token without an adapter (-1) gathers the last slot."""
    selected = weights[indices]
    if selected.dim() == 4:
        selected = selected.squeeze(1)
    return torch.einsum("bi, boi -> bo", inputs, selected)


def _reference(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """vLLM's computation with a token without an adapter given a zero one, as vLLM's GPU
    kernels skip it."""
    none = torch.zeros_like(weights[:1])
    return _vllms(
        inputs, torch.cat([weights, none]), torch.where(indices < 0, len(weights), indices)
    )


@pytest.mark.parametrize("tokens", [0, 1, 5, 16, 64, 65, 300])
@pytest.mark.parametrize("mix", ["one adapter", "none", "mixed", "every slot", "some slots"])
def test_the_ops_compute_what_vllms_do(tokens: int, mix: str) -> None:
    generator = torch.Generator().manual_seed(tokens)
    slots, rank, hidden = 4, 8, 48
    # -1 is a token without an adapter; "every slot" fills the last one too.
    low, high = {
        "one adapter": (1, 2), "none": (-1, 0), "mixed": (-1, 3), "every slot": (-1, 4),
        "some slots": (0, 3),
    }[mix]  # fmt: skip
    indices = torch.randint(low, high, (tokens,), generator=generator)
    x = torch.randn(tokens, hidden, generator=generator)
    a = torch.randn(slots, 1, rank, hidden, generator=generator)
    b = torch.randn(slots, 1, 3 * hidden, rank, generator=generator)
    h = torch.randn(tokens, rank, generator=generator)

    shrunk = torch.zeros(tokens, rank)
    cpu_lora.bgmv_shrink(x, a, shrunk, indices, 0.5)
    torch.testing.assert_close(shrunk, 0.5 * _reference(x, a, indices))

    start = torch.randn(tokens, 3 * hidden, generator=generator)
    added = start.clone()
    cpu_lora.bgmv_expand(h, b, added, indices, add_inputs=True)
    torch.testing.assert_close(added, start + _reference(h, b, indices))

    sliced = start.clone()
    b_slice = b[:, :, :hidden, :]
    cpu_lora.bgmv_expand_slice(h, b_slice, sliced, indices, hidden, hidden, add_inputs=False)
    expected = start.clone()
    expected[:, hidden : 2 * hidden] = _reference(h, b_slice, indices)
    torch.testing.assert_close(sliced, expected)


def test_a_token_without_an_adapter_gets_none_when_every_slot_is_loaded() -> None:
    """vLLM's CPU ops add the last slot's adapter to it (vllm-project/vllm#48421): with
    --max-loras adapters loaded, every base-model answer would carry that adapter."""
    slots, rank, hidden = 2, 4, 12
    indices = torch.tensor([-1, 0, -1, 1, -1])
    x = torch.randn(5, hidden)
    a = torch.randn(slots, 1, rank, hidden)
    shrunk = torch.full((5, rank), 7.0)
    cpu_lora.bgmv_shrink(x, a, shrunk, indices, 1.0)
    assert shrunk[indices < 0].abs().max() == 0
    assert not torch.allclose(_vllms(x, a, indices)[indices < 0], torch.zeros(3, rank))
    b = torch.randn(slots, 1, hidden, rank)
    start = torch.randn(5, hidden)
    added = start.clone()
    cpu_lora.bgmv_expand(torch.randn(5, rank), b, added, indices, add_inputs=True)
    torch.testing.assert_close(added[indices < 0], start[indices < 0], rtol=0, atol=0)
    assert not torch.allclose(added[indices >= 0], start[indices >= 0])


def test_a_base_only_batch_leaves_the_output_as_it_is() -> None:
    start = torch.randn(6, 12)
    added = start.clone()
    b = torch.randn(3, 1, 12, 4)
    cpu_lora.bgmv_expand(torch.randn(6, 4), b, added, torch.full((6,), -1), add_inputs=True)
    assert torch.equal(added, start)


def test_an_adapter_padded_wider_than_the_output_is_cut_to_it() -> None:
    indices = torch.zeros(3, dtype=torch.long)
    h = torch.randn(3, 4)
    b = torch.randn(2, 1, 10, 4)
    out = torch.zeros(3, 8)
    cpu_lora.bgmv_expand(h, b, out, indices, add_inputs=False)
    torch.testing.assert_close(out, _reference(h, b, indices)[:, :8])


def test_install_replaces_the_ops_by_name_where_they_are() -> None:
    ops = types.ModuleType("fake_vllm_ops")
    wrapper = types.ModuleType("fake_punica_cpu")
    for name in cpu_lora.OPS:
        setattr(ops, name, object())
    wrapper.bgmv_shrink = object()  # type: ignore[attr-defined]
    replaced = cpu_lora.install(ops, wrapper)
    assert replaced == [
        *(f"fake_vllm_ops.{n}" for n in cpu_lora.OPS),
        "fake_punica_cpu.bgmv_shrink",
    ]
    assert ops.bgmv_expand is cpu_lora.bgmv_expand  # type: ignore[attr-defined]
    assert wrapper.bgmv_shrink is cpu_lora.bgmv_shrink  # type: ignore[attr-defined]
    assert not hasattr(wrapper, "bgmv_expand")


class _Wrapper:
    """The part of vLLM's PunicaWrapperCPU the methods read: the tokens' slots, written in place
    into a buffer each step, and the step's token count."""

    def __init__(self, capacity: int = 512) -> None:
        self._token_lora_indices = torch.full((capacity,), -1)
        self.indices_len = [0, 0, 0, 0]

    def step(self, indices: torch.Tensor) -> None:
        self._token_lora_indices[: len(indices)].copy_(indices)
        self.indices_len[:] = [len(indices)] * 4

    @property
    def token_lora_indices(self) -> torch.Tensor:
        return self._token_lora_indices[: self.indices_len[0]]

    add_shrink = cpu_lora.add_shrink
    add_expand = cpu_lora.add_expand


def _linear(
    wrapper: _Wrapper,
    y: torch.Tensor,
    x: torch.Tensor,
    a: tuple[torch.Tensor, ...],
    b: tuple[torch.Tensor, ...],
    slices: tuple[int, ...],
) -> None:
    """vLLM's PunicaWrapperCPU.add_lora_linear: a float32 buffer per slice, shrink, expand."""
    buffer = tuple(torch.zeros(x.shape[0], b[0].shape[-1]) for _ in slices)
    wrapper.add_shrink(buffer, x, a, 0.5)
    wrapper.add_expand(y, buffer, b, slices, add_inputs=True)


def _linear_reference(
    y: torch.Tensor,
    x: torch.Tensor,
    a: tuple[torch.Tensor, ...],
    b: tuple[torch.Tensor, ...],
    slices: tuple[int, ...],
    indices: torch.Tensor,
) -> torch.Tensor:
    expected, offset = y.clone(), 0
    for a_slice, b_slice, size in zip(a, b, slices, strict=True):
        shrunk = 0.5 * _reference(x, a_slice, indices)
        expected[:, offset : offset + size] += _reference(shrunk, b_slice, indices)
        offset += size
    return expected


@pytest.mark.parametrize("tokens", [1, 7, 64, 200])
@pytest.mark.parametrize("mix", ["none", "one adapter", "mixed", "every slot"])
def test_the_wrappers_methods_compute_what_vllms_ops_do_slice_by_slice(
    tokens: int, mix: str
) -> None:
    """A q/k/v layer (three slices) and an MLP one the adapters do not train (zero weights),
    one slot holding weights only for k: each slice as vLLM's shrink and expand give it."""
    generator = torch.Generator().manual_seed(tokens)
    slots, rank, hidden, slices = 4, 8, 48, (48, 16, 16)
    low, high = {"none": (-1, 0), "one adapter": (2, 3), "mixed": (-1, 3), "every slot": (-1, 4)}[
        mix
    ]
    indices = torch.randint(low, high, (tokens,), generator=generator)
    x = torch.randn(tokens, hidden, generator=generator)
    a = tuple(torch.randn(slots, 1, rank, hidden, generator=generator) for _ in slices)
    b = tuple(torch.randn(slots, 1, size, rank, generator=generator) for size in slices)
    for weights in (a[0], a[2], b[0], b[2]):
        weights[1].zero_()
    wrapper = _Wrapper()
    wrapper.step(indices)
    y = torch.randn(tokens, sum(slices), generator=generator)
    added = y.clone()
    _linear(wrapper, added, x, a, b, slices)
    torch.testing.assert_close(added, _linear_reference(y, x, a, b, slices, indices))

    untrained = tuple(torch.zeros(slots, 1, rank, hidden) for _ in range(2))
    untrained_b = tuple(torch.zeros(slots, 1, hidden, rank) for _ in range(2))
    before = torch.randn(tokens, 96, generator=generator)
    mlp = before.clone()
    _linear(wrapper, mlp, x, untrained, untrained_b, (48, 48))
    assert torch.equal(mlp, before)
    buffer = torch.full((1, tokens, rank), 3.0)
    wrapper.add_shrink(buffer, x, untrained[:1], 1.0)
    assert not buffer.any()


def test_a_slot_written_in_place_and_a_new_step_are_seen_by_the_next_call() -> None:
    """vLLM loads an adapter into a slot and writes each step's token slots in place, into the
    same tensors: what the methods keep between calls must follow those writes."""
    slots, rank, hidden = 2, 4, 12
    a = (torch.zeros(slots, 1, rank, hidden),)
    b = (torch.zeros(slots, 1, hidden, rank),)
    x = torch.randn(3, hidden)
    wrapper = _Wrapper()
    wrapper.step(torch.tensor([0, -1, 0]))
    y = torch.zeros(3, hidden)
    _linear(wrapper, y, x, a, b, (hidden,))
    assert not y.any()

    a[0][0].copy_(torch.randn(1, rank, hidden))
    b[0][0].copy_(torch.randn(1, hidden, rank))
    _linear(wrapper, y, x, a, b, (hidden,))
    torch.testing.assert_close(
        y, _linear_reference(torch.zeros(3, hidden), x, a, b, (hidden,), torch.tensor([0, -1, 0]))
    )

    wrapper.step(torch.tensor([-1, 0, -1]))
    y = torch.zeros(3, hidden)
    _linear(wrapper, y, x, a, b, (hidden,))
    assert not y[[0, 2]].any()
    assert y[1].any()


def test_bfloat16_layers_get_the_products_rounded_once() -> None:
    """The products are computed in float32 and rounded to the layer's bfloat16 once: as close
    to the exact result as bfloat16 allows."""
    generator = torch.Generator().manual_seed(3)
    slots, rank, hidden = 2, 16, 64
    indices = torch.tensor([0, -1, 1, 0])
    x = torch.randn(4, hidden, generator=generator).to(torch.bfloat16)
    a = (torch.randn(slots, 1, rank, hidden, generator=generator).to(torch.bfloat16),)
    b = (torch.randn(slots, 1, hidden, rank, generator=generator).to(torch.bfloat16),)
    wrapper = _Wrapper()
    wrapper.step(indices)
    y = torch.zeros(4, hidden, dtype=torch.bfloat16)
    _linear(wrapper, y, x, a, b, (hidden,))
    exact = _linear_reference(torch.zeros(4, hidden, dtype=torch.float64), x.double(),
                              (a[0].double(),), (b[0].double(),), (hidden,), indices)  # fmt: skip
    assert y.dtype == torch.bfloat16
    # One rounding of each product to bfloat16 (8 bits), plus the float32 buffer's.
    torch.testing.assert_close(y.double(), exact, rtol=2**-7, atol=2**-7 * float(exact.abs().max()))


def test_install_wrapper_replaces_the_methods_by_name() -> None:
    class FakeWrapper:
        def add_shrink(self) -> None: ...

        def add_expand(self) -> None: ...

    assert cpu_lora.install_wrapper(FakeWrapper) == [
        "FakeWrapper.add_shrink",
        "FakeWrapper.add_expand",
    ]
    assert FakeWrapper.add_shrink is cpu_lora.add_shrink  # type: ignore[comparison-overlap]


def test_the_setting_switches_flywheels_cpu_ops_off_and_keeps_the_resolver(tmp_path: Path) -> None:
    from registry.vllm_server import VllmServerSettings, resolver_environment

    on = VllmServerSettings(model=tmp_path)
    off = VllmServerSettings(model=tmp_path, cpu_lora_ops=False)
    resolver = resolver_environment(["flywheel", "adapters", "fetch"], tmp_path, tmp_path)
    assert on.environment(resolver)["VLLM_PLUGINS"] == (
        "flywheel_lora_resolver,flywheel_cpu_lora,flywheel_cpu_seeded"
    )
    assert off.environment(resolver)["VLLM_PLUGINS"] == "flywheel_lora_resolver,flywheel_cpu_seeded"
    # Without a list vLLM would load every plugin installed: off names the resolver alone.
    assert "VLLM_PLUGINS" not in on.environment({"PATH": "/bin"})
    assert off.environment({"PATH": "/bin"})["VLLM_PLUGINS"] == (
        "flywheel_lora_resolver,flywheel_cpu_seeded"
    )
