"""Helpers for the GPU kernel benchmark: timing, paged KV setup, SDPA baselines.

Imports torch only (triton through the kernels), so it runs on a machine without the
server's dependencies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def timed_ms(fn: Callable[[], object], device: torch.device, rep_ms: int = 200) -> float:
    """Median milliseconds per call (CUDA: ``triton.testing.do_bench``; CPU: one timed call)."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=50, rep=rep_ms, return_mode="median"))
    fn()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def copy_bandwidth_gbs(device: torch.device, nbytes: int) -> dict:
    """Device-to-device copy of ``nbytes``: GB/s counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = timed_ms(lambda: dst.copy_(src), device)
    return {"bytes": nbytes, "ms": ms, "gbs_read_plus_write": 2 * nbytes / ms / 1e6}


@dataclass
class PagedKV:
    """A KV pool holding ragged requests at (optionally scattered) slots; slot 0 is scratch."""

    k_buf: torch.Tensor  # [num_slots + 1, Hkv, D]
    v_buf: torch.Tensor
    req_to_token: torch.Tensor  # [B, max_len] int64
    req_slots: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64


def paged_kv(
    lens: list[int], num_kv_heads: int, head_dim: int, dtype: torch.dtype,
    device: torch.device, scattered: bool = True, seed: int = 0,
) -> PagedKV:  # fmt: skip
    """Random k/v for requests of ``lens`` tokens; ``scattered`` permutes their slots."""
    gen = torch.Generator(device=device).manual_seed(seed)
    total = sum(lens)
    shape = (total + 1, num_kv_heads, head_dim)
    k_buf = torch.randn(shape, generator=gen, device=device).to(dtype)
    v_buf = torch.randn(shape, generator=gen, device=device).to(dtype)
    if scattered:
        slots = torch.randperm(total, generator=gen, device=device) + 1
    else:
        slots = torch.arange(1, total + 1, device=device)
    req_to_token = torch.zeros(len(lens), max(lens), dtype=torch.int64, device=device)
    start = 0
    for row, n in enumerate(lens):
        req_to_token[row, :n] = slots[start : start + n]
        start += n
    req_slots = torch.arange(len(lens), device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int64, device=device)
    return PagedKV(k_buf, v_buf, req_to_token, req_slots, seq_lens)


def gather_kv(kv: PagedKV) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded per-request k/v ``[B, Hkv, L, D]`` gathered from the pool (padding reads slot 0)."""
    index = kv.req_to_token[kv.req_slots]
    return kv.k_buf[index].transpose(1, 2), kv.v_buf[index].transpose(1, 2)


def make_sdpa(q, k, v, scale: float, mask=None, is_causal: bool = False):
    """``(fn, mode)``: a no-argument SDPA call with native GQA when this torch supports it for
    these inputs, else over k/v with heads repeated beforehand (outside any timed region)."""
    group = q.shape[1] // k.shape[1]
    kwargs = {"attn_mask": mask, "is_causal": is_causal, "scale": scale}
    try:
        F.scaled_dot_product_attention(q, k, v, enable_gqa=group > 1, **kwargs)
        return (
            lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=group > 1, **kwargs)
        ), "enable_gqa"
    except (RuntimeError, TypeError, ValueError):
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return (lambda: F.scaled_dot_product_attention(q, k, v, **kwargs)), "repeat_kv"


def sdpa(q, k, v, scale: float, mask=None, is_causal: bool = False) -> torch.Tensor:
    """One SDPA call (see :func:`make_sdpa`)."""
    fn, _ = make_sdpa(q, k, v, scale, mask, is_causal)
    return fn()


def ragged_to_padded(x: torch.Tensor, lens: list[int]) -> torch.Tensor:
    """Token-major ``[T, H, D]`` -> ``[B, H, max_len, D]`` (zero padding)."""
    out = x.new_zeros(len(lens), max(lens), *x.shape[1:])
    start = 0
    for i, n in enumerate(lens):
        out[i, :n] = x[start : start + n]
        start += n
    return out.transpose(1, 2)


def padded_to_ragged(x: torch.Tensor, lens: list[int]) -> torch.Tensor:
    """``[B, H, max_len, D]`` -> token-major ``[T, H, D]``."""
    x = x.transpose(1, 2)
    return torch.cat([x[i, :n] for i, n in enumerate(lens)])


def extend_mask(prefixes: list[int], extends: list[int], device: torch.device) -> torch.Tensor:
    """Bool ``[B, 1, E, L]``: new token j of request i sees keys ``<= prefix_i + j``."""
    max_e, max_l = max(extends), max(p + e for p, e in zip(prefixes, extends))
    prefix = torch.tensor(prefixes, device=device)
    seq = prefix + torch.tensor(extends, device=device)
    q_pos = prefix[:, None] + torch.arange(max_e, device=device)[None, :]
    keys = torch.arange(max_l, device=device)
    visible = keys[None, None, :] <= q_pos[:, :, None]
    return (visible & (keys[None, None, :] < seq[:, None, None]))[:, None]


def sdpa_paged_extend(q, kv: PagedKV, prefixes: list[int], extends: list[int], scale: float):
    """Gather-then-SDPA over each request's slots: the torch backend's strategy."""
    k, v = gather_kv(kv)
    mask = extend_mask(prefixes, extends, q.device)
    out = sdpa(ragged_to_padded(q, extends), k, v, scale, mask=mask)
    return padded_to_ragged(out, extends)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    """``|a - b| <= tol + tol * |b|`` everywhere (``torch.allclose`` with atol = rtol = tol)."""
    return bool(torch.allclose(a.float(), b.float(), atol=tol, rtol=tol))


def causal_flops(prefixes: list[int], extends: list[int], num_heads: int, head_dim: int) -> float:
    """Matmul FLOPs of causal attention (QK^T and PV) over exactly the visible pairs."""
    pairs = sum(p * e + e * (e + 1) // 2 for p, e in zip(prefixes, extends))
    return 4.0 * pairs * num_heads * head_dim
