"""The rotary table keeps float32 frequencies whatever dtype the model is cast to."""

from __future__ import annotations

import torch

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.models.layers import RotaryEmbedding


def smollm2_like() -> ModelConfig:
    return ModelConfig(
        architecture="LlamaForCausalLM", hidden_size=576, intermediate_size=1536, num_layers=1,
        num_heads=9, num_kv_heads=3, head_dim=64, vocab_size=100, rms_norm_eps=1e-5,
        rope_theta=100000.0, rope_scaling=None, context_length=8192,
    )  # fmt: skip


def exact_cos_sin(position: int, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    dim = config.head_dim
    inv = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.cat([inv, inv]) * position
    return angles.cos(), angles.sin()


def test_bfloat16_model_keeps_float32_frequencies():
    config = smollm2_like()
    rotary = RotaryEmbedding(config).to(torch.bfloat16)
    assert rotary.inv_freq.dtype == torch.float32
    rotary.build(config.context_length, torch.bfloat16, torch.device("cpu"))
    cos, sin = rotary.cos_sin(torch.tensor([7000]), torch.bfloat16)
    want_cos, want_sin = exact_cos_sin(7000, config)
    # NOTE: only the final bf16 rounding (< 2^-8) remains; frequencies rounded to bf16 first put
    # the angle at position 7000 off by whole radians.
    assert (cos.flatten().double() - want_cos).abs().max() < 8e-3
    assert (sin.flatten().double() - want_sin).abs().max() < 8e-3


def test_table_grows_on_demand_without_build():
    config = smollm2_like()
    rotary = RotaryEmbedding(config)
    cos, _ = rotary.cos_sin(torch.tensor([0, 5000]), torch.float32)
    assert cos.shape == (2, 1, 64)
    want = exact_cos_sin(5000, config)[0]
    torch.testing.assert_close(cos[1, 0].double(), want, atol=2e-3, rtol=0)
