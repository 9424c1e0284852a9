"""Our models against their Hugging Face twins on the same weights, in float32."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.model_runner import ModelRunner

PROMPT = [1, 504, 3458, 282, 4649, 314, 7042, 30, 378, 7042, 314, 253, 1345, 28, 10, 22, 23]


def our_logits(model_path: str, ids: list[int], chunks: int = 1, **kw) -> torch.Tensor:
    """All-position logits, computing the prompt in ``chunks`` pieces over the paged cache."""
    runner = ModelRunner(
        ServerArgs(model_path=model_path, dtype="float32", max_total_tokens=512, **kw)
    )
    slots = torch.randperm(runner.max_total_tokens)[: len(ids)] + 1  # scattered, not contiguous
    runner.req_pool.table[0, : len(ids)] = slots
    out, bounds = [], np.linspace(0, len(ids), chunks + 1).astype(int)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        batch = ForwardBatch.build(
            input_ids=ids[lo:hi],
            prefix_lens=[int(lo)],
            extend_lens=[int(hi - lo)],
            req_slots=[0],
            out_cache_loc=slots[lo:hi],
            logits_indices=list(range(hi - lo)),
            req_to_token=runner.req_pool.table,
        )
        out.append(runner.forward(batch))
    return torch.cat(out)


def hf_logits(model_path: str, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_tiny_models_match_hf_logits(tiny_model_factory, arch):
    path = tiny_model_factory(arch)
    expected = hf_logits(path, PROMPT)
    torch.testing.assert_close(our_logits(path, PROMPT), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(our_logits(path, PROMPT, chunks=3), expected, atol=1e-4, rtol=1e-4)


def test_llama3_rope_scaling_matches_hf(tiny_model_factory):
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8,
    }
    path = tiny_model_factory("LlamaForCausalLM", rope_scaling=scaling)
    torch.testing.assert_close(
        our_logits(path, PROMPT), hf_logits(path, PROMPT), atol=1e-4, rtol=1e-4
    )


def write_gguf(hf_dir: str, out_path: str) -> None:
    """Convert a tiny HF Llama to GGUF the way llama.cpp does (Q/K rows permuted, f32)."""
    import json

    import gguf
    from safetensors.torch import load_file

    with open(os.path.join(hf_dir, "config.json")) as f:
        c = json.load(f)
    w = gguf.GGUFWriter(out_path, "llama")
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_freq_base(c.get("rope_theta") or c["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_vocab_size(c["vocab_size"])
    w.add_eos_token_id(c["eos_token_id"])
    names = {
        "q_proj": "attn_q",
        "k_proj": "attn_k",
        "v_proj": "attn_v",
        "o_proj": "attn_output",
        "gate_proj": "ffn_gate",
        "up_proj": "ffn_up",
        "down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for name, t in load_file(os.path.join(hf_dir, "model.safetensors")).items():
        a = t.float().numpy()
        parts = name.split(".")
        if parts[1] == "layers":
            kind = parts[-2]
            if kind in ("q_proj", "k_proj"):
                heads = c["num_attention_heads"] if kind == "q_proj" else c["num_key_value_heads"]
                a = (
                    a.reshape(heads, 2, a.shape[0] // heads // 2, *a.shape[1:])
                    .swapaxes(1, 2)
                    .reshape(a.shape)
                )
            gname = f"blk.{parts[2]}.{names[kind]}.weight"
        else:
            gname = {
                "model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight",
            }[name]
        w.add_tensor(gname, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_conversion_loads_to_same_logits(tiny_llama, tmp_path):
    path = str(tmp_path / "tiny.gguf")
    write_gguf(tiny_llama, path)
    got = our_logits(path, PROMPT, tokenizer_path=tiny_llama)
    torch.testing.assert_close(got, our_logits(tiny_llama, PROMPT), atol=1e-5, rtol=1e-5)
