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

What remained after that was per call, not per product: a decode step calls the ops
once per slice per LoRA layer (vLLM wraps every linear layer, the MLP's too, whatever
the adapters train), each call working out again which tokens have which adapter, and
the CPU multiplies a few rows by a rank-16 matrix in bfloat16 a hundred times slower
than in float32. So the CPU punica wrapper's ``add_shrink`` and ``add_expand`` are
replaced too (:func:`install_wrapper`): the step's tokens by slot are worked out once
for every layer, a layer whose used slots hold no weights (the MLP of an attention
adapter) computes nothing, and the products are float32, rounded to the layer's dtype
once. The results are vLLM's within that rounding.
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


class _Batch:
    """A batch's tokens by adapter slot: the rows with an adapter (``None`` when every row
    has one), each one's slot, and the distinct slots, ascending."""

    __slots__ = ("rows", "slots", "used")

    def __init__(self, rows: torch.Tensor | None, slots: torch.Tensor, used: tuple[int, ...]):
        self.rows, self.slots, self.used = rows, slots, used

    @classmethod
    def of(cls, indices: torch.Tensor) -> _Batch:
        """The batch of these per-token slot indices (``-1``: no adapter)."""
        adapted = indices >= 0
        if bool(adapted.all()):
            return cls(None, indices, tuple(torch.unique(indices).tolist()))
        rows = adapted.nonzero().squeeze(1)
        slots = indices[rows]
        return cls(rows, slots, tuple(torch.unique(slots).tolist()))

    def serving(self, live: list[bool]) -> _Batch:
        """The rows whose slot has weights here: a slot whose weights are all zero adds
        nothing (a layer the adapter does not train, an empty slot)."""
        used = tuple(slot for slot in self.used if live[slot])
        if used == self.used:
            return self
        if not used:
            return _Batch(self.slots.new_empty(0), self.slots.new_empty(0), ())
        keep = torch.tensor(live)[self.slots]
        rows = keep.nonzero().squeeze(1) if self.rows is None else self.rows[keep]
        return _Batch(rows, self.slots[keep], used)


def _grouped(
    inputs: torch.Tensor, weights: torch.Tensor, batch: _Batch
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Each adapted row's ``inputs @ weights[slot].T``, in float32: the rows (``None`` for
    every row) and their products, without vLLM's per-token copy of the weights: one product
    when the rows share a slot, else each slot's rows times that slot's (out x in) matrix (or,
    for a few rows, every slot at once). Float32 because the CPU multiplies a few rows by a
    rank-16 matrix in bfloat16 about a hundred times slower (400 us against 4)."""
    weights = _float32(weights)
    slots, out_features, in_features = weights.shape
    if not batch.used:
        return batch.rows, inputs.new_empty((0, out_features), dtype=torch.float32)
    rows, indices = batch.rows, batch.slots
    inputs = (inputs if rows is None else inputs[rows]).to(torch.float32)
    if len(batch.used) == 1:
        return rows, inputs @ weights[batch.used[0]].t()
    if inputs.shape[0] <= STACKED_MAX_TOKENS:
        every = inputs @ weights.reshape(slots * out_features, in_features).t()
        picked = torch.arange(inputs.shape[0])
        return rows, every.view(-1, slots, out_features)[picked, indices]
    out = torch.empty((inputs.shape[0], out_features), dtype=torch.float32)
    for slot in batch.used:
        mine = (indices == slot).nonzero().squeeze(1)
        out[mine] = inputs[mine] @ weights[slot].t()
    return rows, out


def _per_slot(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """:func:`_grouped` for per-token slot indices (``-1``: no adapter), skipping the slots
    whose weights are all zero."""
    return _grouped(inputs, weights, _Batch.of(indices).serving(_live(weights)))


def _put(
    output: torch.Tensor, rows: torch.Tensor | None, products: torch.Tensor, add: bool
) -> None:
    """``output (+)= products`` on the adapted rows, in the output's dtype; a row without an
    adapter gets a zero product (unchanged when adding, zero when not)."""
    products = products.to(output.dtype)
    if rows is None:
        if add:
            output += products
        else:
            output.copy_(products)
        return
    if not add:
        output.zero_()
    if rows.numel():
        # The rows are distinct: an accumulating put adds as index_add_ does, 3x faster here.
        output.index_put_((rows,), products, accumulate=True)


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """vLLM's ``bgmv_shrink``: ``output[:, :rank] = scaling * x @ A[slot].T`` per token (zero
    for a token without an adapter)."""
    rows, products = _per_slot(inputs, lora_b_weights, lora_indices_tensor)
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
    rows, products = _per_slot(inputs, lora_b_weights, lora_indices_tensor)
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
    rows, products = _per_slot(inputs, lora_b_weights, lora_indices_tensor)
    target = output_tensor[:, slice_offset : slice_offset + slice_size]
    _put(target, rows, products, add=add_inputs)


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's in-place write count, or ``None`` where it keeps none (an inference
    tensor): then nothing about it is cached."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def _cached(weights: torch.Tensor) -> tuple[list[bool], torch.Tensor]:
    """A layer's stacked adapter weights as (slots, out, in) float32, and which slots hold any
    non-zero weight; kept on the tensor until it is next written (vLLM writes a slot in place
    when it loads an adapter)."""
    version = _version(weights)
    cached = getattr(weights, "_flywheel_cached", None)
    if version is not None and cached is not None and cached[0] == version:
        return cached[1], cached[2]
    matrices = weights.squeeze(1) if weights.dim() == 4 else weights
    matrices = matrices.to(torch.float32)
    live: list[bool] = matrices.reshape(matrices.shape[0], -1).any(dim=1).tolist()
    if version is not None:
        weights._flywheel_cached = (version, live, matrices)  # type: ignore[attr-defined]
    return live, matrices


def _live(weights: torch.Tensor) -> list[bool]:
    """Which slots of the weights hold any non-zero weight (:func:`_cached`)."""
    return _cached(weights)[0]


def _float32(weights: torch.Tensor) -> torch.Tensor:
    """The weights as (slots, out, in) float32 (:func:`_cached`)."""
    return _cached(weights)[1]


def _step(wrapper: Any) -> _Batch:
    """The batch of the wrapper's current step, worked out once for every layer: vLLM writes
    the tokens' slots in place once a step."""
    indices = wrapper.token_lora_indices
    version = _version(indices)
    # The buffer too: a new one would start its write count again.
    key = (indices.data_ptr(), version, indices.shape[0])
    cached = getattr(wrapper, "_flywheel_step", None)
    if version is not None and cached is not None and cached[0] == key:
        return cached[1]
    batch = _Batch.of(indices)
    wrapper._flywheel_step = (key, batch)
    return batch


