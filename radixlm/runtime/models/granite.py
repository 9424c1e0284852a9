"""Granite 3: the Llama block with four multipliers (ModelConfig): embeddings times
``embedding_multiplier``, each residual branch times ``residual_multiplier``, attention scores
times ``attention_multiplier`` (in place of ``head_dim ** -0.5``), logits divided by
``logits_scaling``; all applied by the shared decoder."""

from __future__ import annotations

from radixlm.runtime.models.llama import LlamaForCausalLM
from radixlm.runtime.models.registry import register_model


@register_model("GraniteForCausalLM")
class GraniteForCausalLM(LlamaForCausalLM):
    aot_ready = False
