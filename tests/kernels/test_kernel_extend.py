"""Extend attention kernel vs its torch twin (CPU: Triton interpreter; GPU: compiled)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: must precede the first triton import

import pytest

from radixlm.kernels.extend_attention import (
    extend_attention,
    extend_attention_ref,
    extend_starts_of,
)
from radixlm.kernels.interpret import interpreter_active, run_in_fresh_interpreter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
IN_PROCESS = DEVICE == "cuda" or interpreter_active()
in_process = pytest.mark.skipif(
    not IN_PROCESS, reason="triton was imported without the interpreter"
)
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def make_extend(prefixes: list[int], extends: list[int], num_kv_heads: int, group: int,
                head_dim: int, dtype: torch.dtype) -> dict:  # fmt: skip
    """Random pool holding prefix and new tokens at scattered slots; the kernel's arguments."""
    gen = torch.Generator().manual_seed(len(prefixes) * 1000 + sum(extends))
    lens = [p + e for p, e in zip(prefixes, extends)]
    num_slots = sum(lens) + 5
    k_buf = torch.randn(num_slots + 1, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_buf = torch.randn(num_slots + 1, num_kv_heads, head_dim, generator=gen).to(dtype)
    req_to_token = torch.zeros(8, max(lens) + 3, dtype=torch.int64)
    req_slots = torch.randperm(8, generator=gen)[: len(lens)]
    slots = torch.randperm(num_slots, generator=gen) + 1
    start = 0
    for row, n in zip(req_slots.tolist(), lens):
        req_to_token[row, :n] = slots[start : start + n]
        start += n
    q = torch.randn(sum(extends), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    tensors = {
        "q": q,
        "k_buffer": k_buf,
        "v_buffer": v_buf,
        "req_to_token": req_to_token,
        "req_slots": req_slots,
        "prefix_lens": torch.tensor(prefixes),
        "extend_lens": torch.tensor(extends),
    }
    args = {name: t.to(DEVICE) for name, t in tensors.items()}
    return {**args, "sm_scale": head_dim**-0.5}


def run_kernel(args: dict, **kwargs) -> torch.Tensor:
    ext = args["extend_lens"]
    return extend_attention(**args, extend_starts=extend_starts_of(ext),
                            max_extend=int(ext.max()), **kwargs)  # fmt: skip


CASES = [
    # prefixes, extends, num_kv_heads, group, head_dim, dtype
    ([0], [5], 2, 1, 64, torch.float32),
    ([0, 70, 33], [40, 1, 7], 2, 3, 80, torch.float32),
    ([10, 2, 17, 64, 9], [33, 1, 1, 12, 40], 1, 4, 64, torch.float32),
    ([40, 0], [7, 39], 2, 4, 80, torch.bfloat16),
    ([3, 0, 50], [1, 20, 2], 1, 3, 64, torch.float16),
]


@in_process
@pytest.mark.parametrize("prefixes,extends,num_kv_heads,group,head_dim,dtype", CASES)
def test_extend_matches_ref(prefixes, extends, num_kv_heads, group, head_dim, dtype):
    args = make_extend(prefixes, extends, num_kv_heads, group, head_dim, dtype)
    out = run_kernel(args)
    ref = extend_attention_ref(**args)
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


@in_process
def test_extend_small_blocks_cross_block_boundaries():
    args = make_extend([19, 0], [37, 18], 2, 2, 64, torch.float32)
    out = run_kernel(args, blocks=(16, 16, 4))
    torch.testing.assert_close(out, extend_attention_ref(**args), atol=1e-4, rtol=1e-4)


@in_process
def test_extend_token_never_sees_later_tokens():
    args = make_extend([4], [12], 1, 2, 64, torch.float32)
    first = run_kernel(args)
    later = args["req_to_token"][args["req_slots"][0], 10:16]
    args["k_buffer"][later] = 50.0
    args["v_buffer"][later] = 1e4
    again = run_kernel(args)
    torch.testing.assert_close(again[:6], first[:6])
    assert (again[6:] - first[6:]).abs().amax() > 100


@pytest.mark.skipif(IN_PROCESS, reason="kernels ran in this process")
def test_extend_in_fresh_interpreter():
    proc = run_in_fresh_interpreter(__file__)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_extend_matches_ref_at_real_shapes_gpu(dtype):
    args = make_extend([0, 1000, 37, 2048], [1024, 300, 1, 513], 8, 4, 128, dtype)
    torch.testing.assert_close(run_kernel(args).float(), extend_attention_ref(**args).float(),
                               atol=TOL[dtype], rtol=TOL[dtype])  # fmt: skip
