"""Request slots, the per-layer KV pool and its slot allocator."""

from __future__ import annotations

import mmap

import torch


class ReqToTokenPool:
    """Table ``[max_requests, context_len]``: request slot x position -> KV slot."""

    def __init__(self, max_requests: int, context_len: int, device: torch.device) -> None:
        self.table = torch.zeros(max_requests, context_len, dtype=torch.int64, device=device)
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
        if slots.numel() == 0:
            return
        self._free = torch.cat([self._free[self._head :], slots.to(torch.int64).cpu()])
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
        self._map: mmap.mmap | None = None
        if device.type == "cpu":
            # NOTE: one anonymous mapping: zero-filled pages that only take memory once written,
            # so an idle server does not hold its whole pool (torch.zeros writes every page)
            per = (size + 1) * num_kv_heads * head_dim
            self._map = mmap.mmap(-1, 2 * num_layers * per * torch.finfo(dtype).bits // 8)
            flat = torch.frombuffer(self._map, dtype=dtype).view(2 * num_layers, *shape)
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
