"""Decode attention over the paged KV pool: one query token per request (split-KV flash decoding).

Stage 1 splits each request's KV slots into ``num_kv_splits`` contiguous chunks; one program per
(request, KV head, split) attends all query heads of that KV head's GQA group to its chunk and
writes a normalised partial output and its log-sum-exp. Stage 2 merges the splits per head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.interpret import check_launchable, dot_mode

LOG2E = 1.4426950408889634
MIN_TOKENS_PER_SPLIT = 256
MAX_KV_SPLITS = 16


@triton.jit
def _decode_stage1(
    Q, K, V, ReqToToken, ReqSlots, SeqLens, MidO, MidLse,
    sm_scale_log2, num_splits,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_rt,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SeqLens + b)
    row = tl.load(ReqSlots + b).to(tl.int64)
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_h = offs_h < GROUP
    mask_d = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_h
    mask_hd = mask_h[:, None] & mask_d[None, :]
    q = tl.load(
        Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=mask_hd, other=0.0
    )

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + offs_n
        mask_n = offs < end
        slots = tl.load(ReqToToken + row * stride_rt + offs, mask=mask_n, other=0).to(tl.int64)
        mask_nd = mask_n[:, None] & mask_d[None, :]
        k = tl.load(
            K + slots[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :],
            mask=mask_nd,
            other=0.0,
        )
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q.to(k.dtype), tl.trans(k), input_precision=PRECISION) * sm_scale_log2
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            V + slots[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :],
            mask=mask_nd,
            other=0.0,
        )
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    # NOTE: an empty split (short request) stores output 0 and lse -inf, so stage 2 weighs it 0.
    nonempty = l_i > 0
    l_safe = tl.where(nonempty, l_i, 1.0)
    lse = tl.where(nonempty, m_i + tl.log2(l_safe), float("-inf"))
    o_base = MidO + b * stride_ob + split * stride_os
    tl.store(
        o_base + heads[:, None] * stride_oh + offs_d[None, :], acc / l_safe[:, None], mask=mask_hd
    )
    tl.store(MidLse + b * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


@triton.jit
def _decode_stage2(
    MidO, MidLse, Out, num_splits,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_outb, stride_outh,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < num_splits
    mask_d = offs_d < HEAD_DIM
    lse = tl.load(MidLse + b * stride_lb + h * stride_lh + offs_s, mask=mask_s, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))
    o_ptrs = MidO + b * stride_ob + h * stride_oh + offs_s[:, None] * stride_os + offs_d[None, :]
    o = tl.load(o_ptrs, mask=mask_s[:, None] & mask_d[None, :], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    out_ptrs = Out + b * stride_outb + h * stride_outh + offs_d
    tl.store(out_ptrs, out.to(Out.dtype.element_ty), mask=mask_d)


def choose_num_kv_splits(
    batch_size: int, num_kv_heads: int, max_seq_len: int, num_sms: int = 132
) -> int:
    """Splits per request: enough programs to fill the GPU (about 4 per SM), but no split
    shorter than ``MIN_TOKENS_PER_SPLIT`` tokens and at most ``MAX_KV_SPLITS``."""
    by_len = triton.cdiv(max(max_seq_len, 1), MIN_TOKENS_PER_SPLIT)
    by_occupancy = triton.cdiv(4 * num_sms, max(batch_size * num_kv_heads, 1))
    return max(1, min(by_len, by_occupancy, MAX_KV_SPLITS))


def alloc_decode_scratch(
    batch_size: int, num_heads: int, head_dim: int, num_kv_splits: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage-1 outputs: partial outputs ``[B, H, S, D]`` and log-sum-exps ``[B, H, S]``, fp32."""
    mid_o = torch.empty(
        batch_size, num_heads, num_kv_splits, head_dim, dtype=torch.float32, device=device
    )
    mid_lse = torch.empty(batch_size, num_heads, num_kv_splits, dtype=torch.float32, device=device)
    return mid_o, mid_lse


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_slots: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    num_kv_splits: int,
    out: torch.Tensor | None = None,
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Attention of one query per request over its KV slots.

    q ``[B, H, D]``; k/v_buffer ``[num_slots, Hkv, D]`` (``H % Hkv == 0``); request ``i`` reads
    slots ``req_to_token[req_slots[i], :seq_lens[i]]`` (``seq_lens[i] >= 1``). ``scratch`` is
    :func:`alloc_decode_scratch` output with at least ``num_kv_splits`` splits. Returns
    ``[B, H, D]`` in ``out`` (or a new tensor) with q's dtype.
    """
    check_launchable(q)
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if scratch is None:
        scratch = alloc_decode_scratch(batch, num_heads, head_dim, num_kv_splits, q.device)
    mid_o, mid_lse = scratch
    block_d = triton.next_power_of_2(head_dim)
    on_gpu = q.device.type == "cuda"
    precision, upcast = dot_mode(k_buffer)
    _decode_stage1[(batch, num_kv_heads, num_kv_splits)](
        q, k_buffer, v_buffer, req_to_token, req_slots, seq_lens, mid_o, mid_lse,
        sm_scale * LOG2E, num_kv_splits,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d, BLOCK_N=block_n or (64 if on_gpu else 32),
        PRECISION=precision, UPCAST=upcast,
        num_warps=4, num_stages=2,
    )  # fmt: skip
    _decode_stage2[(batch, num_heads)](
        mid_o, mid_lse, out, num_kv_splits,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_S=max(2, triton.next_power_of_2(num_kv_splits)), BLOCK_D=block_d,
        num_warps=4 if block_d >= 128 else 2,
    )  # fmt: skip
    return out


def decode_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_slots: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """Plain-torch twin of :func:`decode_attention` (fp32 math, one request at a time)."""
    group = q.shape[1] // k_buffer.shape[1]
    out = torch.empty_like(q)
    for i, (row, n) in enumerate(zip(req_slots.tolist(), seq_lens.tolist())):
        slots = req_to_token[row, :n]
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [L, H, D]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[i].float(), k) * sm_scale
        out[i] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v).to(q.dtype)
    return out
