"""Triton attention backend: split-KV decode and one-pass extend kernels over the paged pool.

A batch whose requests all extend by one token runs the decode kernel; any other batch (prefill,
chunked prefill, mixed prefill + decode) runs the extend kernel, decode rows being extends of 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.kernels.decode_attention import (
    alloc_decode_scratch,
    choose_num_kv_splits,
    decode_attention,
)
from radixlm.kernels.extend_attention import extend_attention, extend_starts_of
from radixlm.runtime.executor.attention.base import AttentionBackend, register_attention_backend
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.mem_cache.memory_pool import KVPool


@dataclass
class TritonAttnMeta:
    """What the kernels need for one forward, shared by every layer."""

    is_decode: bool
    num_kv_splits: int = 1
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None  # decode stage-1 outputs
    extend_starts: torch.Tensor | None = None  # [B] first token row of each request
    max_extend: int = 0


@register_attention_backend("triton")
class TritonAttentionBackend(AttentionBackend):
    """Attention with the Triton kernels of :mod:`radixlm.kernels` (CUDA, or the interpreter)."""

    supports_cuda_graph = True

    def __init__(self, kv_pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int,
                 **kw) -> None:  # fmt: skip
        super().__init__(kv_pool, num_heads, num_kv_heads, head_dim, **kw)
        if any(self.windows) or self.softcap:
            raise ValueError(
                "attention_backend='triton' has no sliding-window or soft-capped attention "
                "yet; this model needs them: use attention_backend='torch'"
            )
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        device = kv_pool.k[0].device
        self.num_sms = (
            torch.cuda.get_device_properties(device).multi_processor_count
            if device.type == "cuda"
            else 8
        )

    def prepare(self, batch: ForwardBatch) -> None:
        if batch.is_decode:
            batch.attn_meta = self._prepare_decode(batch)
        else:
            batch.attn_meta = TritonAttnMeta(
                is_decode=False,
                extend_starts=extend_starts_of(batch.extend_lens),
                max_extend=max(batch.extend_lens_list, default=0),
            )

    def _prepare_decode(self, batch: ForwardBatch) -> TritonAttnMeta:
        return self._decode_meta(batch.batch_size, max(batch.seq_lens_list, default=1))

    def graph_meta(self, batch_size: int, max_seq_len: int) -> TritonAttnMeta:
        # NOTE: the kernel sizes each split from the request's own length, so splits chosen for
        # the longest possible sequence stay correct (if partly idle) for short ones.
        return self._decode_meta(batch_size, max_seq_len)

    def _decode_meta(self, batch_size: int, max_seq_len: int) -> TritonAttnMeta:
        splits = choose_num_kv_splits(batch_size, self.num_kv_heads, max_seq_len, self.num_sms)
        device = self.kv_pool.k[0].device
        scratch = alloc_decode_scratch(batch_size, self.num_heads, self.head_dim, splits, device)
        return TritonAttnMeta(is_decode=True, num_kv_splits=splits, scratch=scratch)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_pool.write(layer, batch.out_cache_loc, k, v)
        meta: TritonAttnMeta = batch.attn_meta
        k_buf, v_buf = self.kv_pool.k[layer], self.kv_pool.v[layer]
        if q.stride(-1) != 1:
            q = q.contiguous()
        if meta.is_decode:
            return decode_attention(
                q, k_buf, v_buf, batch.req_to_token, batch.req_slots, batch.seq_lens,
                self.scale, meta.num_kv_splits, scratch=meta.scratch,
            )  # fmt: skip
        return extend_attention(
            q, k_buf, v_buf, batch.req_to_token, batch.req_slots, batch.prefix_lens,
            batch.extend_lens, meta.extend_starts, meta.max_extend, self.scale,
        )  # fmt: skip
