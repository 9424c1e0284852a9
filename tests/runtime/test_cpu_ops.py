"""The C++ CPU kernels: the compiled steps' attention against a per-token softmax in float64:
vector paths (head sizes 16-128, query heads per KV head 1-8) and the plain C++ one, decode and
multi-token grids, float32 and bf16, the log-sum-exp the cascade merges with; argmax as torch's;
RMSNorm as torch's."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import cpu_ops
from radixlm.runtime.executor.decode_step import grid

POOL = 600


def reference(q, k_buf, v_buf, kv_index, extend_lens, positions, scale):
    outs, lses, t = [], [], 0
    group = q.shape[1] // k_buf.shape[1]
    for r, n in enumerate(extend_lens):
        for _ in range(n):
            slots = kv_index[r, : positions[t] + 1]
            k = k_buf[slots].double().repeat_interleave(group, 1)  # [L, H, D]
            v = v_buf[slots].double().repeat_interleave(group, 1)
            s = torch.einsum("hd,lhd->hl", q[t].double(), k) * scale
            outs.append(torch.einsum("hl,lhd->hd", s.softmax(-1), v))
            lses.append(s.logsumexp(-1))
            t += 1
    return torch.stack(outs), torch.stack(lses)


@pytest.fixture(scope="module")
def kernel():
    assert cpu_ops.load(), "the kernel must build here (inductor needs the same compiler)"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "heads, kv_heads, dim", [(9, 3, 64), (4, 2, 16), (8, 8, 32), (16, 2, 128), (6, 2, 24)]
)
@pytest.mark.parametrize("extend_lens", [[1, 1, 1, 1], [3, 1, 2], [1]])
def test_kernel_matches_a_per_token_softmax(kernel, dtype, heads, kv_heads, dim, extend_lens):
    gen = torch.Generator().manual_seed(heads * dim + len(extend_lens))
    k_buf = torch.randn(POOL, kv_heads, dim, generator=gen).to(dtype)
    v_buf = torch.randn(POOL, kv_heads, dim, generator=gen).to(dtype)
    tokens = sum(extend_lens)
    q = (torch.randn(tokens, heads, dim, generator=gen) * 2).to(dtype)
    # NOTE: lengths across a 16-slot block edge; slots scattered over the pool
    lengths = [37, 16, 5, 80][: len(extend_lens)]
    kv_index = torch.randperm(POOL - 1, generator=gen)[: len(extend_lens) * 80].view(-1, 80) + 1
    kv_index = kv_index[:, : max(lengths)].contiguous()
    positions = [p for n, length in zip(extend_lens, lengths) for p in range(length - n, length)]
    token_slot, key_mask = grid(torch.tensor(extend_lens), torch.tensor(positions), max(lengths))
    scale = dim**-0.5
    out, lse = cpu_ops.decode_attention(
        q, k_buf, v_buf, kv_index, token_slot, key_mask, scale
    )
    expect, expect_lse = reference(q, k_buf, v_buf, kv_index, extend_lens, positions, scale)
    assert out.dtype == lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), expect, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse.double(), expect_lse, atol=2e-5, rtol=1e-5)


def test_a_request_with_nothing_to_attend_to_gets_zero_weight(kernel):
    """A cascade's request whose every slot is shared: output 0, log-sum-exp -inf."""
    k_buf = torch.randn(8, 1, 16)
    q = torch.randn(2, 2, 16)
    kv_index = torch.tensor([[1, 2], [3, 4]])
    key_mask = torch.tensor([[[True, False]], [[False, False]]])
    out, lse = cpu_ops.decode_attention(
        q, k_buf, k_buf, kv_index, torch.arange(2), key_mask, 0.25
    )
    assert torch.equal(out[1], torch.zeros(2, 16)) and torch.isinf(lse[1]).all()
    torch.testing.assert_close(out[0], k_buf[1].expand(2, 16))


def test_bad_shapes_are_refused(kernel):
    q = torch.randn(1, 4, 16)
    with pytest.raises(RuntimeError, match="heads and head size"):
        cpu_ops.decode_attention(
            q, torch.randn(8, 3, 16), torch.randn(8, 3, 16), torch.zeros(1, 2, dtype=torch.long),
            torch.zeros(1, dtype=torch.long), torch.ones(1, 1, 2, dtype=torch.bool), 1.0,
        )  # fmt: skip


@pytest.mark.parametrize("vocab", [49152, 1000, 37, 5])
def test_argmax_matches_torch(kernel, vocab):
    """Ties (the first index wins), rows of -inf, NaN (counts as largest), every tail length."""
    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(12, vocab, generator=gen)
    x[1, [vocab // 3, vocab // 2, vocab - 1]] = 50.0  # a tie: the first wins
    x[2] = float("-inf")
    x[3, vocab // 2] = float("nan")
    x[4, -1] = float("nan")
    x[5, [0, vocab - 1]] = float("nan")
    x[6, -1] = 60.0  # the largest in the tail
    x[7] = 1.0  # all equal
    x[8, 0] = 70.0
    assert torch.equal(cpu_ops.argmax(x), x.argmax(-1))
    assert torch.equal(cpu_ops.argmax(x[:, 1:]), x[:, 1:].argmax(-1))  # NOTE: a strided view


@pytest.mark.parametrize("shape", [(1, 576), (7, 64), (3, 5, 40), (2, 17)])
def test_rms_norm_is_torchs_in_one_op(kernel, shape):
    """Float32 inside, rounded once, as ``F.rms_norm`` on bf16: at most one bf16 step apart
    (the sum of squares is added in another order), against a float64 reference as close."""
    gen = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(*shape, generator=gen) * 3).bfloat16()
    weight = (torch.rand(shape[-1], generator=gen) + 0.5).bfloat16()
    got = cpu_ops.rms_norm(x, weight, 1e-5)
    want = torch.nn.functional.rms_norm(x, shape[-1:], weight, 1e-5)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    exact = x.double() * (x.double().pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt() * weight
    ulp = exact.abs() * 2**-7
    assert ((got.double() - exact).abs() <= ulp).all()
    assert ((got.double() - want.double()).abs() <= ulp).all()
    assert (got == want).float().mean() > 0.95


@pytest.mark.parametrize("shape", [(1, 576), (7, 64), (3, 5, 40)])
def test_rms_norm_in_float32_is_torchs_to_rounding(kernel, shape):
    """Float32 rows (the eager steps of a model run in float32): torch's values to a few ulps;
    a weight of another dtype is refused."""
    gen = torch.Generator().manual_seed(shape[-1])
    x = torch.randn(*shape, generator=gen) * 3
    weight = torch.rand(shape[-1], generator=gen) + 0.5
    got = cpu_ops.rms_norm(x, weight, 1e-6)
    assert got.dtype == torch.float32 and got.shape == x.shape
    want = torch.nn.functional.rms_norm(x, shape[-1:], weight, 1e-6)
    torch.testing.assert_close(got, want, rtol=4e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="the same"):
        cpu_ops.rms_norm(x, weight.bfloat16(), 1e-6)
