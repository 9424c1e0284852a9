"""Bf16 weights in oneDNN's blocked layout, for the compute-bound (many-row) matmuls on CPU.

``F.linear`` on a plain bf16 weight reorders it into oneDNN's layout at every call; a weight
reordered once (:func:`onednn_weight`) skips that (see ``quant`` for the layers' numbers and
``quant_head`` for the LM head's). In inference mode the result is bitwise ``F.linear``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def onednn_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` (bf16 ``[N, K]``) reordered once into oneDNN's blocked layout for
    ``mkldnn._linear_pointwise`` (what inductor's CPU freezing uses; any row count; in
    inference mode bitwise ``F.linear``'s result); None where this torch has no oneDNN."""
    if not onednn_bf16():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 32)
        probe = weight.new_ones(1, weight.shape[1])
        if not torch.equal(onednn_linear(probe, packed, None), F.linear(probe, weight)):
            return None
    except (RuntimeError, AttributeError):  # NOTE: an op this build lacks
        return None
    return packed


def onednn_bf16() -> bool:
    """Whether oneDNN's bf16 matmuls run on this CPU (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; an
    AVX2-only CPU has oneDNN but not its bf16 reorder)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    flat = x.reshape(-1, x.shape[-1])
    if torch.compiler.is_compiling():
        out = torch.ops.radixlm.onednn_linear(flat, weight, bias)
    else:
        out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])


# NOTE: ``mkldnn._linear_pointwise`` as an opaque op for compiled steps: inductor lowers the
# op itself only for weights it packed (freezing makes them graph constants), not for these,
# which are graph inputs. Defined with ``torch.library.Library`` rather than ``custom_op``:
# 16 us a call against 36 (120 calls a step of SmolLM2).
_LIB = torch.library.Library("radixlm", "DEF")
_LIB.define("onednn_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
_LIB.impl("onednn_linear", lambda x, weight, bias: torch.ops.mkldnn._linear_pointwise(
    x, weight, bias, "none", [], ""), "CompositeExplicitAutograd")  # fmt: skip


@torch.library.register_fake("radixlm::onednn_linear")
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


class OneDnnWeight:
    """For a module that holds a bf16 weight for its many-row steps beside a quantised copy:
    the weight in oneDNN's layout (``dense``), or the plain one where oneDNN is absent
    (``weight``), or neither when the quantised copy serves every step."""

    dense: torch.Tensor | None
    weight: torch.Tensor | None

    def hold_bf16(self, weight: torch.Tensor, needed: bool) -> None:
        # NOTE: the oneDNN copy replaces the plain weight (an opaque tensor, kept out of the
        # module's parameters and buffers)
        self.dense = onednn_weight(weight.detach()) if needed else None
        self.weight = weight if self.dense is None and needed else None

    @property
    def dense_bytes(self) -> int:
        return 0 if self.dense is None else self.dense.numel() * self.dense.element_size()

    def bf16_linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.dense is None:
            return F.linear(x, self.weight, bias)
        return onednn_linear(x.contiguous(), self.dense, bias)