def add_shrink(
    self: Any,
    y: tuple[torch.Tensor, ...] | torch.Tensor,
    x: torch.Tensor,
    lora_a_stacked: tuple[torch.Tensor, ...],
    scale: float,
    **kwargs: Any,
) -> None:
    """``PunicaWrapperCPU.add_shrink``: ``y[i] = scale * x @ A_i[slot].T`` per token and slice,
    zero for a token without an adapter or whose slot has no weights in this layer."""
    x = x.view(-1, x.shape[-1])
    batch = _step(self)
    for index, weights in enumerate(lora_a_stacked):
        out = y[index]
        out = out.view(-1, out.shape[-1])
        served = batch.serving(_live(weights))
        if not served.used:
            out.zero_()
            continue
        rows, products = _grouped(x, weights, served)
        _put(out[:, : products.shape[1]], rows, scale * products, add=False)


def add_expand(
    self: Any,
    y: torch.Tensor,
    x: tuple[torch.Tensor, ...] | torch.Tensor,
    lora_b_stacked: tuple[torch.Tensor, ...],
    output_slices: tuple[int, ...],
    offset_start: int = 0,
    add_inputs: bool = True,
    **kwargs: Any,
) -> None:
    """``PunicaWrapperCPU.add_expand``: ``y[:, slice i] (+)= x[i] @ B_i[slot].T`` per token,
    the slices side by side from ``offset_start``; a layer whose slots used here have no
    weights computes nothing."""
    out = y.view(-1, y.shape[-1])
    batch = _step(self)
    offset = offset_start
    for index, (weights, size) in enumerate(zip(lora_b_stacked, output_slices, strict=True)):
        target = out[:, offset : offset + size]
        offset += size
        served = batch.serving(_live(weights))
        if not served.used:
            if not add_inputs:
                target.zero_()
            continue
        rows, products = _grouped(x[index], weights, served)
        _put(target, rows, products, add=add_inputs)


# The wrapper's methods replaced: each layer's slices in one call, the step's tokens by slot
# worked out once for every layer, layers whose adapters hold no weights skipped.
WRAPPER_METHODS = {"add_shrink": add_shrink, "add_expand": add_expand}


def install_wrapper(wrapper_class: type) -> list[str]:
    """Put :data:`WRAPPER_METHODS` in place of the CPU punica wrapper's; the names replaced."""
    replaced = []
    for name, method in WRAPPER_METHODS.items():
        if hasattr(wrapper_class, name):
            setattr(wrapper_class, name, method)
            replaced.append(f"{wrapper_class.__name__}.{name}")
    return replaced


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
