"""Gemma 1, 2 and 3 (text): embeddings scaled by sqrt(hidden), ``(1 + w)`` RMSNorm computed in
float32, GeGLU MLP (tanh-approximated GELU), queries scaled by ``query_pre_attn_scalar ** -0.5``.

Gemma 2 adds a norm after attention and around the MLP ("sandwich"), sliding-window layers
alternating with full ones, and tanh soft-capping of attention scores and of the final
logits. Gemma 3 drops the score cap for per-head q/k norms and gives its sliding layers their
own RoPE base (``rope_local_base_freq``) without the global layers' frequency scaling. Windows,
scale and caps are the attention backend's (from ModelConfig); the rest is here.
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.models.layers import Attention, DecoderLayer
from radixlm.runtime.models.llama import LlamaForCausalLM
from radixlm.runtime.models.registry import register_model


@register_model("GemmaForCausalLM")
class GemmaForCausalLM(LlamaForCausalLM):
    aot_ready = False
    unit_offset_norms = True
    norms = "pre"

    def layer(self, config: ModelConfig, i: int) -> nn.Module:
        qk_norm = "head" if config.architecture.startswith("Gemma3") else None
        attn = Attention(config, i, qk_norm=qk_norm, unit_offset=True)
        return DecoderLayer(config, i, attn=attn, norms=self.norms, unit_offset=True)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        # NOTE: the factor rounded to the weights' dtype first, as Gemma's reference does
        return x * torch.tensor(self.config.hidden_size**0.5, dtype=x.dtype)


@register_model("Gemma2ForCausalLM", "Gemma3ForCausalLM")
class Gemma2ForCausalLM(GemmaForCausalLM):
    norms = "sandwich"
