"""GGUF files of the families llama.cpp names (gemma, gemma2, gemma3, phi3, qwen2moe, qwen3moe),
written from a tiny HF checkpoint as llama.cpp's converter writes them: tensor names from
``gguf``'s own name map, the experts stacked, Gemma's norms stored as ``1 + w``, its metadata
keys. Loaded, they give the logits of the HF directory."""

from __future__ import annotations

import json
import os
from collections import defaultdict

import numpy as np
import pytest
import torch

from tests.runtime.models.test_model_logits import our_logits

PROMPT = list(range(3, 40))
# NOTE: shapes llama.cpp's fixed rules agree with: Gemma's head is its embedding; Gemma 3's
# GGUF knows no layer types (every sixth layer is global, the local RoPE base is 10000)
FAMILIES = {
    "GemmaForCausalLM": ("GEMMA", dict(tie_word_embeddings=True)),
    "Gemma2ForCausalLM": ("GEMMA2", dict(tie_word_embeddings=True)),
    "Gemma3ForCausalLM": ("GEMMA3", dict(tie_word_embeddings=True,
                                         layer_types=["sliding_attention"] * 2,
                                         rope_local_base_freq=10000.0)),
    "Phi3ForCausalLM": ("PHI3", {}),
    "Qwen2MoeForCausalLM": ("QWEN2MOE", dict(norm_topk_prob=False)),
    "Qwen3MoeForCausalLM": ("QWEN3MOE", {}),
}  # fmt: skip


def write_gguf(hf_dir: str, out_path: str, arch_name: str) -> None:
    import gguf
    from safetensors.torch import load_file

    with open(os.path.join(hf_dir, "config.json")) as f:
        c = json.load(f)
    arch = gguf.MODEL_ARCH[arch_name]
    n = c["num_hidden_layers"]
    names = gguf.get_tensor_name_map(arch, n)
    w = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[arch])
    w.add_block_count(n)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    rope = c.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    w.add_rope_freq_base(c.get("rope_theta") or rope["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_vocab_size(c["vocab_size"])
    w.add_eos_token_id(c["eos_token_id"])
    if c.get("sliding_window"):
        w.add_sliding_window(c["sliding_window"])
    if c.get("attn_logit_softcapping"):
        w.add_attn_logit_softcapping(c["attn_logit_softcapping"])
        w.add_final_logit_softcapping(c["final_logit_softcapping"])
    if c.get("num_experts") or c.get("num_local_experts"):
        w.add_expert_count(c.get("num_experts") or c["num_local_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        if c.get("shared_expert_intermediate_size"):
            w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    experts: dict[str, dict[int, np.ndarray]] = defaultdict(dict)
    for name, t in load_file(os.path.join(hf_dir, "model.safetensors")).items():
        a = t.float().numpy()
        if arch_name.startswith("GEMMA") and name.endswith("norm.weight"):
            a = a + 1  # NOTE: llama.cpp's Gemma converter
        parts = name.split(".")
        if "experts" in parts:  # NOTE: model.layers.L.mlp.experts.E.proj.weight
            i = parts.index("experts")
            merged = ".".join(parts[: i + 1] + parts[i + 2 : -1])
            experts[merged][int(parts[i + 1])] = a
            continue
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")),
                     np.ascontiguousarray(a))  # fmt: skip
    for merged, per_expert in experts.items():
        stacked = np.stack([per_expert[e] for e in sorted(per_expert)])
        w.add_tensor(names.get_name(merged) + ".weight", np.ascontiguousarray(stacked))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_family_gguf_loads_to_the_hf_logits(tiny_model_factory, tmp_path, arch):
    gguf_arch, overrides = FAMILIES[arch]
    hf_dir = tiny_model_factory(arch, **overrides)
    path = str(tmp_path / "tiny.gguf")
    write_gguf(hf_dir, path, gguf_arch)
    got = our_logits(path, PROMPT, tokenizer_path=hf_dir)
    torch.testing.assert_close(got, our_logits(hf_dir, PROMPT), atol=1e-5, rtol=1e-5)


def test_longrope_gguf_is_refused_by_name(tiny_model_factory, tmp_path):
    import gguf

    from radixlm.runtime.loader.gguf_loader import gguf_config, open_gguf

    path = str(tmp_path / "longrope.gguf")
    write_gguf(tiny_model_factory("Phi3ForCausalLM"), path, "PHI3")
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(str(tmp_path / "with-factors.gguf"), "phi3")
    for field in reader.fields.values():
        if field.name.startswith("phi3.") or field.name.startswith("tokenizer."):
            writer.add_key_value(field.name, field.contents(), field.types[0])
    writer.add_tensor("rope_factors_long.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="LongRoPE"):
        gguf_config(open_gguf(str(tmp_path / "with-factors.gguf")))
