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
