"""The torch attention backend against a plain per-request softmax, with and without a shared
prefix (cascade path), and a long single-request extend (SDPA path, causal or with a prefix)."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import cpu_ops
from radixlm.runtime.executor.attention import torch_backend
from radixlm.runtime.executor.attention.base import create_attention_backend
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.mem_cache.memory_pool import KVPool, ReqToTokenPool

HEADS, KV_HEADS, DIM = 6, 2, 16


def reference(q, pool: KVPool, slots_per_req, prefixes, extends, scale, window=0, softcap=None):
    outs, t = [], 0
    for slots, p, e in zip(slots_per_req, prefixes, extends):
        k = pool.k[0][slots].repeat_interleave(HEADS // KV_HEADS, 1)  # [L, H, D]
        v = pool.v[0][slots].repeat_interleave(HEADS // KV_HEADS, 1)
        for i in range(e):
            pos = p + i
            lo = max(0, pos - window + 1) if window else 0
            s = torch.einsum("hd,lhd->hl", q[t], k[lo : pos + 1]) * scale
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            outs.append(torch.einsum("hl,lhd->hd", s.softmax(-1), v[lo : pos + 1]))
            t += 1
    return torch.stack(outs)


def attend(shared, extends, own_base, dtype=torch.float32, dim=DIM, window=0, softcap=None):
    """A batch of ``extends`` new tokens per request after ``own_base + 3 r`` own cached slots
    and ``shared`` slots common to all -> (the backend's output, the reference, its groups)."""
    gen = torch.Generator().manual_seed(0)
    pool = KVPool(512, 1, KV_HEADS, dim, dtype, torch.device("cpu"))
    pool.k[0].copy_(torch.randn(pool.k[0].shape, generator=gen))
    pool.v[0].copy_(torch.randn(pool.v[0].shape, generator=gen))
    table = ReqToTokenPool(8, 256, torch.device("cpu"))
    # NOTE: stale slots past each request's length: a decode group reads its KV padded (masked)
    table.table.random_(1, 513, generator=gen)
    common = torch.randperm(500, generator=gen)[:shared] + 1
    free = iter((torch.randperm(500 - 0, generator=gen) + 1).tolist())
    used = set(common.tolist())
    prefixes, slot_lists, new_slots = [], [], []
    for r, e in enumerate(extends):
        own = own_base + 3 * r
        fresh = []
        while len(fresh) < own + e:
            s = next(free)
            if s not in used:
                used.add(s)
                fresh.append(s)
        slots = torch.cat([common, torch.tensor(fresh)])
        table.table[r, : len(slots)] = slots
        prefixes.append(shared + own)
        slot_lists.append(slots)
        new_slots.append(slots[shared + own :])
    total = sum(extends)
    batch = ForwardBatch.build(
        input_ids=[0] * total, prefix_lens=prefixes, extend_lens=extends,
        req_slots=list(range(len(extends))), out_cache_loc=torch.cat(new_slots),
        logits_indices=list(range(total)), req_to_token=table.table,
    )  # fmt: skip
    backend = create_attention_backend(
        "torch", kv_pool=pool, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=dim,
        windows=[window or None], softcap=softcap,
    )
    q = torch.randn(total, HEADS, dim, generator=gen).to(dtype)
    k = torch.randn(total, KV_HEADS, dim, generator=gen).to(dtype)
    v = torch.randn(total, KV_HEADS, dim, generator=gen).to(dtype)
    backend.prepare(batch)
    out = backend.forward(q, k, v, 0, batch)
    pool32 = KVPool(512, 1, KV_HEADS, dim, torch.float32, torch.device("cpu"))
    pool32.k[0].copy_(pool.k[0])
    pool32.v[0].copy_(pool.v[0])
    expected = reference(
        q.float(), pool32, slot_lists, prefixes, extends, dim**-0.5, window, softcap
    )
    return out, expected, batch.attn_meta[window or None]


@pytest.mark.parametrize("own_base", [5, 0])
@pytest.mark.parametrize("shared", [0, 70])
@pytest.mark.parametrize("extends", [[1, 1, 1, 1], [5, 1, 9, 1], [3, 7], [40], [40, 1]])
def test_matches_reference(shared, extends, own_base, monkeypatch):
    monkeypatch.setattr(torch_backend, "MIN_SHARED_PREFIX", 8)
    monkeypatch.setattr(torch_backend, "SDPA_MIN_EXTEND", 16)
    monkeypatch.setattr(torch_backend, "FLASH_MIN_QUERIES", 12)
    sdpa_calls, flash_calls = [], []
    sdpa, flash = torch_backend.sdpa_attention, torch_backend.flash_attention
    monkeypatch.setattr(
        torch_backend, "sdpa_attention", lambda *a, **k: sdpa_calls.append(a) or sdpa(*a, **k)
    )
    monkeypatch.setattr(
        torch_backend, "flash_attention", lambda *a, **k: flash_calls.append(a) or flash(*a, **k)
    )
    out, expected, groups = attend(shared, extends, own_base)
    if shared:  # NOTE: decode and extend rows form separate groups; cascade needs 2+ requests
        assert all((g.shared is not None) == (g.num_reqs > 1) for g in groups)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert bool(sdpa_calls) == (40 in extends)  # one long extend in its group: the SDPA path
    # NOTE: the shared part of a group of 12+ query rows (padded): the flash kernel
    rows = [len(r) * max(r) for r in ([e for e in extends if e == 1], [e for e in extends if e > 1])
            if len(r) > 1]  # fmt: skip
    assert bool(flash_calls) == bool(shared and any(n >= 12 for n in rows))


@pytest.mark.parametrize("shared", [0, 70])
@pytest.mark.parametrize("extends", [[1, 1, 1, 1], [5, 1, 9, 1], [3, 7], [40], [40, 1]])
def test_bf16_extends_take_the_cpp_flash_kernel(shared, extends, monkeypatch):
    """In bf16, with the CPU kernels loaded, extend groups (own slots and shared part) and
    decode groups' shared parts go through ``cpu_ops.flash_attention``."""
    if not (cpu_ops.load() and cpu_ops.flash_ready(torch.bfloat16, 32)):
        pytest.skip("no AVX-512 BF16 flash kernel on this CPU")
    monkeypatch.setattr(torch_backend, "MIN_SHARED_PREFIX", 8)
    calls = []
    kernel = cpu_ops.flash_attention
    monkeypatch.setattr(
        cpu_ops, "flash_attention", lambda *a, **k: calls.append(a) or kernel(*a, **k)
    )
    out, expected, _ = attend(shared, extends, 5, torch.bfloat16, dim=32)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    # NOTE: a group's shared part needs 2+ requests in it; extend groups: own slots, shared
    extending, decoding = sum(e > 1 for e in extends), sum(e == 1 for e in extends)
    cascades = bool(shared) * ((extending > 1) + (decoding > 1))
    assert len(calls) == (extending > 0) + cascades


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("extends", [[1, 1, 1, 1], [1], [5, 1, 9, 1], [3, 7]])
def test_decode_groups_take_the_cpp_decode_kernel(extends, dtype, monkeypatch):
    """With the CPU kernels loaded, a decode group sharing no prefix attends through
    ``cpu_ops.decode_attention`` (no gathered copy), to the reference's values; extend groups
    never do."""
    assert cpu_ops.load(), "the kernel must build here"
    calls = []
    kernel = cpu_ops.decode_attention
    monkeypatch.setattr(cpu_ops, "decode_attention", lambda *a: calls.append(a) or kernel(*a))
    out, expected, groups = attend(0, extends, 5, dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)
    assert [g.token_slot is not None for g in groups] == [g.max_extend == 1 for g in groups]
    assert len(calls) == (1 in extends)  # one layer


@pytest.mark.parametrize("window", [1, 6, 30])
@pytest.mark.parametrize("shared", [0, 70])
@pytest.mark.parametrize("extends", [[1, 1, 1, 1], [5, 1, 9, 1], [40], [40, 1]])
def test_sliding_window_matches_reference(shared, extends, window, monkeypatch):
    """A sliding layer sees only each query's last ``window`` keys (itself included), in
    decode and extend groups, with and without a prefix every request shares."""
    monkeypatch.setattr(torch_backend, "MIN_SHARED_PREFIX", 8)
    monkeypatch.setattr(torch_backend, "SDPA_MIN_EXTEND", 16)
    out, expected, groups = attend(shared, extends, 5, window=window)
    longest = max(shared + 5 + 3 * r + e for r, e in enumerate(extends))
    if longest > window:  # NOTE: else no key is out of any window: the full groups serve
        assert all(g.shared is None and g.window == window for g in groups)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [0, 6])
