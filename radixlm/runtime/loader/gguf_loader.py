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

_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# GGUF tensor name fragment -> Hugging Face name fragment
_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


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
    return ModelConfig(
        architecture=_ARCHS[arch],
        hidden_size=hidden,
        intermediate_size=_field(reader, p + "feed_forward_length"),
        num_layers=_field(reader, p + "block_count"),
        num_heads=heads,
        num_kv_heads=_field(reader, p + "attention.head_count_kv") or heads,
        head_dim=head_dim,
        vocab_size=vocab,
        rms_norm_eps=float(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(_field(reader, p + "rope.freq_base", 10000.0)),
        context_length=_field(reader, p + "context_length", 2048),
        tie_word_embeddings="output.weight" not in names,
        attention_bias=arch == "qwen2",
        qk_norm=arch == "qwen3",
        eos_token_ids=(_field(reader, "tokenizer.ggml.eos_token_id"),),
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
    )


def gguf_weights(reader, config: ModelConfig, dtype=None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (Hugging Face name, tensor in ``dtype``, default float32), undoing llama.cpp's Q/K
    row permutation. Each tensor's pages of the file leave this process once it is read."""
    permute = config.architecture == "LlamaForCausalLM"
    read = 0
    for t in reader.tensors:
        tensor = _dequantize(t, dtype).reshape([int(d) for d in reversed(t.shape)])
        reader.release(t)
        read += t.data.nbytes
        if read >= TRIM_BYTES:
            # NOTE: the temporaries so far (and bf16 weights a loader's hook replaced) go back
            # to the OS as the load goes (each call walks the heaps: ~15 ms here)
            trim_heap()
            read = 0
        name = _hf_name(t.name)
        if permute and name.endswith("q_proj.weight"):
            tensor = _unpermute(tensor, config.num_heads)
        elif permute and name.endswith("k_proj.weight"):
            tensor = _unpermute(tensor, config.num_kv_heads)
        yield name, tensor


def _dequantize(t, dtype=None) -> torch.Tensor:
    """One tensor in ``dtype`` (default float32), to be reshaped by the caller: the 32-weight
    block formats in torch (SmolLM2: 0.74 s against 1.77 s for ``gguf.quants``' numpy, with the
    same float32 arithmetic, so the same values), the others with ``gguf.quants``. Block
    formats go ``CHUNK_BLOCKS`` at a time, each chunk rounded to ``dtype`` as it is written:
    the same bits as rounding the whole float32 tensor, without its float32 temporaries
    (SmolLM2's Q8_0 embedding: ~350 MB of them at once)."""
    import torch  # NOTE: here, not above: the config and tokenizer are read without torch

    kind = t.tensor_type.name
    if kind not in _BLOCK_BYTES:
        from gguf.quants import dequantize

        array = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
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


def _hf_name(name: str) -> str:
    parts = name.split(".")
    suffix = parts[-1]
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_NAMES[parts[2]]}.{suffix}"
    return f"{_NAMES[parts[0]]}.{suffix}"


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute``: interleaved rotary pairs back to rotate-halves order."""
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
