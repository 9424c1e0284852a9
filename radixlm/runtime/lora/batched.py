"""The low-rank update of a batch whose rows use different adapters, in two matmuls.

Every resident adapter's A matrices are stacked along the rank axis (slot-major), its B
matrices alike; ``mask`` keeps, for each row, only its own adapter's columns. So one batch of
any mix of adapters (and rows of the base model: all-zero mask) costs two GEMMs per projection,
with no per-request loop and no merged weights."""

from __future__ import annotations

import torch


def lora_delta(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``x [T, in]``, ``a [S*W, in]``, ``b [out, S*W]``, ``mask [T, S*W]`` -> ``[T, out]``."""
    return ((x @ a.T) * mask) @ b.T


def column_mask(
    row_slots: torch.Tensor, slots: int, width: int, dtype: torch.dtype
) -> torch.Tensor:
    """``[T, slots * width]``: 1 where a column belongs to the row's slot (-1: none)."""
    col = torch.arange(slots, device=row_slots.device).repeat_interleave(width)
    return (row_slots[:, None] == col[None, :]).to(dtype)


def ref_lora_delta(
    x: torch.Tensor, pairs: list[tuple[torch.Tensor, torch.Tensor] | None]
) -> torch.Tensor:
    """The torch twin, row by row: ``pairs[i]`` is row i's ``(A [r, in], B [out, r])`` or None."""
    out = []
    for row, pair in zip(x, pairs):
        if pair is None:
            out.append(None)
        else:
            a, b = pair
            out.append(b @ (a @ row))
    width = next((o.shape[0] for o in out if o is not None), 0)
    return torch.stack([o if o is not None else x.new_zeros(width) for o in out])