@pytest.mark.parametrize("extends", [[1, 1, 1], [5, 1, 9], [40]])
def test_bf16_window_in_the_cpp_kernel(extends, window):
    if not (cpu_ops.load() and cpu_ops.flash_ready(torch.bfloat16, 32)):
        pytest.skip("no AVX-512 BF16 flash kernel on this CPU")
    out, expected, groups = attend(70, extends, 5, torch.bfloat16, dim=32, window=window)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("shared", [0, 70])
@pytest.mark.parametrize("extends", [[1, 1, 1, 1], [5, 1, 9, 1], [40]])
def test_softcapped_scores_match_reference(shared, extends, monkeypatch):
    """Gemma 2's ``cap * tanh(s / cap)`` on every score, the shared part's too."""
    monkeypatch.setattr(torch_backend, "MIN_SHARED_PREFIX", 8)
    out, expected, _ = attend(shared, extends, 5, softcap=0.5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shared", [0, 70])
def test_ragged_extends_split_by_length_match_reference(shared, monkeypatch):
    monkeypatch.setattr(torch_backend, "MIN_SPLIT_WASTE", 0)
    monkeypatch.setattr(torch_backend, "MIN_SHARED_PREFIX", 8)
    extends = [2, 60, 3, 45, 1, 4]
    out, expected, groups = attend(shared, extends, 0)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # NOTE: the decode row alone, the two long prompts together, the three short ones together
    assert sorted(g.num_reqs for g in groups) == [1, 2, 3]


def test_similar_lengths_bounds_the_padding():
    ext = [3, 305, 11, 163, 9, 159, 4, 136, 26, 26]
    groups = torch_backend.similar_lengths(list(range(len(ext))), ext, ext)
    assert sorted(i for g in groups for i in g) == list(range(len(ext)))
    for g in groups:
        real = sum(ext[i] ** 2 for i in g)
        padded = len(g) * max(ext[i] for i in g) ** 2
        assert padded - real <= max(real, torch_backend.MIN_SPLIT_WASTE)
    assert len(groups) > 1
    assert torch_backend.similar_lengths([0, 1], [40, 41], [40, 41]) == [[0, 1]]
