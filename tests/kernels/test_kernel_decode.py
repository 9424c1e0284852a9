"""Split-KV decode attention kernel vs its torch twin (CPU: Triton interpreter; GPU: compiled)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: must precede the first triton import

import pytest

from radixlm.kernels.decode_attention import (
    MAX_KV_SPLITS,
    choose_num_kv_splits,
    decode_attention,
    decode_attention_ref,
)
from radixlm.kernels.interpret import interpreter_active, run_in_fresh_interpreter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
IN_PROCESS = DEVICE == "cuda" or interpreter_active()
in_process = pytest.mark.skipif(
    not IN_PROCESS, reason="triton was imported without the interpreter"
)
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def make_decode(seq_lens: list[int], num_kv_heads: int, group: int, head_dim: int, dtype, seed=0):
    """Random pool with each request's slots scattered; returns the kernel's arguments."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = sum(seq_lens) + 7
    k_buf = torch.randn(num_slots + 1, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_buf = torch.randn(num_slots + 1, num_kv_heads, head_dim, generator=gen).to(dtype)
    req_to_token = torch.zeros(8, max(seq_lens) + 5, dtype=torch.int64)
    req_slots = torch.randperm(8, generator=gen)[: len(seq_lens)]
    slots = torch.randperm(num_slots, generator=gen) + 1
    start = 0
    for row, n in zip(req_slots.tolist(), seq_lens):
        req_to_token[row, :n] = slots[start : start + n]
        start += n
    q = torch.randn(len(seq_lens), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    args = (q, k_buf, v_buf, req_to_token, req_slots, torch.tensor(seq_lens))
    return tuple(a.to(DEVICE) for a in args) + (head_dim**-0.5,)


CASES = [
    # seq_lens, num_kv_heads, group, head_dim, num_kv_splits, dtype
    ([1], 2, 1, 64, 1, torch.float32),
    ([1, 70, 33], 2, 3, 80, 4, torch.float32),
    ([100, 2, 17, 64, 9], 1, 4, 64, 3, torch.float32),
    ([5, 40], 2, 4, 64, MAX_KV_SPLITS, torch.float32),
    ([40, 71], 2, 4, 80, 2, torch.bfloat16),
    ([1, 66, 12], 1, 3, 64, 2, torch.float16),
]


@in_process
@pytest.mark.parametrize("seq_lens,num_kv_heads,group,head_dim,splits,dtype", CASES)
def test_decode_matches_ref(seq_lens, num_kv_heads, group, head_dim, splits, dtype):
    args = make_decode(seq_lens, num_kv_heads, group, head_dim, dtype)
    out = decode_attention(*args, num_kv_splits=splits)
    ref = decode_attention_ref(*args)
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


@in_process
def test_decode_writes_into_out_and_ignores_other_slots():
    q, k_buf, v_buf, r2t, rows, lens, scale = make_decode([9, 30], 2, 2, 64, torch.float32)
    before = decode_attention_ref(q, k_buf, v_buf, r2t, rows, lens, scale)
    used = r2t[rows].flatten().unique()
    unused = torch.ones(k_buf.shape[0], dtype=torch.bool, device=DEVICE)
    unused[used] = False
    k_buf[unused] = float("nan")
    out = torch.empty_like(q)
    result = decode_attention(q, k_buf, v_buf, r2t, rows, lens, scale, 2, out=out)
    assert result is out
    torch.testing.assert_close(out, before, atol=1e-4, rtol=1e-4)


def test_num_kv_splits_grows_with_length_and_shrinks_with_batch():
    assert choose_num_kv_splits(1, 8, 1) == 1
    assert choose_num_kv_splits(1, 8, 4096, num_sms=132) == MAX_KV_SPLITS
    assert choose_num_kv_splits(64, 8, 4096, num_sms=132) <= 2
    assert choose_num_kv_splits(4, 8, 600, num_sms=132) == 3


@pytest.mark.skipif(IN_PROCESS, reason="kernels ran in this process")
def test_decode_in_fresh_interpreter():
    proc = run_in_fresh_interpreter(__file__)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_matches_ref_at_real_shapes_gpu(dtype):
    lens = [4096, 1, 777, 2048, 130, 3000, 64, 1500]
    args = make_decode(lens, 8, 4, 128, dtype)
    splits = choose_num_kv_splits(len(lens), 8, max(lens))
    out = decode_attention(*args, num_kv_splits=splits)
    ref = decode_attention_ref(*args)
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])
