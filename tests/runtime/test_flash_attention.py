"""The C++ flash kernel for CPU prefill (``cpu_ops.flash_attention``) against a float64 softmax
per sequence: the AVX-512 BF16 path (head sizes 32, 64, 128; 1-4 query heads per KV head) and
the plain C++ one (float32, other head sizes), causal or not, several sequences of any length
(empty ones too) over scattered pool slots, and the log-sum-exp the cascade merges with."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import cpu_ops

POOL = 3000


@pytest.fixture(scope="module")
def kernel():
    assert cpu_ops.load(), "the kernel must build here (inductor needs the same compiler)"


def reference(q, k_buf, v_buf, slots, q_lens, kv_lens, causal, scale):
    """Each sequence's rows as a float64 softmax over its slots (causal: the last query at the
    last slot)."""
    outs, lses, t, s = [], [], 0, 0
    group = q.shape[1] // k_buf.shape[1]
    for m, n in zip(q_lens, kv_lens):
        k = k_buf[slots[s : s + n]].double().repeat_interleave(group, 1)  # [L, H, D]
        v = v_buf[slots[s : s + n]].double().repeat_interleave(group, 1)
        scores = torch.einsum("mhd,lhd->hml", q[t : t + m].double(), k) * scale
        if causal:
            last = n - m + torch.arange(m)[:, None]
            scores = scores.masked_fill(torch.arange(n)[None, :] > last, float("-inf"))
        lses.append(scores.logsumexp(-1).T)
        outs.append(torch.einsum("hml,lhd->mhd", scores.softmax(-1).nan_to_num(0.0), v))
        t, s = t + m, s + n
    return torch.cat(outs), torch.cat(lses)


def run_case(q_lens, kv_lens, heads, kv_heads, dim, dtype, causal, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k_buf = torch.randn(POOL, kv_heads, dim, generator=gen).to(dtype)
    v_buf = torch.randn(POOL, kv_heads, dim, generator=gen).to(dtype)
    q = torch.randn(sum(q_lens), heads, dim, generator=gen).to(dtype)
    slots = torch.randperm(POOL, generator=gen)[: sum(kv_lens)]
    q_starts = torch.tensor([0, *q_lens]).cumsum(0)
    kv_starts = torch.tensor([0, *kv_lens]).cumsum(0)
    scale = dim**-0.5
    out, lse = cpu_ops.flash_attention(q, k_buf, v_buf, slots, q_starts, kv_starts, causal, scale)
    expect, expect_lse = reference(q, k_buf, v_buf, slots, q_lens, kv_lens, causal, scale)
    return out, lse, expect, expect_lse


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "heads, kv_heads, dim", [(9, 3, 64), (8, 2, 128), (4, 4, 32), (6, 2, 48)]
)
@pytest.mark.parametrize(
    "q_lens, kv_lens",
    [([790], [790]), ([37], [300]), ([12, 1, 100, 7], [20, 9, 100, 300]), ([64, 65], [64, 65])],
)
def test_matches_a_softmax_per_sequence(kernel, causal, heads, kv_heads, dim, q_lens, kv_lens):
    out, lse, expect, expect_lse = run_case(
        q_lens, kv_lens, heads, kv_heads, dim, torch.bfloat16, causal
    )
    assert out.dtype == lse.dtype == torch.float32 and out.shape == expect.shape
    # NOTE: the vector path rounds the probabilities to bf16 before the values (torch's flash
    # kernel does too); the plain one keeps them in float32
    vector = torch.ops.radixlm_cpu.flash_vectorized(dim)
    atol = 6e-3 if vector else 2e-5
    torch.testing.assert_close(out.double(), expect, atol=atol, rtol=1e-2 if vector else 1e-4)
    torch.testing.assert_close(lse.double(), expect_lse, atol=2e-5, rtol=1e-5)


def test_float32_takes_the_plain_loop(kernel):
    out, lse, expect, expect_lse = run_case([5, 30], [40, 30], 6, 2, 64, torch.float32, True)
    torch.testing.assert_close(out.double(), expect, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse.double(), expect_lse, atol=2e-5, rtol=1e-5)


def test_empty_sequences_and_rows_with_no_key(kernel):
    """A sequence with no query, one with no slot (zero output, log-sum-exp -inf), and causal
    queries before the first slot (more queries than slots) see nothing."""
    out, lse, expect, expect_lse = run_case([3, 0, 4, 6], [10, 5, 0, 2], 9, 3, 64, torch.bfloat16,
                                            True)  # fmt: skip
    assert torch.equal(out[3:11], torch.zeros_like(out[3:11]))
    assert torch.isneginf(lse[3:11]).all() and torch.isfinite(lse[11:]).all()
    torch.testing.assert_close(out.double(), expect, atol=6e-3, rtol=1e-2)


def test_a_row_does_not_depend_on_its_batch(kernel):
    """A token's row is the same bits alone (a question after a cached prefix) as inside a
    longer prefill (the whole prompt): the radix cache does not change a greedy answer."""
    gen = torch.Generator().manual_seed(3)
    k_buf = torch.randn(POOL, 3, 64, generator=gen).bfloat16()
    v_buf = torch.randn(POOL, 3, 64, generator=gen).bfloat16()
    q = torch.randn(300, 9, 64, generator=gen).bfloat16()
    slots = torch.randperm(POOL, generator=gen)[:300]
    whole, whole_lse = cpu_ops.flash_attention(q, k_buf, v_buf, slots, causal=True, scale=0.125)
    for last in (0, 63, 64, 200, 299):
        alone, alone_lse = cpu_ops.flash_attention(
            q[last : last + 1], k_buf, v_buf, slots[: last + 1], causal=True, scale=0.125
        )
        assert torch.equal(alone[0], whole[last]) and torch.equal(alone_lse[0], whole_lse[last])


def test_bad_arguments_are_refused(kernel):
    q = torch.zeros(4, 9, 64, dtype=torch.bfloat16)
    k = torch.zeros(10, 3, 64, dtype=torch.bfloat16)
    slots = torch.arange(6)
    with pytest.raises(RuntimeError, match="span"):
        cpu_ops.flash_attention(q, k, k, slots, torch.tensor([0, 3]), torch.tensor([0, 6]))
    with pytest.raises(RuntimeError, match="ascend"):
        cpu_ops.flash_attention(q, k, k, slots, torch.tensor([0, 5, 4]), torch.tensor([0, 2, 6]))
    with pytest.raises(RuntimeError, match="heads"):
        cpu_ops.flash_attention(q[:, :8], k, k, slots)
    with pytest.raises(RuntimeError, match="one dtype"):
        cpu_ops.flash_attention(q.float(), k, k, slots)
    with pytest.raises(RuntimeError, match="in the pool"):
        cpu_ops.flash_attention(q, k, k, torch.tensor([0, 10]))
    with pytest.raises(RuntimeError, match="together"):
        cpu_ops.flash_attention(q, k, k, slots, torch.tensor([0, 4]))
