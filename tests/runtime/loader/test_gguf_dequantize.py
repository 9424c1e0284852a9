"""GGUF's 32-weight block formats dequantise in torch to exactly what ``gguf.quants`` gives."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from radixlm.runtime.loader.gguf_loader import dequantize as ours


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_block_formats_dequantize_as_gguf_does(kind):
    qtype = GGMLQuantizationType[kind]
    weights = np.random.default_rng(0).standard_normal((48, 96)).astype(np.float32)
    data = quantize(weights, qtype)
    tensor = SimpleNamespace(data=data, tensor_type=qtype)
    expected = torch.from_numpy(dequantize(data, qtype).astype(np.float32))
    got = ours(tensor).reshape(expected.shape)
    assert torch.equal(got, expected)
    assert (got - torch.from_numpy(weights)).abs().max() < 0.5  # NOTE: and it is the weights


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_chunks_in_the_model_dtype_round_as_the_whole_tensor(kind, monkeypatch):
    """Rounding each chunk to bf16 as it is written gives the bits of rounding the float32
    tensor at once (what the model's copy did before)."""
    from radixlm.runtime.loader import gguf_loader

    qtype = GGMLQuantizationType[kind]
    weights = np.random.default_rng(1).standard_normal((40, 96)).astype(np.float32)
    tensor = SimpleNamespace(data=quantize(weights, qtype), tensor_type=qtype)
    whole = ours(tensor).bfloat16()
    monkeypatch.setattr(gguf_loader, "CHUNK_BLOCKS", 7)  # NOTE: 120 blocks, a ragged last chunk
    assert torch.equal(ours(tensor, torch.bfloat16), whole)


def test_released_tensor_pages_read_back_the_same(smollm_path):
    from radixlm.runtime.loader.gguf_file import GGUFFile

    reader = GGUFFile(smollm_path)
    for t in reader.tensors[:3]:
        before = np.array(t.data)
        reader.release(t)
        assert np.array_equal(np.array(t.data), before)  # NOTE: paged in again from the file
