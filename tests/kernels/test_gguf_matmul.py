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


def int8_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the few-rows path sees it: per 32 values, int8 codes of ``max |x| / 127``."""
    blocks = x.reshape(x.shape[0], -1, 32)
    scale = blocks.abs().amax(-1, keepdim=True) / 127
    return (torch.round(blocks / scale.clamp(min=1e-30)) * scale).reshape(x.shape)


@pytest.mark.parametrize("kind", list(HALVES))
@pytest.mark.parametrize("rows", [9, 70])
def test_many_rows_are_x_times_the_decoded_weight(kind, rows):
    raw = random_blocks(kind, 48, 768, seed=rows)
    x = torch.randn(rows, 768)
    got = torch.ops.radixlm_cpu.gguf_matmul(x, torch.from_numpy(raw), kind_id(kind))
    # NOTE: the same int8-rounded rows as the few-rows path (a row's result does not depend on
    # its step's row count); float32 sums of 768 products in another order
    torch.testing.assert_close(got, int8_rows(x) @ reference(raw, kind).t(), atol=1e-4, rtol=1e-4)
    few = torch.ops.radixlm_cpu.gguf_matmul(
        x[:3].contiguous(), torch.from_numpy(raw), kind_id(kind)
    )
    torch.testing.assert_close(got[:3], few, atol=1e-4, rtol=1e-4)
    bf16 = torch.ops.radixlm_cpu.gguf_matmul(x.bfloat16(), torch.from_numpy(raw), kind_id(kind))
    assert bf16.dtype == torch.bfloat16
    # NOTE: bf16 rows rounded to int8 in turn; the result rounded to bf16 (2^-9 of itself)
    want = int8_rows(x.bfloat16().float()) @ reference(raw, kind).t()
    torch.testing.assert_close(bf16.float(), want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("kind", list(HALVES))
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_few_rows_quantize_the_activations_as_llama_cpp_does(kind, rows):
    raw = random_blocks(kind, 48, 768, seed=rows)
    x = torch.randn(rows, 768)
    weight = reference(raw, kind)
    got = torch.ops.radixlm_cpu.gguf_matmul(x, torch.from_numpy(raw), kind_id(kind))
    # NOTE: exactly the int8 rows times the weight, in float32 sums of another order
    torch.testing.assert_close(got, int8_rows(x) @ weight.t(), atol=1e-4, rtol=1e-4)
    # NOTE: so each activation is off by at most 1/254 of its 32-block's largest (~2.5 sigma
    # here): a dot of 768 is off by ~0.3% of its spread, and ~1% at most of the largest of 48
    # outputs (what llama.cpp's dots carry); 3% leaves room, a wrong code or scale does not
    exact = x @ weight.t()
    assert (got - exact).abs().max() < 0.03 * exact.abs().max()


def test_wrong_row_bytes_and_types_are_refused():
    raw = torch.from_numpy(random_blocks("Q4_K", 4, 256))
    with pytest.raises(RuntimeError, match="do not hold"):
        torch.ops.radixlm_cpu.gguf_matmul(torch.randn(1, 512), raw, kind_id("Q4_K"))
    with pytest.raises(RuntimeError, match="no kernel for ggml type"):
        torch.ops.radixlm_cpu.gguf_matmul(torch.randn(1, 256), raw, kind_id("Q2_K"))
