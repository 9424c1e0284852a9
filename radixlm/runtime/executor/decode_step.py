"""One decode step as tensors, and its attention: what the ahead-of-time compiled CPU graphs
(``aot_graphs``) compute.

A decode step of a small model on CPU is a few hundred small ops (norms, rotary, the KV write
and gather, softmax, residual adds) around the weight matmuls, and dispatching them eagerly
costs about as much as the matmuls (SmolLM2-135M: ~10 of ~20 ms a token). Compiled, they fuse:
the model's own ``forward`` runs over :class:`DecodeInputs` (in place of a ``ForwardBatch``)
with :class:`DecodeAttention` (in place of the attention backend), whose attention is the C++
kernel of ``kernels/cpu_ops.py`` where it loaded.

A step's rows are tokens, laid out per request (``[requests, tokens per request]``, padded)
over each request's KV slots once, with a causal key mask, so the same formulation runs decode
steps and speculative verify steps (several tokens of a request, each needing logits). A batch
whose requests share ``MIN_SHARED_PREFIX`` slots or more carries them apart
(``shared_index``): each request's own slots as above, the shared ones once for all of the
step's queries through a flash kernel, merged by log-sum-exp as the eager backend's cascade
attention does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from radixlm.kernels import cpu_ops
from radixlm.runtime.executor.attention.torch_backend import (
    MIN_SHARED_PREFIX,
    flash_attention,
    merge_attention,
    shared_prefix_len,
)
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.mem_cache.memory_pool import KVPool
from radixlm.runtime.models.quant import MAX_INT4_ROWS
from radixlm.runtime.models.quant_head import MAX_INT8_HEAD_ROWS

# The int4 and int8 copies' rows: the small graphs' limit (larger steps take the bf16 weights)
MAX_ROWS = min(MAX_INT4_ROWS, MAX_INT8_HEAD_ROWS)
WARMUP_LEN = 16  # context length of the compile's example step (the dimension is dynamic)


@dataclass
class DecodeInputs:
    """What the model's forward reads of a step whose every token needs logits, as tensors
    only; token ``t`` is the step's token ``t``, at ``token_slot[t]`` of the step's
    ``[R requests, E tokens each]`` grid (a request with fewer than ``E`` tokens leaves slots
    unused)."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    logits_indices: torch.Tensor  # [T] = arange(T)
    out_cache_loc: torch.Tensor  # [T] the KV slot each new token writes
    token_slot: torch.Tensor  # [T] each token's place in the flattened [R, E] grid
    kv_index: torch.Tensor  # [R, L] each request's KV slots (after the shared ones)
    key_mask: torch.Tensor  # [R, E, L] True for the slots a grid entry attends to (causal)
    shared_index: torch.Tensor | None = None  # [P] slots every request starts with (cascade)
    keep_hidden: ClassVar[bool] = False  # NOTE: a compiled step returns logits only

    def flat(self) -> tuple[torch.Tensor, ...]:
        """The fields in order, ``shared_index`` last where there is one (a package's inputs)."""
        fields = (self.input_ids, self.positions, self.logits_indices, self.out_cache_loc,
                  self.token_slot, self.kv_index, self.key_mask)  # fmt: skip
        return fields if self.shared_index is None else (*fields, self.shared_index)


