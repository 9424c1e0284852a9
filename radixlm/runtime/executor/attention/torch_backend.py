"""Reference attention backend: gathers each request's KV and runs torch SDPA, padded per group.

Decode rows (one new token) and extend rows (several) form separate groups so that a long
prefill chunk does not pad every decode row to its length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.runtime.executor.attention.base import AttentionBackend, register_attention_backend
from radixlm.runtime.executor.forward_batch import ForwardBatch


@dataclass
class _Group:
    token_idx: torch.Tensor | None  # [T_g] rows of the batch's tokens; None = all, in order
    kv_index: torch.Tensor  # [B_g, L] KV slots per request (padded)
    pad_idx: torch.Tensor | None  # [T_g] row in the padded [B_g * E] query; None = no padding
    mask: torch.Tensor  # [B_g, 1, E, L] bool
    num_reqs: int
    max_extend: int


@register_attention_backend("torch")
class TorchAttentionBackend(AttentionBackend):
    def prepare(self, batch: ForwardBatch) -> None:
        ext = batch.extend_lens_list
        decode_rows = [i for i, n in enumerate(ext) if n == 1]
        extend_rows = [i for i, n in enumerate(ext) if n != 1]
        groups = [rows for rows in (decode_rows, extend_rows) if rows]
        batch.attn_meta = [self._group(batch, rows, len(groups) == 1) for rows in groups]

    def _group(self, batch: ForwardBatch, rows: list[int], whole: bool) -> _Group:
        device = batch.input_ids.device
        ext = [batch.extend_lens_list[i] for i in rows]
        seq = [batch.seq_lens_list[i] for i in rows]
        n, max_e, max_l = len(rows), max(ext), max(seq)
        rows_t = torch.tensor(rows, dtype=torch.int64, device=device)
        kv_index = batch.req_to_token[batch.req_slots[rows_t], :max_l]
        seq_t = batch.seq_lens[rows_t]
        ext_t = batch.extend_lens[rows_t]
        q_pos = (seq_t - ext_t)[:, None] + torch.arange(max_e, device=device)[None, :]
        keys = torch.arange(max_l, device=device)
        mask = (keys[None, None, :] <= q_pos[:, :, None]) & (
            keys[None, None, :] < seq_t[:, None, None]
        )
        token_idx = None
        if not whole:
            starts = torch.cumsum(batch.extend_lens, 0) - batch.extend_lens
            token_idx = torch.cat(
                [torch.arange(s, s + e) for s, e in zip(starts[rows_t].tolist(), ext)]
            )
            token_idx = token_idx.to(device)
        pad_idx = None
        if any(e != max_e for e in ext):
            pad_idx = torch.cat([torch.arange(i * max_e, i * max_e + e) for i, e in enumerate(ext)])
            pad_idx = pad_idx.to(device)
        return _Group(token_idx, kv_index, pad_idx, mask[:, None], n, max_e)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_pool.write(layer, batch.out_cache_loc, k, v)
        groups: list[_Group] = batch.attn_meta
        if len(groups) == 1 and groups[0].token_idx is None:
            return self._attend(q, layer, groups[0])
        out = torch.empty_like(q)
        for g in groups:
            out[g.token_idx] = self._attend(q[g.token_idx], layer, g)
        return out

    def _attend(self, q: torch.Tensor, layer: int, g: _Group) -> torch.Tensor:
        k = self.kv_pool.k[layer][g.kv_index]  # [B, L, Hkv, D]
        v = self.kv_pool.v[layer][g.kv_index]
        if g.pad_idx is not None:
            padded = q.new_zeros(g.num_reqs * g.max_extend, *q.shape[1:])
            padded[g.pad_idx] = q
            q = padded
        q = q.view(g.num_reqs, g.max_extend, *q.shape[1:])
        out = grouped_attention(q.to(k.dtype), k, v, g.mask[:, 0], self.scale).to(q.dtype)
        out = out.reshape(-1, *q.shape[2:])
        return out if g.pad_idx is None else out[g.pad_idx]


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention with grouped KV heads and no KV repeat: two batched matmuls per call.

    q ``[B, E, H, D]``, k/v ``[B, L, Hkv, D]``, mask ``[B, E, L]`` (True = attend) ->
    ``[B, E, H, D]``. Scores and softmax are float32.
    """
    b, e, h, d = q.shape
    hkv = k.shape[2]
    g = h // hkv
    q = q.view(b, e, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * e, d)
    scores = torch.matmul(q, k.permute(0, 2, 3, 1)).float().mul_(scale)  # [B, Hkv, G*E, L]
    scores = scores.view(b, hkv, g, e, -1).masked_fill_(~mask[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype).view(b, hkv, g * e, -1)
    out = torch.matmul(probs, v.transpose(1, 2))  # [B, Hkv, G*E, D]
    return out.view(b, hkv, g, e, d).permute(0, 3, 1, 2, 4).reshape(b, e, h, d)
