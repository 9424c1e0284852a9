"""Phi-3 and Phi-4 (mini): the Llama block with its checkpoint's q/k/v and gate/up already
fused, partial rotary (Phi-4-mini) and LongRoPE scaling (``layers.rope_inv_freq``)."""

from __future__ import annotations

from radixlm.runtime.models.llama import LlamaForCausalLM
from radixlm.runtime.models.registry import register_model


@register_model("Phi3ForCausalLM")
class Phi3ForCausalLM(LlamaForCausalLM):
    aot_ready = False
    stacked = {}  # NOTE: ``qkv_proj`` and ``gate_up_proj`` are the checkpoint's own tensors
