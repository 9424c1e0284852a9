"""GGUF's 32-weight block formats dequantise in torch to exactly what ``gguf.quants`` gives."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from radixlm.runtime.loader.gguf_loader import _dequantize


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_block_formats_dequantize_as_gguf_does(kind):
    qtype = GGMLQuantizationType[kind]
    weights = np.random.default_rng(0).standard_normal((48, 96)).astype(np.float32)
    data = quantize(weights, qtype)
    tensor = SimpleNamespace(data=data, tensor_type=qtype)
    expected = torch.from_numpy(dequantize(data, qtype).astype(np.float32))
    got = _dequantize(tensor).reshape(expected.shape)
    assert torch.equal(got, expected)
    assert (got - torch.from_numpy(weights)).abs().max() < 0.5  # NOTE: and it is the weights
