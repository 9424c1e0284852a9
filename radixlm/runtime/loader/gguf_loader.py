"""GGUF files: config and tokenizer from the metadata, weights dequantised with ``gguf``."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.heap import trim_heap
from radixlm.runtime.loader.gguf_file import GGUFFile
from radixlm.runtime.loader.text_tokenizer import cache_root

if TYPE_CHECKING:
    import torch

# GGUF ``general.architecture`` (llama.cpp's names) -> ours. NOTE: llama.cpp writes Mistral and
# Mixtral as "llama" (a Mixtral's experts say which it is)
_ARCHS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
}

# GGUF tensor name fragment -> Hugging Face name fragment
_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# NOTE: where a family's GGUF names mean something else than Llama's
_ARCH_NAMES = {
    "gemma2": {"ffn_norm": "pre_feedforward_layernorm"},
    "gemma3": {"ffn_norm": "pre_feedforward_layernorm"},
    "phi3": {"ffn_up": "mlp.gate_up_proj"},  # NOTE: gate and up fused, gate first
}
# NOTE: llama.cpp's Gemma converter stores every norm weight as 1 + w (its RMSNorm has no offset)
_UNIT_OFFSET = ("gemma", "gemma2", "gemma3")
# NOTE: Gemma's query scale is 1/sqrt(query_pre_attn_scalar), which GGUF does not carry:
# llama.cpp takes 1/sqrt(head_dim), but hidden/heads for the 27B models (layer counts below)
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


# NOTE: the formats whose codes models/quant.py recovers exactly (one scale [+ min] per 32).
_FOUR_BIT = {"Q4_0", "Q4_1"}
# bytes per block of 32 weights: an f16 scale (Q4_1: and an f16 minimum), then the codes
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
CHUNK_BLOCKS = 1 << 12  # 128K weights: 512 KB in float32
TRIM_BYTES = 8 << 20  # of the file read between two trims of glibc's heaps


def is_four_bit(reader) -> bool:
    """True when most decoder-layer weight matrices are Q4_0 or Q4_1."""
    kinds = [t.tensor_type.name for t in reader.tensors
             if t.name.startswith("blk.") and len(t.shape) == 2]  # fmt: skip
    return bool(kinds) and 2 * sum(k in _FOUR_BIT for k in kinds) > len(kinds)


@functools.lru_cache(maxsize=2)
def open_gguf(path: str) -> GGUFFile:
    """The parsed file (read-only, memory-mapped; metadata arrays decoded on demand). Loading
    reads config, tensor count, weights and quant types from it: parse once."""
    return GGUFFile(path)


def release_gguf() -> None:
    """Drop the parsed files (their memory maps) once a process has what it needs from them:
    the server and detokenizer after start-up, the scheduler after loading; then hand the
    memory freed while loading back to the OS (glibc keeps it otherwise)."""
    open_gguf.cache_clear()
    trim_heap(collect=True)


def _field(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_config(reader) -> ModelConfig:
    """Build a ModelConfig from GGUF metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHS:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {sorted(_ARCHS)}")
    p = arch + "."
    heads = _field(reader, p + "attention.head_count")
    hidden = _field(reader, p + "embedding_length")
    vocab = _field(reader, p + "vocab_size") or reader.fields["tokenizer.ggml.tokens"].count
    names = {t.name for t in reader.tensors}
    head_dim = _field(reader, p + "attention.key_length") or hidden // heads
    layers = _field(reader, p + "block_count")
    if "rope_factors_long.weight" in names:
        raise ValueError(f"{path_of(reader)}: LongRoPE GGUFs (rope_factors_* tensors) are not "
                         "supported; load the Hugging Face directory instead")  # fmt: skip
    fields = _family_fields(reader, arch, layers, hidden, heads, head_dim)
    return ModelConfig(
        architecture=fields.pop("architecture", _ARCHS[arch]),
        hidden_size=hidden,
        intermediate_size=_field(reader, p + "feed_forward_length"),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=_field(reader, p + "attention.head_count_kv") or heads,
        head_dim=head_dim,
        vocab_size=vocab,
        rms_norm_eps=float(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(_field(reader, p + "rope.freq_base", 10000.0)),
        context_length=_field(reader, p + "context_length", 2048),
        tie_word_embeddings="output.weight" not in names,
        qk_norm=arch in ("qwen3", "qwen3moe"),
        eos_token_ids=(_field(reader, "tokenizer.ggml.eos_token_id"),),
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        **fields,
    )


def _family_fields(reader, arch: str, layers: int, hidden: int, heads: int, head_dim: int) -> dict:
    """The ModelConfig fields beyond Llama's, from the family's GGUF keys (llama.cpp's)."""
    p = arch + "."
    out: dict[str, Any] = {"attention_bias": arch in ("qwen2", "qwen2moe")}
    window = _field(reader, p + "attention.sliding_window")
    if arch.startswith("gemma"):
        out["hidden_act"] = "gelu_pytorch_tanh"
        scalar = hidden // heads if layers == _GEMMA_27B_LAYERS.get(arch) else head_dim
        out["attention_scale"] = scalar**-0.5 if arch != "gemma" else None
    if arch == "gemma2":
        out["attn_softcap"] = _field(reader, p + "attn_logit_softcapping")
        out["final_softcap"] = _field(reader, p + "final_logit_softcapping")
        out["layer_windows"] = tuple(window if i % 2 == 0 else None for i in range(layers))
    elif arch == "gemma3":
        out["layer_windows"] = tuple(window if (i + 1) % 6 else None for i in range(layers))
        out["rope_local_theta"] = 10000.0
        if _field(reader, p + "rope.scaling.type") == "linear":
            factor = float(_field(reader, p + "rope.scaling.factor"))
            out["rope_scaling"] = (("factor", factor), ("rope_type", "linear"))
    elif window:
        out["layer_windows"] = (window,) * layers
    rotary = _field(reader, p + "rope.dimension_count")
    if rotary and rotary != head_dim:
        out["rotary_dim"] = rotary
    experts = _field(reader, p + "expert_count") or 0
    if experts:
        out.update(
            num_experts=experts,
            experts_per_tok=_field(reader, p + "expert_used_count"),
            moe_intermediate_size=_field(reader, p + "expert_feed_forward_length")
            or _field(reader, p + "feed_forward_length"),
            shared_expert_intermediate_size=_field(
                reader, p + "expert_shared_feed_forward_length", 0
            ),
            # NOTE: as llama.cpp routes them: Qwen2-MoE's top-k weights as they are
            norm_topk_prob=arch != "qwen2moe",
        )
        if arch == "llama":
            out["architecture"] = "MixtralForCausalLM"
    return out


def path_of(reader) -> str:
    return getattr(reader, "path", "GGUF file")


def arch_of(reader) -> str:
    return _field(reader, "general.architecture")


def hf_name(reader, name: str) -> str:
    """The Hugging Face name of GGUF tensor ``name`` in this file's family."""
    arch = arch_of(reader)
    return _hf_name(name, {**_NAMES, **_ARCH_NAMES.get(arch, {})})


def gguf_weights(
    reader, config: ModelConfig, dtype=None, skip: frozenset[str] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (Hugging Face name, tensor in ``dtype``, default float32), undoing llama.cpp's Q/K
    row permutation; GGUF tensors named in ``skip`` (kept in blocks: models/gguf_quant.py)
    are left out. Each tensor's pages of the file leave this process once it is read."""
    arch = arch_of(reader)
    permute = arch == "llama"
    names = {**_NAMES, **_ARCH_NAMES.get(arch, {})}
    read = 0
    for t in reader.tensors:
        if t.name in skip:
            continue
        tensor = dequantize(t, dtype).reshape([int(d) for d in reversed(t.shape)])
        reader.release(t)
        read += t.data.nbytes
        if read >= TRIM_BYTES:
            # NOTE: the temporaries so far (and bf16 weights a loader's hook replaced) go back
            # to the OS as the load goes (each call walks the heaps: ~15 ms here)
            trim_heap()
            read = 0
        name = _hf_name(t.name, names)
        if permute and name.endswith("q_proj.weight"):
            tensor = unpermute(tensor, config.num_heads)
        elif permute and name.endswith("k_proj.weight"):
            tensor = unpermute(tensor, config.num_kv_heads)
        if arch in _UNIT_OFFSET and name.endswith("norm.weight"):
            tensor = tensor - 1
        if name.endswith("shared_expert_gate.weight") and tensor.dim() == 1:
            tensor = tensor[None]
        if ".experts." in name:  # NOTE: [E, out, in] stacked: one HF tensor per expert
            prefix, proj = name.rsplit(".", 2)[0], name.rsplit(".", 2)[1]
            for e in range(tensor.shape[0]):
                yield f"{prefix}.{e}.{proj}.weight", tensor[e]
            continue
        yield name, tensor


def dequantize(t, dtype=None) -> torch.Tensor:
    """One tensor in ``dtype`` (default float32), to be reshaped by the caller: the 32-weight
    block formats in torch (SmolLM2: 0.74 s against 1.77 s for ``gguf.quants``' numpy, with the
    same float32 arithmetic, so the same values), the others with ``gguf.quants``. Block
    formats go ``CHUNK_BLOCKS`` at a time, each chunk rounded to ``dtype`` as it is written:
    the same bits as rounding the whole float32 tensor, without its float32 temporaries
    (SmolLM2's Q8_0 embedding: ~350 MB of them at once)."""
    import torch  # NOTE: here, not above: the config and tokenizer are read without torch

    kind = t.tensor_type.name
    if kind not in _BLOCK_BYTES:
        from gguf import quants

        try:
            array = quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        except NotImplementedError as e:
            raise ValueError(f"GGUF tensor {t.name!r} has type {kind}, which cannot be "
                             f"loaded ({e})") from None  # fmt: skip
        return torch.from_numpy(np.array(array, copy=True)).to(dtype or torch.float32)
    raw = t.data.reshape(-1, _BLOCK_BYTES[kind])
    out = torch.empty(raw.shape[0], 32, dtype=dtype or torch.float32)
    for start in range(0, raw.shape[0], CHUNK_BLOCKS):
        # NOTE: a copy: the file's memory map is read-only, which torch tensors cannot express
        blocks = torch.from_numpy(np.array(raw[start : start + CHUNK_BLOCKS]))
        out[start : start + CHUNK_BLOCKS] = _dequantize_blocks(blocks, kind)
    return out.view(-1)


def _dequantize_blocks(blocks: torch.Tensor, kind: str) -> torch.Tensor:
    """``[n, block bytes]`` of a 32-weight block format -> ``[n, 32]`` float32."""
    import torch

    d = blocks[:, :2].contiguous().view(torch.float16).float()
    if kind == "Q8_0":
        return d * blocks[:, 2:].contiguous().view(torch.int8).float()
    packed = blocks[:, 4:] if kind == "Q4_1" else blocks[:, 2:]
    # NOTE: a block's low nibbles are its weights 0..15, the high nibbles 16..31
    codes = torch.cat([packed & 0x0F, packed >> 4], dim=1)
    if kind == "Q4_0":
        return d * (codes.to(torch.int8) - 8).float()
    m = blocks[:, 2:4].contiguous().view(torch.float16).float()
    return d * codes.float() + m


def _hf_name(name: str, names: dict[str, str] = _NAMES) -> str:
    parts = name.split(".")
    suffix = parts[-1]
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{suffix}"
    return f"{names[parts[0]]}.{suffix}"


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute``: interleaved rotary pairs back to rotate-halves order
    (of rows: float rows or a row's quantized blocks alike)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tokenizer(path: str):
    """An HF fast tokenizer (with the chat template) built from the GGUF metadata.

    Converting the GGUF vocabulary takes seconds, so the result is saved under
    ``$RADIXLM_CACHE`` (default ``~/.cache/radixlm``) keyed by the file's size and mtime.
    """
    from transformers import AutoTokenizer

    stat = os.stat(path)
    cache = os.path.join(
        cache_root(), "tokenizers", f"{os.path.basename(path)}-{stat.st_size}-{stat.st_mtime_ns}"
    )
    if os.path.isfile(os.path.join(cache, "tokenizer_config.json")):
        return AutoTokenizer.from_pretrained(cache)
    tokenizer = AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    )
    try:
        tokenizer.save_pretrained(cache)
    except OSError:
        pass
    return tokenizer
