"""Qwen2 / Qwen2.5 (q/k/v bias) and Qwen3 (q/k RMSNorm): the Llama block with config switches."""

from __future__ import annotations

from radixlm.runtime.models.llama import LlamaForCausalLM
from radixlm.runtime.models.registry import register_model


@register_model("Qwen2ForCausalLM")
class Qwen2ForCausalLM(LlamaForCausalLM):
    """``ModelConfig.attention_bias`` turns on the q/k/v biases."""


@register_model("Qwen3ForCausalLM")
class Qwen3ForCausalLM(LlamaForCausalLM):
    """``ModelConfig.qk_norm`` adds per-head RMSNorm on q and k before rotary."""
