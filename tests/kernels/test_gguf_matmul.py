"""The GGUF block kernels (kernels/gguf_matmul.cpp) against ``gguf.quants``' own decoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixlm.kernels import cpu_ops

pytestmark = pytest.mark.skipif(not cpu_ops.load(), reason="the C++ kernels could not be built")

# offsets of each block's float16 fields (scales, minimums): the rest is codes, any byte valid
HALVES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
          "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}  # fmt: skip
# types without a kernel (decoded at load), for the loader's tests
OTHER_HALVES = {"Q2_K": [80, 82]}


def random_blocks(kind: str, rows: int, cols: int, std: float = 0.05, seed: int = 0) -> np.ndarray:
    """``[rows, row bytes]`` of random ``kind`` blocks whose weights have about ``std``
    (every float16 field scaled by one factor, so weights scale linearly)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    halves = {**HALVES, **OTHER_HALVES}[kind]
    scales = rng.uniform(0.5, 1.0, size=(len(halves), rows, cols // block))
    for field, offset in enumerate(halves):
        raw[..., offset : offset + 2] = scales[field, ..., None].astype(np.float16).view(np.uint8)
    weights = dequantize(raw.reshape(rows, -1), GGMLQuantizationType[kind])
    factor = std / float(weights.std())
    for field, offset in enumerate(halves):
        scaled = (scales[field, ..., None] * factor).astype(np.float16)
        raw[..., offset : offset + 2] = scaled.view(np.uint8)
    return raw.reshape(rows, -1)


def reference(raw: np.ndarray, kind: str) -> torch.Tensor:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    return torch.from_numpy(dequantize(raw, GGMLQuantizationType[kind]).astype(np.float32))


def kind_id(kind: str) -> int:
    from gguf.constants import GGMLQuantizationType

    return GGMLQuantizationType[kind].value


@pytest.mark.parametrize("kind", list(HALVES))
def test_decoding_is_gguf_s_to_the_bit(kind):
    raw = random_blocks(kind, 24, 512)
    got = torch.ops.radixlm_cpu.gguf_dequantize(
        torch.from_numpy(raw), kind_id(kind), 512, torch.float32
    )
    assert torch.equal(got, reference(raw, kind))
    half = torch.ops.radixlm_cpu.gguf_dequantize(
        torch.from_numpy(raw), kind_id(kind), 512, torch.bfloat16
    )
    assert torch.equal(half, reference(raw, kind).bfloat16())


@pytest.mark.parametrize("kind", list(HALVES))
@pytest.mark.parametrize("rows", [9, 70])
def test_many_rows_are_x_times_the_decoded_weight(kind, rows):
    raw = random_blocks(kind, 48, 768, seed=rows)
    x = torch.randn(rows, 768)
    got = torch.ops.radixlm_cpu.gguf_matmul(x, torch.from_numpy(raw), kind_id(kind))
    # NOTE: float32 sums of 768 products in another order
    torch.testing.assert_close(got, x @ reference(raw, kind).t(), atol=1e-4, rtol=1e-4)
    bf16 = torch.ops.radixlm_cpu.gguf_matmul(x.bfloat16(), torch.from_numpy(raw), kind_id(kind))
    assert bf16.dtype == torch.bfloat16
    # NOTE: the result rounded to bf16 (2^-9 of itself)
    want = x.bfloat16().float() @ reference(raw, kind).t()
    torch.testing.assert_close(bf16.float(), want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("kind", list(HALVES))
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_few_rows_are_the_same_product_as_many(kind, rows):
    """A row's result does not depend on how many rows share its step beyond float32
    rounding: a cached prefix (one new row) and a whole prefill (many) agree, so greedy text
    does not change with the request's shape. (Rounding the activations to int8, as
    llama.cpp does, flips on such rounding and moved logprobs by ~0.1.)"""
    raw = torch.from_numpy(random_blocks(kind, 48, 768, seed=rows))
    x = torch.randn(12, 768)
    many = torch.ops.radixlm_cpu.gguf_matmul(x, raw, kind_id(kind))
    few = torch.ops.radixlm_cpu.gguf_matmul(x[:rows].contiguous(), raw, kind_id(kind))
    torch.testing.assert_close(few, many[:rows], atol=2e-5, rtol=1e-5)
    exact = x[:rows].double() @ reference(raw.numpy(), kind).double().t()
    torch.testing.assert_close(few.double(), exact, atol=2e-5, rtol=1e-5)


def test_no_rows_give_no_rows():
    raw = torch.from_numpy(random_blocks("Q4_1", 8, 256))
    out = torch.ops.radixlm_cpu.gguf_matmul(torch.randn(0, 256), raw, kind_id("Q4_1"))
    assert out.shape == (0, 8)


def test_wrong_row_bytes_and_types_are_refused():
    raw = torch.from_numpy(random_blocks("Q4_K", 4, 256))
    with pytest.raises(RuntimeError, match="do not hold"):
        torch.ops.radixlm_cpu.gguf_matmul(torch.randn(1, 512), raw, kind_id("Q4_K"))
    with pytest.raises(RuntimeError, match="no kernel for ggml type"):
        torch.ops.radixlm_cpu.gguf_matmul(torch.randn(1, 256), raw, kind_id("Q2_K"))
