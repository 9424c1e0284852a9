"""Extend (prefill) attention over the paged KV pool, in one online-softmax pass.

Each request has ``extend_len`` new tokens after ``prefix_len`` cached ones. New token ``j``
(position ``prefix_len + j``) attends to every cached token and causally to the new ones.
Keys and values of both parts are read from the KV pool through ``req_to_token``.

The new tokens' k/v must already be written into the pool, and their slots into
``req_to_token[req_slot, prefix_len:prefix_len + extend_len]``, before the kernel runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.interpret import check_launchable, dot_mode

LOG2E = 1.4426950408889634


@triton.jit
def _extend_kernel(
    Q, K, V, Out, ReqToToken, ReqSlots, PrefixLens, ExtendLens, ExtendStarts,
    sm_scale_log2,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_rt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    m0 = tl.program_id(0) * BLOCK_M
    b = tl.program_id(1)
    h = tl.program_id(2)
    extend_len = tl.load(ExtendLens + b)
    if m0 < extend_len:
        prefix_len = tl.load(PrefixLens + b)
        first_tok = tl.load(ExtendStarts + b)
        row = tl.load(ReqSlots + b).to(tl.int64)
        kvh = h // GROUP
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        mask_m = offs_m < extend_len
        mask_d = offs_d < HEAD_DIM
        toks = (first_tok + offs_m).to(tl.int64)
        mask_md = mask_m[:, None] & mask_d[None, :]
        q = tl.load(
            Q + toks[:, None] * stride_qt + h * stride_qh + offs_d[None, :], mask=mask_md, other=0.0
        )
        q_pos = prefix_len + offs_m
        end = tl.minimum(prefix_len + m0 + BLOCK_M, prefix_len + extend_len)

        # NOTE: key 0 is visible to every row, so the first block makes each row's max finite.
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for n0 in range(0, end, BLOCK_N):
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
            visible = mask_n[None, :] & (offs[None, :] <= q_pos[:, None])
            s = tl.where(visible, s, float("-inf"))
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

        out = acc / l_i[:, None]
        o_ptrs = Out + toks[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=mask_md)


def extend_starts_of(extend_lens: torch.Tensor) -> torch.Tensor:
    """Row of each request's first new token in the token-major q: exclusive cumsum."""
    return torch.cumsum(extend_lens, 0) - extend_lens


def _gpu_config(head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) on CUDA."""
    if head_dim <= 64:
        return 128, 64, 4
    if head_dim <= 128:
        return 128, 64, 8
    return 64, 32, 8


def extend_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_slots: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_starts: torch.Tensor,
    max_extend: int,
    sm_scale: float,
    out: torch.Tensor | None = None,
    blocks: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """Attention of each request's new tokens over its cached prefix and, causally, themselves.

    q ``[T, H, D]`` token-major (request ``i`` owns rows ``extend_starts[i]`` to
    ``extend_starts[i] + extend_lens[i]``); k/v_buffer ``[num_slots, Hkv, D]`` already hold the
    new tokens; ``max_extend >= max(extend_lens)``. ``blocks`` overrides
    ``(BLOCK_M, BLOCK_N, num_warps)``. Returns ``[T, H, D]`` with q's dtype.
    """
    check_launchable(q)
    num_tokens, num_heads, head_dim = q.shape
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return out
    on_gpu = q.device.type == "cuda"
    block_m, block_n, num_warps = blocks or (_gpu_config(head_dim) if on_gpu else (32, 32, 4))
    precision, upcast = dot_mode(k_buffer)
    grid = (triton.cdiv(max_extend, block_m), req_slots.shape[0], num_heads)
    _extend_kernel[grid](
        q, k_buffer, v_buffer, out, req_to_token, req_slots, prefix_lens, extend_lens,
        extend_starts, sm_scale * LOG2E,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), out.stride(0), out.stride(1),
        req_to_token.stride(0),
        GROUP=num_heads // k_buffer.shape[1], HEAD_DIM=head_dim, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(head_dim), PRECISION=precision,
        UPCAST=upcast, num_warps=num_warps, num_stages=1,
    )  # fmt: skip
    return out


def extend_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_slots: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """Plain-torch twin of :func:`extend_attention` (fp32 math, one request at a time)."""
    group = q.shape[1] // k_buffer.shape[1]
    out = torch.empty_like(q)
    start = 0
    for row, p, e in zip(req_slots.tolist(), prefix_lens.tolist(), extend_lens.tolist()):
        slots = req_to_token[row, : p + e]
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [L, H, D]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("ehd,lhd->hel", q[start : start + e].float(), k) * sm_scale
        q_pos = torch.arange(p, p + e, device=q.device)
        visible = torch.arange(p + e, device=q.device)[None, :] <= q_pos[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        out[start : start + e] = torch.einsum("hel,lhd->ehd", scores.softmax(-1), v).to(q.dtype)
        start += e
    return out
