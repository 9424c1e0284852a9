"""Weight-only int4 for the few-row matmuls of CPU decode steps.

A decode step of one or a few requests multiplies a handful of rows by every weight matrix: its
time is the time to read the weights. :class:`Int4DecodeLinear` keeps an int4 copy of a layer's
weight (groups of 32 along the input dimension, a scale and an offset per group: the layout of
GGUF's Q4_1) and uses it for steps of at most ``MAX_INT4_ROWS`` tokens, a quarter of the bytes of
bf16. Larger steps (prefill, big decode batches), which are compute-bound and for which torch's
int4 kernel is slower than bf16 GEMM, use the bf16 weight, kept in oneDNN's blocked layout
(``onednn.onednn_weight``): ``F.linear`` reorders a plain weight into it at every call, which cost
a batch of 32 decode steps a third of its matmul time (30 layers' projections, weights out of
cache: 77 ms against 51 ms at 32 rows, 63 against 35 at 16, 5-15% at prefill sizes), for the
same bits in inference mode (where the runner runs).

Each group takes the better of two grids: min..max in 15 steps (Q4_1: its minimum and maximum
are codes 0 and 15) or a symmetric one whose code 0 is the largest-magnitude value (Q4_0:
``d * (q - 8)``). For those GGUF formats the copy re-derives the checkpoint's own codes from the
dequantised weights. The kernel takes each group's scale and offset in bf16; that rounding costs
about what rounding every weight to bf16 does (SmolLM2 layer 3: relative output error 1.9e-3
against 1.35e-3).

The same transform gives the LM head an int8 copy (see :mod:`quant_head`): int4 costs the head's
logits too much (greedy agreement with float32 87.5% against int8's 96.9%).

With ``ServerArgs.low_memory`` each weight is held once: the int4 copy serves every step (about
2.5x slower than bf16 past a few dozen rows) and the head's int8 copy every logit row, made as
the checkpoint loads (:func:`weights_once_as_loaded`) so that the bf16 weights never all exist.
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.runtime.models.onednn import OneDnnWeight
from radixlm.runtime.models.quant_head import (
    QUANTIZE_WEIGHTS,
    apply_int8_head,
    int8_as_loaded,
    int8_embedding,
)

GROUP = 32
MAX_INT4_ROWS = 8
LINEAR_NAMES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def int4_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def int4_fits(weight: torch.Tensor) -> bool:
    """The kernel's layout: outputs a multiple of 16, inputs a multiple of the group."""
    return weight.dim() == 2 and weight.shape[0] % 16 == 0 and weight.shape[1] % GROUP == 0


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [N, K]`` -> (packed codes for ``_weight_int4pack_mm_for_cpu``, scales and
    offsets ``[K / GROUP, N, 2]`` in the weight's dtype) with ``w = (q - 8) * scale + offset``."""
    if not int4_fits(weight):
        raise ValueError(f"int4 needs [16n, {GROUP}k] weights, got {tuple(weight.shape)}")
    n, k = weight.shape
    codes = torch.empty(n, k, dtype=torch.int32, device=weight.device)
    scale_offset = torch.empty(k // GROUP, n, 2, dtype=weight.dtype, device=weight.device)
    step = max(1, QUANTIZE_WEIGHTS // k)
    for start in range(0, n, step):
        rows = slice(start, start + step)
        row_codes, scale, offset = _quantize_rows(weight[rows])
        codes[rows] = row_codes.reshape(-1, k)
        scale_offset[:, rows] = torch.stack([scale.t(), offset.t()], dim=-1)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1), scale_offset


def _quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes ``[N, K / GROUP, GROUP]`` (int32), scales and offsets ``[N, K / GROUP]``: per
    group, the better of an asymmetric and a symmetric fit."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    asym = _fit(groups, ((high - low) / 15).clamp(min=1e-10), low + 8 * ((high - low) / 15))
    extreme = groups.gather(-1, groups.abs().argmax(-1, keepdim=True)).squeeze(-1)
    sym_scale = torch.where(extreme == 0, 1e-10, -extreme / 8)
    sym = _fit(groups, sym_scale, torch.zeros_like(low))
    better = (sym[0] < asym[0])[..., None]
    codes = torch.where(better, sym[1], asym[1]).to(torch.int32)
    scale = torch.where(better[..., 0], sym_scale, asym[2])
    offset = torch.where(better[..., 0], 0.0, asym[3])
    return codes, scale, offset


def _fit(groups: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> tuple:
    """Codes of ``groups`` on the grid ``(q - 8) * scale + offset``, and each group's error."""
    codes = ((groups - offset[..., None]) / scale[..., None] + 8).round().clamp(0, 15)
    error = ((codes - 8) * scale[..., None] + offset[..., None] - groups).square().sum(-1)
    return error, codes, scale, offset


class Int4DecodeLinear(nn.Module, OneDnnWeight):
    """An ``nn.Linear`` with an int4 copy of its weight for steps of few rows, and its bf16
    weight in oneDNN's layout for the others (see module). ``int4_only``: the int4 copy alone,
    for every step (``ServerArgs.low_memory``)."""

    def __init__(self, linear: nn.Linear, int4_only: bool = False) -> None:
        super().__init__()
        self.bias, self.int4_only = linear.bias, int4_only
        packed, scale_offset = quantize_int4(linear.weight.detach())
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("scale_offset", scale_offset, persistent=False)
        self.hold_bf16(linear.weight, needed=not int4_only)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: the flag first: a graph exported for every row count gets no guard on rows
        int4 = self.int4_only or x.shape[0] <= MAX_INT4_ROWS
        if x.dim() == 2 and int4 and x.dtype == self.scale_offset.dtype:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.contiguous(), self.packed, GROUP, self.scale_offset
            )
            return out if self.bias is None else out + self.bias
        return self.bf16_linear(x, self.bias)


def apply_int4_decode(model: nn.Module, weights_once: bool = False) -> int:
    """Give every decoder-layer projection an int4 copy and the LM head an int8 copy for decode;
    returns how many projections have an int4 copy (a shape the kernel cannot take keeps only
    its bf16 weight). ``weights_once``: the copies replace the bf16 weights, and the embedding
    becomes int8 too."""
    apply_int8_head(model, weights_once)
    if weights_once:
        int8_embedding(model)
    for module in list(model.modules()):
        for name in LINEAR_NAMES:
            child = getattr(module, name, None)
            if type(child) is nn.Linear and int4_fits(child.weight):
                setattr(module, name, Int4DecodeLinear(child, int4_only=weights_once))
    return sum(isinstance(m, Int4DecodeLinear) for m in model.modules())


def weights_once_as_loaded(model: nn.Module, name: str) -> None:
    """The loader's hook for weights held once (``load_weights``' ``on_loaded``): a projection
    becomes its int4 copy alone as soon as its weight is filled (its bias, loaded later, is the
    same parameter), the head and embedding their int8 copy, so the model's bf16 weights never
    all exist at once."""
    int8_as_loaded(model, name)
    module_name, _, leaf = name.rpartition(".")
    parent_name, _, child = module_name.rpartition(".")
    if leaf != "weight" or child not in LINEAR_NAMES:
        return
    parent = model.get_submodule(parent_name)
    linear = getattr(parent, child)
    if type(linear) is nn.Linear and int4_fits(linear.weight):
        setattr(parent, child, Int4DecodeLinear(linear, int4_only=True))
