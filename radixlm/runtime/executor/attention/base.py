"""The attention-backend interface and its registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.mem_cache.memory_pool import KVPool

ATTENTION_BACKENDS: dict[str, type[AttentionBackend]] = {}


def register_attention_backend(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        ATTENTION_BACKENDS[name] = cls
        return cls

    return wrap


class AttentionBackend(ABC):
    """Attention over the paged KV pool.

    ``prepare`` runs once per forward and may store metadata on ``batch.attn_meta``;
    ``forward`` runs once per layer: it writes the new ``k``/``v`` into the pool at
    ``batch.out_cache_loc`` and returns each new token's attention over its request's slots
    (the cached prefix plus, causally, the new tokens).
    """

    def __init__(
        self,
        kv_pool: KVPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float | None = None,
        windows: list[int | None] | None = None,
        softcap: float | None = None,
    ) -> None:
        """``windows``: each layer's sliding window (None: full attention), a query at position
        ``p`` seeing the keys ``p - W < k <= p``; ``softcap``: scores become
        ``softcap * tanh(scores / softcap)`` before the softmax (Gemma 2)."""
        self.kv_pool = kv_pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.windows = list(windows or [None] * len(kv_pool.k))
        self.softcap = softcap

    supports_cuda_graph = False

    def prepare(self, batch: ForwardBatch) -> None:
        return None

    def graph_meta(self, batch_size: int, max_seq_len: int) -> Any:
        """Attention metadata for a captured decode graph of ``batch_size`` rows, in place of
        ``prepare``: fixed launch shapes and buffers, valid for any sequence length up to
        ``max_seq_len``. Only backends with ``supports_cuda_graph`` implement it."""
        raise NotImplementedError(f"{type(self).__name__} cannot run inside a CUDA graph")

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        """q ``[T, heads, dim]``, k/v ``[T, kv_heads, dim]`` -> ``[T, heads, dim]``."""


def create_attention_backend(name: str, **kwargs) -> AttentionBackend:
    # NOTE: importing the modules registers the backends.
    from radixlm.runtime.executor.attention import torch_backend  # noqa: F401

    if name == "triton":
        from radixlm.runtime.executor.attention import triton_backend  # noqa: F401
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"attention_backend must be one of {sorted(ATTENTION_BACKENDS)}, got {name!r}"
        )
    return ATTENTION_BACKENDS[name](**kwargs)
