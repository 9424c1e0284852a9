"""Request slots, the per-layer KV pool and its slot allocator."""

from __future__ import annotations

import math
import mmap

import torch


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.zeros``, but on CPU a page takes memory only once written: an anonymous mapping
    of zero-filled pages (``torch.zeros`` writes every page), so an idle server does not hold
    the whole of its pools."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    numel = math.prod(shape)
    # NOTE: the tensor keeps the mapping alive
    pages = mmap.mmap(-1, max(1, numel * dtype.itemsize))
    return torch.frombuffer(pages, dtype=dtype, count=numel).view(shape)


class ReqToTokenPool:
    """Table ``[max_requests, context_len]``: request slot x position -> KV slot."""

    def __init__(self, max_requests: int, context_len: int, device: torch.device) -> None:
        self.table = zeros((max_requests, context_len), torch.int64, device)
        self._free = list(range(max_requests - 1, -1, -1))
        self.size = max_requests

    def alloc(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, slot: int) -> None:
        self._free.append(slot)

    @property
    def available(self) -> int:
        return len(self._free)


class SlotAllocator:
    """Hands out KV slots ``1..size``; slot 0 is a scratch slot that padding may write to."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = torch.arange(1, size + 1, dtype=torch.int64)
        self._head = 0

    @property
    def available(self) -> int:
        return self._free.numel() - self._head

    def alloc(self, n: int) -> torch.Tensor | None:
        """Return ``n`` free slots, or None when fewer are free (nothing is taken then)."""
        if n > self.available:
            return None
        out = self._free[self._head : self._head + n]
        self._head += n
        return out

    def free(self, slots: torch.Tensor) -> None:
        """Give ``slots`` back; they are handed out first again."""
        if slots.numel() == 0:
            return
        # NOTE: reused before the never-used ones: on CPU the KV pool's pages take memory once
        # written, and handing freed slots out last walked every request through fresh pages
        # until the whole pool was resident (a low_memory server: +10 MB a round of 4 requests)
        self._free = torch.cat([slots.to(torch.int64).cpu(), self._free[self._head :]])
        self._head = 0

    def reset(self) -> None:
        self._free = torch.arange(1, self.size + 1, dtype=torch.int64)
        self._head = 0


class KVPool:
    """Per-layer K and V buffers ``[size + 1, num_kv_heads, head_dim]``."""

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (size + 1, num_kv_heads, head_dim)
        if device.type == "cpu":
            flat = zeros((2 * num_layers, *shape), dtype, device)  # NOTE: one mapping
            self.k, self.v = list(flat[:num_layers]), list(flat[num_layers:])
        else:
            self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
            self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.size = size
        self.dtype = dtype

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer][slots] = k.to(self.dtype)
        self.v[layer][slots] = v.to(self.dtype)

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8
