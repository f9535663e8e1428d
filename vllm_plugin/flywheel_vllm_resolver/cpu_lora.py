"""LoRA on vLLM's CPU backend, one matrix product per adapter instead of one per token.

vLLM's CPU LoRA ops (``vllm.lora.ops.torch_ops``) gather every token's adapter
weights (``weights[token_indices]``: a rank x hidden matrix copied per token, per
projection, per layer) and multiply them with an einsum. With a single LoRA request
in a batch the whole batch takes that path, so on a 2-core CPU a 5% canary made
a whole day's answers 2.3x slower than the base model's, and a line served by its
champion adapter 2.6x slower.

These ops compute the same thing grouped by adapter slot: for each slot the batch
uses, one matrix product of that slot's tokens with its weights. Same arguments,
same result (the slot index ``-1`` of a token without an adapter selects the last
slot, as vLLM's own indexing does), so they replace vLLM's in place. Pure torch,
no vLLM import: :func:`install` patches the modules it is given.
"""

from __future__ import annotations

from typing import Any

import torch

# The ops replaced, by name, in vLLM's torch ops module and where the CPU wrapper
# imported them.
OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")


# Up to this many tokens (a decode step's batch), several adapters are served by one product
# with every slot's weights side by side, then each token's block picked: fewer, larger
# operations than one per slot. Above it (a prefill's thousand tokens) per slot is cheaper.
STACKED_MAX_TOKENS = 64


def _per_slot(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``einsum("bi,boi->bo", inputs, weights[indices])`` without the per-token copy of the
    weights: one product when every token uses one slot, else each slot's tokens times that
    slot's (out x in) matrix (or, for a few tokens, every slot at once)."""
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    weights = weights.to(inputs.dtype)
    if inputs.shape[0] == 0:
        return inputs.new_empty((0, weights.shape[1]))
    first, last = int(indices.min()), int(indices.max())
    if first == last:
        return inputs @ weights[first].t()
    slots, out_features, in_features = weights.shape
    if inputs.shape[0] <= STACKED_MAX_TOKENS:
        every = inputs @ weights.reshape(slots * out_features, in_features).t()
        rows = torch.arange(inputs.shape[0])
        # A negative slot counts from the end, as vLLM's indexing of the weights does.
        return every.view(-1, slots, out_features)[rows, indices % slots]
    out = torch.empty((inputs.shape[0], out_features), dtype=inputs.dtype)
    for slot in torch.unique(indices).tolist():
        rows = (indices == slot).nonzero().squeeze(1)
        out[rows] = inputs[rows] @ weights[slot].t()
    return out


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """vLLM's ``bgmv_shrink``: ``output[:, :rank] = scaling * x @ A[slot].T`` per token."""
    outputs = _per_slot(inputs.to(output_tensor.dtype), lora_b_weights, lora_indices_tensor)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand``: ``output (+)= x @ B[slot].T`` per token, over the columns both
    have (an adapter and the model may pad differently)."""
    outputs = _per_slot(inputs.to(output_tensor.dtype), lora_b_weights, lora_indices_tensor)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand_slice``: ``bgmv_expand`` into ``output[:, offset:offset+size]``."""
    outputs = _per_slot(inputs.to(output_tensor.dtype), lora_b_weights, lora_indices_tensor)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def install(*modules: Any) -> list[str]:
    """Put these ops in place of vLLM's in each module that has them; the names replaced."""
    ours = {"bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand,
            "bgmv_expand_slice": bgmv_expand_slice}  # fmt: skip
    replaced = []
    for module in modules:
        for name in OPS:
            if hasattr(module, name):
                setattr(module, name, ours[name])
                replaced.append(f"{module.__name__}.{name}")
    return replaced
