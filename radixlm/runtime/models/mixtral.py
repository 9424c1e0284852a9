"""Mixtral: the Mistral block (sliding window where the config sets one) with 8 experts, top 2,
their weights always renormalised; its checkpoint names the experts' projections w1/w3/w2
under ``block_sparse_moe``."""

from __future__ import annotations

from radixlm.runtime.models.llama import LlamaForCausalLM
from radixlm.runtime.models.registry import register_model


@register_model("MixtralForCausalLM")
class MixtralForCausalLM(LlamaForCausalLM):
    aot_ready = False
    renames = (
        ("block_sparse_moe.", "mlp."),
        (".w1.", ".gate_proj."),
        (".w3.", ".up_proj."),
        (".w2.", ".down_proj."),
    )