class DecodeAttention:
    """Attention for a step of few tokens: write the new K/V, then each token attends to its
    request's slots under the grid's causal mask, through the C++ kernel where it loaded
    (``kernel``: ``kernels/cpu_ops.py``) or else written so that inductor fuses it:
    scores and outputs as elementwise products summed in float32, reading each request's KV
    through its index inside the reductions (no gathered copy). Every query row is computed
    the same way whatever the step's shape, so a verify step's rows equal the decode steps'
    (module docstring)."""

    def __init__(
        self, kv_pool: KVPool, scale: float, kernel: bool = False, flash: bool = False
    ) -> None:
        """``kernel``: the C++ decode kernel; ``flash``: the shared part through the C++ flash
        kernel (else torch's, over a gathered copy)."""
        self.kv_pool, self.scale, self.kernel, self.flash = kv_pool, scale, kernel, flash

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: DecodeInputs
    ) -> torch.Tensor:
        self.kv_pool.write(layer, batch.out_cache_loc, k, v)
        k_buf, v_buf = self.kv_pool.k[layer], self.kv_pool.v[layer]
        if self.kernel:
            own, own_lse = cpu_ops.decode_attention(
                q, k_buf, v_buf, batch.kv_index, batch.token_slot, batch.key_mask, self.scale
            )
        else:
            own, own_lse = self._fused(q, k_buf, v_buf, batch)
        if batch.shared_index is None:
            return own.to(q.dtype)
        # NOTE: cascade (decode batches only, one token per request): each request's own slots
        # as above, the shared ones once for all queries through a flash kernel, merged
        # by log-sum-exp as the eager backend does
        shared = batch.shared_index
        if self.flash:
            common, common_lse = cpu_ops.flash_attention(q, k_buf, v_buf, shared, scale=self.scale)
        else:
            common, common_lse = flash_attention(
                q[None], k_buf[shared][None], v_buf[shared][None], self.scale
            )
            common, common_lse = common[0], common_lse[0]
        return merge_attention(own, own_lse, common, common_lse).to(q.dtype)

    def _fused(
        self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, batch: DecodeInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The torch formulation: float32 outputs ``[T, H, D]`` and, for a cascade, their
        log-sum-exp."""
        reqs, per_req, _ = batch.key_mask.shape
        heads, dim = q.shape[1:]
        kv_heads = k_buf.shape[1]
        grid = q.new_zeros(reqs * per_req, heads, dim).index_copy_(0, batch.token_slot, q)
        q6 = grid.float().view(reqs, per_req, 1, kv_heads, heads // kv_heads, dim)
        keys = k_buf[batch.kv_index].float()[:, None, :, :, None, :]  # [R, 1, L, Hkv, 1, D]
        scores = (q6 * keys).sum(-1) * self.scale  # [R, E, L, Hkv, G]
        scores = scores.masked_fill(~batch.key_mask[..., None, None], float("-inf"))
        values = v_buf[batch.kv_index].float()[:, None, :, :, None, :]
        if batch.shared_index is None:
            out = (scores.softmax(dim=2)[..., None] * values).sum(2)  # [R, E, Hkv, G, D]
            return out.reshape(reqs * per_req, heads, dim)[batch.token_slot], None
        # NOTE: the cascade's grid is the tokens' order (one token per request)
        top = scores.amax(dim=2, keepdim=True)
        probs = (scores - top).exp()
        total = probs.sum(dim=2, keepdim=True)
        own = (probs[..., None] * values).sum(2) / total.squeeze(2)[..., None]
        return own.view(-1, heads, dim), (total.log() + top).view(-1, heads)


def long_shared_prefix(batch: ForwardBatch) -> int:
    """How many KV slots a batch's requests all start with, where that is
    ``MIN_SHARED_PREFIX`` or more (else 0): a prefix to read once for all of them (cascade)."""
    kv_index = batch.req_to_token[batch.req_slots, : min(batch.seq_lens_list)]
    shared = shared_prefix_len(kv_index)
    return shared if shared >= MIN_SHARED_PREFIX else 0


def decode_inputs(batch: ForwardBatch, shared: int = 0) -> DecodeInputs:
    """The graphs' inputs for ``batch``: one row per token; with ``shared``, the KV slots the
    requests all start with apart from each request's own."""
    token_slot, key_mask = grid(batch.extend_lens, batch.positions, max(batch.seq_lens_list))
    kv_index = batch.req_to_token[batch.req_slots, : key_mask.shape[2]]
    shared_index = None
    if shared:
        shared_index = kv_index[0, :shared].clone()
        kv_index, key_mask = kv_index[:, shared:].contiguous(), key_mask[:, :, shared:].contiguous()
    return DecodeInputs(
        batch.input_ids.contiguous(), batch.positions.contiguous(),
        batch.logits_indices.contiguous(), batch.out_cache_loc.contiguous(), token_slot,
        kv_index.contiguous(), key_mask, shared_index,
    )  # fmt: skip


def grid(
    extend_lens: torch.Tensor, positions: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's place in the step's ``[R, E]`` grid, and the grid's causal key mask over
    ``length`` slots (unused entries attend to slot 0 only: a row of -inf would be NaN)."""
    reqs, per_req = extend_lens.shape[0], int(extend_lens.max())
    if per_req == 1:  # NOTE: a decode step, the common case: the tokens are the grid
        return torch.arange(reqs), torch.arange(length) <= positions.view(reqs, 1, 1)
    owner = torch.repeat_interleave(torch.arange(reqs), extend_lens)
    starts = torch.cumsum(extend_lens, 0) - extend_lens
    token_slot = owner * per_req + torch.arange(owner.shape[0]) - starts[owner]
    grid_pos = torch.zeros(reqs * per_req, dtype=torch.int64)
    grid_pos[token_slot] = positions
    return token_slot, torch.arange(length) <= grid_pos.view(reqs, per_req, 1)


def scratch_inputs(extend_lens: list[int], shared: int = 0) -> DecodeInputs:
    """A step that writes and reads only slot 0, the pool's scratch slot (with ``shared``
    slots all requests start with)."""
    zeros = torch.zeros(sum(extend_lens), dtype=torch.int64)
    token_slot, key_mask = grid(torch.tensor(extend_lens), zeros + WARMUP_LEN - 1, WARMUP_LEN)
    return DecodeInputs(
        input_ids=zeros, positions=zeros.clone(), logits_indices=torch.arange(zeros.shape[0]),
        out_cache_loc=zeros.clone(), token_slot=token_slot,
        kv_index=torch.zeros(len(extend_lens), WARMUP_LEN, dtype=torch.int64), key_mask=key_mask,
        shared_index=torch.zeros(shared, dtype=torch.int64) if shared else None,
    )  # fmt: skip
