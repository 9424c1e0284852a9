"""Reference attention backend (CPU default): gathers each request's KV and attends with matmuls.

Decode rows (one new token) and extend rows (several) form separate groups, so a long prefill
chunk does not pad every decode row to its length. When every request of a group starts with the
same KV slots (a shared few-shot header, a system prompt, forked branches), that shared part is
attended once for all of the group's queries and merged with each request's own suffix by
log-sum-exp ("cascade" attention): the shared KV is read once, not once per request.

Extend groups (prefill chunks, questions after a cached header) in bf16 on a CPU with AVX-512
BF16 take the C++ flash kernel (``kernels/cpu_ops.py``) once the CPU kernels loaded: each
request's queries over its own slots read through the KV index (no gathered or padded copy),
causally, and a shared part once for every query; SmolLM2, 790-token prompt, 2 threads: ~3 ms
a layer against 8.5 for torch's SDPA. So do decode groups' shared parts.

A sliding-window layer reads only each request's last keys: its groups (one set per window
size, built once a step) gather from the first slot a request's earliest query can see, mask
the window's lower edge too, and share no prefix; the C++ kernel takes the window itself.
Once no request is longer than the window, the layer uses the full-attention groups. With
score soft-capping (Gemma 2) every group takes the two matmuls, which cap the scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixlm.kernels import cpu_ops
from radixlm.runtime.executor.attention.base import AttentionBackend, register_attention_backend
from radixlm.runtime.executor.forward_batch import ForwardBatch

# NOTE: below this many shared slots the extra merge costs more than the gathers it saves.
MIN_SHARED_PREFIX = 64
# NOTE: from this many new tokens of one request on, torch's fused SDPA kernel beats the two
# matmuls (790 tokens, bf16: 9 ms against 25 ms a layer); below it, or for several requests, not.
SDPA_MIN_EXTEND = 256
# NOTE: from this many queries on, the part a group shares goes through torch's fused CPU
# flash-attention kernel (no float32 score matrix; bf16, 465 queries x 790 shared slots: 18 ms
# against 31 ms a layer); below it the two matmuls are as fast (64 queries: 1.7 vs 1.6 ms).
FLASH_MIN_QUERIES = 128
# NOTE: a decode group of several requests reads its KV padded to a multiple of this many slots
# (the padding masked): bf16 matmuls go through oneDNN, which JIT-compiles and caches a kernel per
# shape, so a length new at every step cost a compile every step (batch 32: ~5% of an eager step)
# and grew the process until its caches filled (``threads.ONEDNN_CACHES``).
DECODE_LEN_BUCKET = 16
# NOTE: padded (query, key) pairs a group may waste before its requests are split by length
# (one more group costs ~3 ms a step on SmolLM2: its gathers and matmuls in every layer; a
# wasted pair ~0.7 us). 32 ShareGPT prompts of 3 to 305 tokens, float32: 10 s as one group.
MIN_SPLIT_WASTE = 8192


def similar_lengths(rows: list[int], ext: list[int], seq: list[int]) -> list[list[int]]:
    """Extend ``rows`` cut into groups of similar lengths. The matmul path pads each request's
    queries to its group's longest extend and its keys to the longest sequence; a request
    starts a new group (longest first) once padding would more than double the group's work
    and waste over ``MIN_SPLIT_WASTE`` pairs."""
    groups: list[list[int]] = []
    real = max_e = max_l = 0
    for i in sorted(rows, key=lambda r: (seq[r], ext[r]), reverse=True):
        group = groups[-1] if groups else None
        if group is not None:
            e, pairs = max(max_e, ext[i]), real + ext[i] * seq[i]
            padded = (len(group) + 1) * e * max_l
            if padded - pairs <= max(pairs, MIN_SPLIT_WASTE):
                group.append(i)
                real, max_e = pairs, e
                continue
        groups.append([i])
        real, max_e, max_l = ext[i] * seq[i], ext[i], seq[i]
    return [sorted(g) for g in groups]  # NOTE: a group's rows in batch order


@dataclass
class _Group:
    token_idx: torch.Tensor | None  # [T_g] rows of the batch's tokens; None = all, in order
    kv_index: torch.Tensor  # [B_g, L] KV slots of each request after the shared part (padded)
    pad_idx: torch.Tensor | None  # [T_g] row in the padded [B_g * E] query; None = no padding
    mask: torch.Tensor | None  # [B_g, E, L] bool, True = attend (None: the kernel's group)
    num_reqs: int
    max_extend: int
    shared: torch.Tensor | None  # [P] KV slots every request of the group starts with
    kernel: bool  # the C++ flash kernel serves the shared part (and ``own``, where set)
    own: _Varlen | None = None  # each request's slots after the shared part, for the kernel
    window: int = 0  # the layers' sliding window (0: none)
    token_slot: torch.Tensor | None = None  # [B_g] the C++ decode kernel's grid (None: unused)


@dataclass
class _Varlen:
    """Request ``r``'s queries ``[q_starts[r], q_starts[r + 1])`` of the group over its slots
    ``slots[kv_starts[r]:kv_starts[r + 1]]`` (``cpu_ops.flash_attention``'s sequences)."""

    slots: torch.Tensor
    q_starts: torch.Tensor
    kv_starts: torch.Tensor


@register_attention_backend("torch")
class TorchAttentionBackend(AttentionBackend):
    def prepare(self, batch: ForwardBatch) -> None:
        """``batch.attn_meta``: each window size's groups (None: full attention's)."""
        ext = batch.extend_lens_list
        decode_rows = [i for i, n in enumerate(ext) if n == 1]
        extend_rows = [i for i, n in enumerate(ext) if n != 1]
        if len(extend_rows) > 1 and not self._flash_kernel():  # NOTE: the kernel pads nothing
            extend = similar_lengths(extend_rows, ext, batch.seq_lens_list)
        else:
            extend = [extend_rows]
        groups = [rows for rows in (decode_rows, *extend) if rows]
        full = [self._group(batch, rows, len(groups) == 1) for rows in groups]
        batch.attn_meta = {None: full}
        longest = max(batch.seq_lens_list)
        for w in set(self.windows) - {None}:
            batch.attn_meta[w] = full if longest <= w else [
                self._group(batch, rows, len(groups) == 1, w) for rows in groups
            ]  # fmt: skip

    def _flash_kernel(self) -> bool:
        """Whether the C++ flash kernel serves this pool (it loads in the background: once
        it has, the answer stays yes); never with soft-capped scores, which it cannot cap."""
        if self.softcap:
            return False
        if not getattr(self, "_kernel_ready", False):
            self._kernel_ready = self.kv_pool.k[0].device.type == "cpu" and cpu_ops.flash_ready(
                self.kv_pool.dtype, self.head_dim
            )
        return self._kernel_ready

    def _decode_kernel(self, device: torch.device) -> bool:
        """Whether a decode group's own slots go through the C++ decode kernel (the compiled
        steps' attention: each KV row read once for its query heads, no gathered copy; one
        token over 1024 slots, fp32, AVX2: 0.17 ms a layer against ~3 for the gather and two
        matmuls); not with soft-capped scores, which it cannot cap."""
        return device.type == "cpu" and not self.softcap and cpu_ops.loaded()

    def _group(self, batch: ForwardBatch, rows: list[int], whole: bool, window: int = 0) -> _Group:
        device = batch.input_ids.device
        ext = [batch.extend_lens_list[i] for i in rows]
        seq = [batch.seq_lens_list[i] for i in rows]
        # NOTE: each request's first key its earliest query can see (0 without a window)
        first = [max(0, s - e - window + 1) if window else 0 for s, e in zip(seq, ext)]
        n, max_e = len(rows), max(ext)
        max_l = max(s - f for s, f in zip(seq, first))
        if n > 1 and max_e == 1:
            max_l = -(-max_l // DECODE_LEN_BUCKET) * DECODE_LEN_BUCKET
        max_l = min(max_l, batch.req_to_token.shape[1])
        rows_t = torch.tensor(rows, dtype=torch.int64, device=device)
        slots_of = batch.req_slots[rows_t]
        if window:
            first_t = torch.tensor(first, dtype=torch.int64, device=device)
            cols = (first_t[:, None] + torch.arange(max_l, device=device)).clamp_(
                max=batch.req_to_token.shape[1] - 1
            )
            kv_index = batch.req_to_token[slots_of[:, None], cols]
            shared_len = 0  # NOTE: windows move with each query: no part every query sees
        else:
            kv_index = batch.req_to_token[slots_of, :max_l]
            shared_len = shared_prefix_len(kv_index[:, : min(seq)]) if n > 1 else 0
        if shared_len < MIN_SHARED_PREFIX:
            shared_len = 0
        # NOTE: new tokens get fresh slots, so every query sits past the shared part and sees
        # all of it unmasked.
        shared = kv_index[0, :shared_len] if shared_len else None
        kv_index = kv_index[:, shared_len:]
        kernel = self._flash_kernel()
        token_idx = None if whole else _token_rows(batch, rows_t, ext).to(device)
        if kernel and max_e > 1:  # NOTE: no mask, no padding: the kernel reads the slots
            own = [length - shared_len - f for length, f in zip(seq, first)]
            slots = torch.cat([kv_index[i, : own[i]] for i in range(n)])
            varlen = _Varlen(slots, _starts(ext, device), _starts(own, device))
            return _Group(token_idx, kv_index, None, None, n, max_e, shared, True, varlen, window)
        seq_t, ext_t = batch.seq_lens[rows_t], batch.extend_lens[rows_t]
        q_pos = (seq_t - ext_t)[:, None] + torch.arange(max_e, device=device)[None, :]
        offset = first_t[:, None] if window else shared_len
        keys = (offset + torch.arange(max_l - shared_len, device=device))[..., None, :]
        if keys.dim() == 2:
            keys = keys[None]
        mask = (keys <= q_pos[:, :, None]) & (keys < seq_t[:, None, None])
        if window:
            mask &= keys > q_pos[:, :, None] - window
        if max_e == 1 and shared is None and not window and self._decode_kernel(device):
            slot = torch.arange(n, device=device)
            return _Group(token_idx, kv_index, None, mask, n, 1, None, kernel, token_slot=slot)
        pad_idx = None
        if any(e != max_e for e in ext):
            pad_idx = torch.cat([torch.arange(i * max_e, i * max_e + e) for i, e in enumerate(ext)])
            pad_idx = pad_idx.to(device)
        return _Group(token_idx, kv_index, pad_idx, mask, n, max_e, shared, kernel, None, window)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_pool.write(layer, batch.out_cache_loc, k, v)
        groups: list[_Group] = batch.attn_meta[self.windows[layer]]
        if len(groups) == 1 and groups[0].token_idx is None:
            return self._attend(q, layer, groups[0])
        out = torch.empty_like(q)
        for g in groups:
            out[g.token_idx] = self._attend(q[g.token_idx], layer, g)
        return out

    def _attend(self, q: torch.Tensor, layer: int, g: _Group) -> torch.Tensor:
        k_buf, v_buf = self.kv_pool.k[layer], self.kv_pool.v[layer]
        if g.own is not None:
            return self._flash(q, k_buf, v_buf, g).to(q.dtype)
        if g.token_slot is not None:
            out, _ = cpu_ops.decode_attention(
                q, k_buf, v_buf, g.kv_index, g.token_slot, g.mask, self.scale
            )
            return out.to(q.dtype)
        if g.pad_idx is not None:
            padded = q.new_zeros(g.num_reqs * g.max_extend, *q.shape[1:])
            padded[g.pad_idx] = q
            q = padded
        # NOTE: one query row (single-stream decode) computes in float32: at that size the
        # conversion costs less than setting up bf16 matmuls.
        dtype = torch.float32 if g.num_reqs * g.max_extend == 1 else k_buf.dtype
        q4 = q.view(g.num_reqs, g.max_extend, *q.shape[1:]).to(dtype)
        k, v = _gather(k_buf, g.kv_index, dtype), _gather(v_buf, g.kv_index, dtype)
        sdpa = g.num_reqs == 1 and g.max_extend >= SDPA_MIN_EXTEND and not self.softcap
        if g.shared is None and sdpa:
            out = sdpa_attention(q4, k, v, g.mask, self.scale, causal=not g.window)
        elif g.shared is None:
            out = grouped_attention(q4, k, v, g.mask, self.scale, softcap=self.softcap)[0]
        else:
            out = self._cascade(q4, k, v, g, k_buf, v_buf)
        out = out.to(q.dtype).reshape(-1, *q.shape[1:])
        return out if g.pad_idx is None else out[g.pad_idx]

    def _flash(self, q, k_buf, v_buf, g: _Group) -> torch.Tensor:
        """An extend group through the C++ kernel: each request's own slots causally, the
        shared part (if any) once for every query, merged."""
        own = g.own
        out, lse = cpu_ops.flash_attention(
            q, k_buf, v_buf, own.slots, own.q_starts, own.kv_starts, True, self.scale, g.window
        )
        if g.shared is None:
            return out
        common, common_lse = cpu_ops.flash_attention(q, k_buf, v_buf, g.shared, scale=self.scale)
        return merge_attention(out, lse, common, common_lse)

    def _cascade(self, q4, k, v, g: _Group, k_buf, v_buf) -> torch.Tensor:
        cap = self.softcap
        own, own_lse = grouped_attention(q4, k, v, g.mask, self.scale, True, cap)
        flat = q4.reshape(1, -1, *q4.shape[2:])
        if g.kernel:
            common, common_lse = cpu_ops.flash_attention(
                flat[0], k_buf, v_buf, g.shared, scale=self.scale
            )
        else:
            k_shared = _gather(k_buf, g.shared, q4.dtype)[None]
            v_shared = _gather(v_buf, g.shared, q4.dtype)[None]
            if flat.shape[1] >= FLASH_MIN_QUERIES and flat.device.type == "cpu" and not cap:
                common, common_lse = flash_attention(flat, k_shared, v_shared, self.scale)
            else:
                common, common_lse = grouped_attention(
                    flat, k_shared, v_shared, None, self.scale, True, cap
                )
        return merge_attention(own, own_lse, common.view_as(own), common_lse.view_as(own_lse))


def merge_attention(
    a: torch.Tensor, a_lse: torch.Tensor, b: torch.Tensor, b_lse: torch.Tensor
) -> torch.Tensor:
    """Attention over two disjoint sets of keys, from each set's output ``[..., D]`` and
    log-sum-exp ``[...]``: their outputs weighted by each set's share of the softmax, float32."""
    lse = torch.logaddexp(a_lse, b_lse)
    return a.float() * (a_lse - lse).exp()[..., None] + b.float() * (b_lse - lse).exp()[..., None]


def grouped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    with_lse: bool = False,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention with grouped KV heads and no KV repeat: two batched matmuls.

    q ``[B, E, H, D]``, k/v ``[B, L, Hkv, D]``, mask ``[B, E, L]`` (True = attend) or None ->
    (out ``[B, E, H, D]``, and with ``with_lse`` the log-sum-exp of the scores ``[B, E, H]``).
    Softmax runs in float32, over the scores soft-capped at ``softcap`` if given.

    With one query per request (decode) the matmuls read k/v as gathered, ``[L, Hkv * D]``
    per request, against block-diagonal queries (each head's query in its KV head's block,
    zeros elsewhere), and keep each head's own block of the output: ``Hkv`` times the
    multiply-adds of a product that is tiny at one query, instead of a transposing copy of
    the whole gathered KV per layer (batch-32 decode attention ~2x faster, same values).
    """
    b, e, h, d = q.shape
    hkv = k.shape[2]
    g = h // hkv
    if e == 1:
        q_blocks = q.new_zeros(b, hkv, g, hkv, d)
        torch.diagonal(q_blocks, dim1=1, dim2=3).copy_(q.view(b, hkv, g, d).permute(0, 2, 3, 1))
        scores = torch.matmul(q_blocks.view(b, h, hkv * d), k.reshape(b, -1, hkv * d).mT)
    else:
        scores = torch.matmul(_kv_head_rows(q, hkv), k.permute(0, 2, 3, 1))  # [B, Hkv, G*E, L]
    scores = scores.float().mul_(scale).view(b, hkv, g, e, -1)
    if softcap:
        scores = scores.div_(softcap).tanh_().mul_(softcap)
    if mask is not None:
        scores.masked_fill_(~mask[:, None, None], float("-inf"))
    lse = None
    if with_lse:
        top = scores.amax(dim=-1, keepdim=True)
        probs = scores.sub_(top).exp_()
        total = probs.sum(dim=-1, keepdim=True)
        probs = probs.div_(total)
        lse = _per_token((total.log_() + top).view(b, hkv, g * e), e)
    else:
        probs = torch.softmax(scores, dim=-1)
    if e == 1:
        out = torch.matmul(probs.to(v.dtype).view(b, h, -1), v.reshape(b, -1, hkv * d))
        out = torch.diagonal(out.view(b, hkv, g, hkv, d), dim1=1, dim2=3)  # [B, G, D, Hkv]
        return out.permute(0, 3, 1, 2).reshape(b, e, h, d), lse
    out = torch.matmul(probs.to(v.dtype).view(b, hkv, g * e, -1), v.transpose(1, 2))
    return _per_token(out, e), lse


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention through torch's CPU flash-attention kernel, with its log-sum-exp
    (shapes as :func:`grouped_attention`). Every query sees every key, so a KV head's query
    heads are its rows (``[B, Hkv, G * E, D]``): no KV repeat."""
    e = q.shape[1]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _kv_head_rows(q, k.shape[2]), k.transpose(1, 2), v.transpose(1, 2), scale=scale
    )
    return _per_token(out, e), _per_token(lse, e)


def _kv_head_rows(q: torch.Tensor, hkv: int) -> torch.Tensor:
    """``[B, E, H, D]`` -> ``[B, Hkv, G * E, D]``: each KV head's query heads as its rows."""
    b, e, h, d = q.shape
    return q.view(b, e, hkv, h // hkv, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, h // hkv * e, d)


def _per_token(x: torch.Tensor, e: int) -> torch.Tensor:
    """Inverse of :func:`_kv_head_rows` for outputs ``[B, Hkv, G * E, D]`` -> ``[B, E, H, D]``
    and log-sum-exps ``[B, Hkv, G * E]`` -> ``[B, E, H]``."""
    b, hkv, rows, *d = x.shape
    g = rows // e
    return x.view(b, hkv, g, e, *d).permute(0, 3, 1, 2, *range(4, 4 + len(d))).reshape(
        b, e, hkv * g, *d
    )


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """One request's extend through ``F.scaled_dot_product_attention`` (shapes as
    :func:`grouped_attention`); without a prefix or a window (``causal``) the mask is plain
    causal and is not passed."""
    causal = causal and k.shape[1] == q.shape[1]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=None if causal else mask[:, None], is_causal=causal, scale=scale,
        enable_gqa=True,
    )  # fmt: skip
    return out.transpose(1, 2)


def _gather(buf: torch.Tensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``buf[index]`` (``index_select`` on the flat index: several times faster than advanced
    indexing for scattered slots), in ``dtype``."""
    rows = buf.index_select(0, index.reshape(-1)).view(*index.shape, *buf.shape[1:])
    return rows.to(dtype)


def shared_prefix_len(kv_index: torch.Tensor) -> int:
    """How many leading KV slots every row of ``kv_index`` has in common."""
    same = (kv_index == kv_index[:1]).all(dim=0)
    return int(same.int().cumprod(0).sum())


def _starts(lengths: list[int], device: torch.device) -> torch.Tensor:
    """``[0, l0, l0 + l1, ...]``: where each of the consecutive runs of ``lengths`` starts."""
    return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(device)


def _token_rows(batch: ForwardBatch, rows_t: torch.Tensor, ext: list[int]) -> torch.Tensor:
    starts = (torch.cumsum(batch.extend_lens, 0) - batch.extend_lens)[rows_t].tolist()
    return torch.cat([torch.arange(s, s + e) for s, e in zip(starts, ext)])
