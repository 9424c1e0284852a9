"""GGUF files of every block type, their weights kept in blocks (models/gguf_quant.py): a tiny
Llama written by ``gguf``'s writer with random blocks of a mix of types (as Q4_K_M mixes Q4_K
and Q6_K), loaded with ``quantization='gguf'``, gives the logits of the same file with every
tensor decoded to float32 by ``gguf.quants``, within the rounding of the activations to int8
(the kernels decode the weights to the same bits)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixlm.kernels import cpu_ops
from tests.kernels.test_gguf_matmul import HALVES, OTHER_HALVES, random_blocks
from tests.runtime.models.test_model_logits import PROMPT, our_logits, write_gguf

pytestmark = pytest.mark.skipif(not cpu_ops.load(), reason="the C++ kernels could not be built")

# NOTE: K-quants need rows of 256 weights: hidden 256, MLP 512
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
# GGUF tensor -> its type; layer 0 as Q4_K_M lays it out, layer 1 the 32-weight formats and a
# K-quant without a kernel (decoded at load)
PLAN = {
    "token_embd": "Q8_0", "output": "Q6_K",
    "blk.0.attn_q": "Q4_K", "blk.0.attn_k": "Q4_K", "blk.0.attn_v": "Q6_K",
    "blk.0.attn_output": "Q4_K", "blk.0.ffn_gate": "Q4_K", "blk.0.ffn_up": "Q5_K",
    "blk.0.ffn_down": "Q6_K",
    "blk.1.attn_q": "Q4_0", "blk.1.attn_k": "Q4_1", "blk.1.attn_v": "Q5_0",
    "blk.1.attn_output": "Q5_1", "blk.1.ffn_gate": "Q8_0", "blk.1.ffn_up": "Q8_0",
    "blk.1.ffn_down": "Q2_K",
}  # fmt: skip


def requantize(float_path: str, out_path: str, plan: dict[str, str], decoded: bool) -> None:
    """``float_path``'s tensors, those in ``plan`` replaced by random blocks of their type
    (``decoded``: by those blocks decoded to float32, the reference file); "drop": left out.
    A type without random blocks here (Q8_1) gets zero bytes."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(float_path)
    writer = gguf.GGUFWriter(out_path, "llama")
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub)
    for seed, t in enumerate(reader.tensors):
        kind = plan.get(t.name.removesuffix(".weight"))
        if kind == "drop":
            continue
        if kind is None:
            writer.add_tensor(t.name, np.array(t.data))
            continue
        qtype = gguf.GGMLQuantizationType[kind]
        cols, rows = (int(d) for d in t.shape)
        if kind in {**HALVES, **OTHER_HALVES}:
            raw = random_blocks(kind, rows, cols, seed=seed)
        else:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = np.zeros((rows, cols // block * size), dtype=np.uint8)
        if decoded:
            writer.add_tensor(t.name, dequantize(raw, qtype).astype(np.float32))
        else:
            writer.add_tensor(t.name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def files(tiny_model_factory, tmp_path_factory):
    hf_dir = tiny_model_factory("LlamaForCausalLM", **SHAPE)
    tmp = tmp_path_factory.mktemp("gguf-blocks")
    write_gguf(hf_dir, str(tmp / "float.gguf"))
    out = {"hf": hf_dir, "float": str(tmp / "float.gguf")}
    for name, plan in (("mixed", PLAN), ("tied", {**PLAN, "token_embd": "Q6_K", "output": "drop"})):
        for decoded in (False, True):
            path = str(tmp / f"{name}-{'decoded' if decoded else 'blocks'}.gguf")
            requantize(str(tmp / "float.gguf"), path, plan, decoded)
            out[name, decoded] = path
    return out


def test_every_type_gives_the_decoded_file_s_logits(files):
    hf, path, ref = files["hf"], files["mixed", False], files["mixed", True]
    want = our_logits(ref, PROMPT, tokenizer_path=hf, quantization="none")
    # NOTE: the prompt in one step and token by token: the same activations' rounding
    for chunks in (1, len(PROMPT)):
        got = our_logits(path, PROMPT, chunks=chunks, tokenizer_path=hf, quantization="gguf")
        within_int8_rounding(got, want)


def within_int8_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    """The matmuls round their inputs to int8 per 32 values as llama.cpp does (kernels' test:
    ~0.3-0.8% of a dot's spread): the 7 matmuls of each layer and the head add up to ~1.6% of
    the logits' norm and 16 of 17 greedy tokens here; 5% and 3 in 4 leave room, while a
    wrong code, scale or row order is off by the logits' size."""
    assert (got - want).norm() < 0.05 * want.norm()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.75


def test_blocks_are_kept_and_reported(files):
    from radixlm.runtime.config import ServerArgs
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.models.gguf_quant import GGUFEmbedding, GGUFLinear, bytes_by_type

    runner = ModelRunner(ServerArgs(model_path=files["mixed", False], tokenizer_path=files["hf"],
                                    dtype="float32", max_total_tokens=256))  # fmt: skip
    model = runner.model
    attn = model.layers[0].self_attn.qkv_proj
    # NOTE: quantization 'auto' keeps the blocks; q and k (Q4_K) are one matmul, v (Q6_K) another
    assert isinstance(attn, GGUFLinear) and [s.kind for s in attn.segments] == ["Q4_K", "Q6_K"]
    assert isinstance(model.embed_tokens, GGUFEmbedding) and isinstance(model.lm_head, GGUFLinear)
    # NOTE: Q2_K has no kernel: its weight is a float32 segment
    assert model.layers[1].mlp.down_proj.segments[0].kind is None
    kinds = bytes_by_type(model)
    assert {"Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "float32"} == set(kinds)
    # NOTE: float32: the Q2_K weight and the norms
    assert kinds["float32"] < 512 * 256 * 4 + 16 * 256 * 4
    # NOTE: a Q8_0 row of 256 weights is 8 blocks of 34 bytes
    assert kinds["Q8_0"] >= model.config.vocab_size * 8 * 34
    assert runner.memory_bytes()["weights"] >= sum(kinds.values())


def test_tied_head_reads_the_embedding_s_blocks(files):
    from radixlm.runtime.config import ServerArgs
    from radixlm.runtime.executor.model_runner import ModelRunner

    got = our_logits(files["tied", False], PROMPT, tokenizer_path=files["hf"])
    want = our_logits(files["tied", True], PROMPT, tokenizer_path=files["hf"], quantization="none")
    within_int8_rounding(got, want)
    model = ModelRunner(ServerArgs(model_path=files["tied", False], tokenizer_path=files["hf"],
                                   dtype="float32", max_total_tokens=256)).model  # fmt: skip
    assert model.lm_head.segments[0] is model.embed_tokens.segment


def test_a_type_nothing_decodes_is_refused_by_name(files, tmp_path):
    from radixlm.runtime.config import ServerArgs
    from radixlm.runtime.executor.model_runner import ModelRunner

    path = str(tmp_path / "q8_1.gguf")
    requantize(files["float"], path, {"blk.1.ffn_down": "Q8_1"}, decoded=False)
    for quantization in ("gguf", "none"):
        with pytest.raises(ValueError, match=r"blk\.1\.ffn_down\.weight.* Q8_1"):
            ModelRunner(ServerArgs(model_path=path, tokenizer_path=files["hf"], dtype="float32",
                                   max_total_tokens=256, quantization=quantization))  # fmt: skip


def test_gguf_quantization_needs_a_gguf_file(files):
    from radixlm.runtime.config import ServerArgs
    from radixlm.runtime.executor.model_runner import ModelRunner

    with pytest.raises(ValueError, match="quantization='gguf' needs a GGUF file"):
        ModelRunner(ServerArgs(model_path=files["hf"], dtype="float32", max_total_tokens=256,
                               quantization="gguf"))  # fmt: skip
