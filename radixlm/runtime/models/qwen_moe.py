"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B) and Qwen3-MoE: the Qwen2 / Qwen3 blocks with sparse
MLPs. Qwen2-MoE adds a shared expert every token goes through, scaled by a sigmoid gate, and
may keep some layers dense (``mlp_only_layers``, ``decoder_sparse_step``); whether the top-k
weights are renormalised is the config's ``norm_topk_prob``."""

from __future__ import annotations

from radixlm.runtime.models.llama import LlamaForCausalLM
from radixlm.runtime.models.registry import register_model


@register_model("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
class QwenMoeForCausalLM(LlamaForCausalLM):
    aot_ready = False
