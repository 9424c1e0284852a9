"""The triton attention backend agrees with the torch backend through the AttentionBackend API."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: must precede the first triton import

import pytest

from radixlm.kernels.interpret import interpreter_active, run_in_fresh_interpreter
from radixlm.runtime.executor.attention.base import create_attention_backend
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.mem_cache.memory_pool import KVPool, ReqToTokenPool, SlotAllocator

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
IN_PROCESS = DEVICE.type == "cuda" or interpreter_active()
in_process = pytest.mark.skipif(
    not IN_PROCESS, reason="triton was imported without the interpreter"
)
NUM_LAYERS = 2


def make_batch(prefixes: list[int], extends: list[int], pool: KVPool, gen: torch.Generator):
    """Requests whose prefixes sit in the pool (random k/v per layer) and a batch extending them."""
    table = ReqToTokenPool(8, max(p + e for p, e in zip(prefixes, extends)) + 4, DEVICE)
    alloc = SlotAllocator(pool.size)
    rows, new_slots = [], []
    for p, e in zip(prefixes, extends):
        row, slots = table.alloc(), alloc.alloc(p + e).to(DEVICE)
        table.table[row, : p + e] = slots
        for layer in range(NUM_LAYERS):
            kv_shape = (p, *pool.k[layer].shape[1:])
            pool.k[layer][slots[:p]] = torch.randn(kv_shape, generator=gen).to(DEVICE, pool.dtype)
            pool.v[layer][slots[:p]] = torch.randn(kv_shape, generator=gen).to(DEVICE, pool.dtype)
        rows.append(row)
        new_slots.append(slots[p:])
    num_tokens = sum(extends)
    return ForwardBatch.build(
        input_ids=[0] * num_tokens, prefix_lens=prefixes, extend_lens=extends, req_slots=rows,
        out_cache_loc=torch.cat(new_slots), logits_indices=list(range(num_tokens)),
        req_to_token=table.table,
    )  # fmt: skip


def qkv(num_tokens: int, heads: int, kv_heads: int, head_dim: int, dtype, gen):
    """q, k, v as strided views of one fused projection, like a model's qkv split."""
    fused = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    fused = fused.to(DEVICE, dtype)
    q, k, v = fused.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return (q.view(num_tokens, heads, head_dim), k.view(num_tokens, kv_heads, head_dim),
            v.view(num_tokens, kv_heads, head_dim))  # fmt: skip


CASES = [
    # prefixes, extends, heads, kv_heads, head_dim, dtype
    ([0, 0], [5, 17], 6, 2, 80, torch.float32),
    ([30, 0, 12, 3], [1, 9, 1, 25], 4, 1, 64, torch.float32),
    ([30, 5, 60], [1, 1, 1], 6, 2, 80, torch.float32),
    ([20, 0, 7], [1, 12, 1], 4, 1, 64, torch.bfloat16),
    ([20, 45], [1, 1], 4, 1, 64, torch.bfloat16),
]


@in_process
@pytest.mark.parametrize("prefixes,extends,heads,kv_heads,head_dim,dtype", CASES)
def test_triton_backend_matches_torch_backend(prefixes, extends, heads, kv_heads, head_dim, dtype):
    gen = torch.Generator().manual_seed(sum(prefixes) + len(extends))
    pool = KVPool(256, NUM_LAYERS, kv_heads, head_dim, dtype, DEVICE)
    batch = make_batch(prefixes, extends, pool, gen)
    kwargs = {"kv_pool": pool, "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim}
    triton_be = create_attention_backend("triton", **kwargs)
    torch_be = create_attention_backend("torch", **kwargs)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for layer in range(NUM_LAYERS):
        q, k, v = qkv(batch.input_ids.numel(), heads, kv_heads, head_dim, dtype, gen)
        torch_be.prepare(batch)
        want = torch_be.forward(q, k, v, layer, batch)
        triton_be.prepare(batch)
        assert batch.attn_meta.is_decode == batch.is_decode
        got = triton_be.forward(q, k, v, layer, batch)
        assert got.shape == q.shape and got.dtype == q.dtype
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
        torch.testing.assert_close(pool.k[layer][batch.out_cache_loc], k.to(pool.dtype))


def test_triton_backend_rejects_heads_not_multiple_of_kv_heads():
    pool = KVPool(8, 1, 3, 64, torch.float32, DEVICE)
    with pytest.raises(ValueError, match="multiple"):
        create_attention_backend("triton", kv_pool=pool, num_heads=4, num_kv_heads=3, head_dim=64)


@pytest.mark.skipif(IN_PROCESS, reason="kernels ran in this process")
def test_triton_backend_in_fresh_interpreter():
    proc = run_in_fresh_interpreter(__file__)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
