"""OLMo 2 and OLMoE (AllenAI): RMSNorm over the whole projected q and k (not per head).

OLMo 2 normalises each block's *output* ("post" layout: ``x + norm(attn(x))``, then
``x + norm(mlp(x))``); OLMoE keeps the pre-norm block, with 64 experts (top 8, weights not
renormalised) and q/k/v clipped where ``clip_qkv`` is set."""

from __future__ import annotations

from torch import nn

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.models.layers import Attention, DecoderLayer
from radixlm.runtime.models.llama import LlamaForCausalLM
from radixlm.runtime.models.registry import register_model


@register_model("Olmo2ForCausalLM")
class Olmo2ForCausalLM(LlamaForCausalLM):
    aot_ready = False

    def layer(self, config: ModelConfig, i: int) -> nn.Module:
        return DecoderLayer(config, i, attn=Attention(config, i, qk_norm="full"), norms="post")


@register_model("OlmoeForCausalLM")
class OlmoeForCausalLM(LlamaForCausalLM):
    aot_ready = False

    def layer(self, config: ModelConfig, i: int) -> nn.Module:
        attn = Attention(config, i, qk_norm="full")
        return DecoderLayer(config, i, attn=attn, mlp=self.mlp(config, i))
