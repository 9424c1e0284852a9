"""SmolLM3: the Llama block, but every fourth layer (``no_rope_layers[i] == 0``) applies no
rotary embedding (NoPE); ``Attention.rope`` reads it from ModelConfig.rope_layers."""

from __future__ import annotations

from radixlm.runtime.models.llama import LlamaForCausalLM
from radixlm.runtime.models.registry import register_model


@register_model("SmolLM3ForCausalLM")
class SmolLM3ForCausalLM(LlamaForCausalLM):
    aot_ready = False
