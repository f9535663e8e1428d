"""LoRA on vLLM's CPU backend, one matrix product per adapter instead of one per token.

vLLM's CPU LoRA ops (``vllm.lora.ops.torch_ops``) gather every token's adapter
weights (``weights[token_indices]``: a rank x hidden matrix copied per token, per
projection, per layer) and multiply them with an einsum. With a single LoRA request
in a batch the whole batch takes that path, so on a 2-core CPU a 5% canary made
a whole day's answers 2.3x slower than the base model's, and a line served by its
champion adapter 2.6x slower.

These ops compute the same thing grouped by adapter slot: for each slot the batch
uses, one matrix product of that slot's tokens with its weights. Same arguments, so
they replace vLLM's in place. Pure torch, no vLLM import: :func:`install` patches
the modules it is given.

One difference, on purpose: a token without an adapter (slot index ``-1``) gets no
adapter, as vLLM's GPU kernels skip it. vLLM's CPU ops index the weights with it and
so add the last slot's adapter: harmless while that slot is empty, but once
``--max-loras`` adapters are loaded (one, at vLLM's default) every base-model answer
on the server carries the last one's delta (vllm-project/vllm#48421, open). Skipping
those tokens also spares their products: a base-only batch computes none.
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


def _per_slot(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Each adapted token's ``inputs @ weights[slot].T``: the rows of the tokens with an
    adapter (``None`` for every row) and their products, without vLLM's per-token copy of
    the weights: one product when those tokens share a slot, else each slot's tokens times
    that slot's (out x in) matrix (or, for a few tokens, every slot at once)."""
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    slots, out_features, in_features = weights.shape
    adapted = indices >= 0
    count = int(adapted.sum())
    rows: torch.Tensor | None = None
    if count == 0:
        return indices.new_empty(0), inputs.new_empty((0, out_features))
    if count < indices.shape[0]:
        rows = adapted.nonzero().squeeze(1)
        inputs, indices = inputs[rows], indices[rows]
    weights = weights.to(inputs.dtype)
    first, last = (int(end) for end in torch.aminmax(indices))
    if first == last:
        return rows, inputs @ weights[first].t()
    if inputs.shape[0] <= STACKED_MAX_TOKENS:
        every = inputs @ weights.reshape(slots * out_features, in_features).t()
        picked = torch.arange(inputs.shape[0])
        return rows, every.view(-1, slots, out_features)[picked, indices]
    out = torch.empty((inputs.shape[0], out_features), dtype=inputs.dtype)
    for slot in torch.unique(indices).tolist():
        mine = (indices == slot).nonzero().squeeze(1)
        out[mine] = inputs[mine] @ weights[slot].t()
    return rows, out


def _put(
    output: torch.Tensor, rows: torch.Tensor | None, products: torch.Tensor, add: bool
) -> None:
    """``output (+)= products`` on the adapted rows; a row without an adapter gets a zero
    product (unchanged when adding, zero when not)."""
    if rows is None:
        if add:
            output += products
        else:
            output.copy_(products)
        return
    if not add:
        output.zero_()
    if rows.numel():
        output.index_add_(0, rows, products)


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """vLLM's ``bgmv_shrink``: ``output[:, :rank] = scaling * x @ A[slot].T`` per token (zero
    for a token without an adapter)."""
    rows, products = _per_slot(inputs.to(output_tensor.dtype), lora_b_weights, lora_indices_tensor)
    _put(output_tensor[:, : products.shape[1]], rows, scaling * products, add=False)


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand``: ``output (+)= x @ B[slot].T`` per token, over the columns both
    have (an adapter and the model may pad differently)."""
    rows, products = _per_slot(inputs.to(output_tensor.dtype), lora_b_weights, lora_indices_tensor)
    limit = output_tensor.shape[0]
    if products.shape[0] == 1 and output_tensor.shape[0] != 1 and rows is None:
        # vLLM's broadcast of a single product over every output row.
        limit = 1
    common = min(products.shape[1], output_tensor.shape[1])
    _put(output_tensor[:, :common], rows, products[:limit, :common], add=add_inputs)


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
    rows, products = _per_slot(inputs.to(output_tensor.dtype), lora_b_weights, lora_indices_tensor)
    target = output_tensor[:, slice_offset : slice_offset + slice_size]
    _put(target, rows, products, add=add_inputs)


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
