"""``low_memory``: each weight held once (int4 layers, int8 head and embedding) for every step,
converted as the checkpoint loads; the logits stay those of the int4 decode path."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.quant import MAX_INT4_ROWS, Int4DecodeLinear, int4_available
from radixlm.runtime.models.quant_head import (
    Int8DecodeHead,
    Int8Embedding,
    int8_head_available,
    ref_int8_head_mm,
)

pytestmark = pytest.mark.skipif(
    not (int4_available() and int8_head_available()), reason="torch lacks the int4/int8 kernels"
)

IDS = [1, 504, 3458, 282, 4649, 314, 7042, 30, 378, 7042, 314, 253, 1345, 28, 10, 22, 23, 5, 9, 77]


def runner(model_path: str, **kw) -> ModelRunner:
    return ModelRunner(ServerArgs(model_path=model_path, dtype="bfloat16", max_total_tokens=256,
                                  disable_cpu_compile=True, **kw))  # fmt: skip


def prefill_logits(r: ModelRunner, ids: list[int]) -> torch.Tensor:
    """Every position's logits, the prompt in one step."""
    slots = torch.arange(1, len(ids) + 1)
    r.req_pool.table[0, : len(ids)] = slots
    return r.forward(ForwardBatch.build(
        input_ids=ids, prefix_lens=[0], extend_lens=[len(ids)], req_slots=[0],
        out_cache_loc=slots, logits_indices=list(range(len(ids))), req_to_token=r.req_pool.table,
    ))  # fmt: skip


def test_each_weight_is_held_once(tiny_llama):
    r = runner(tiny_llama, low_memory=True)
    layers = [m for m in r.model.modules() if isinstance(m, Int4DecodeLinear)]
    assert len(layers) == 4 * r.config.num_layers
    assert all(m.int4_only and m.weight is None and m.dense is None for m in layers)
    assert type(r.model.lm_head) is Int8DecodeHead and r.model.lm_head.weight is None
    assert type(r.model.embed_tokens) is Int8Embedding  # NOTE: untied here: its own int8 copy
    memory = r.memory_bytes()
    norms = sum(p.numel() * p.element_size() for n, p in r.model.named_parameters())
    assert memory["weights"] == norms and memory["quantized_copies"] > 50 * norms
    assert r.cpu_compile_status == "off"  # NOTE: no compiled steps, no compiler loaded


def test_logits_are_the_int4_decode_paths(tiny_llama):
    """A prompt of <= 8 tokens runs the int4 layers and int8 head in both modes: only the
    embedding differs (int8 rows against bf16). A longer prompt runs int4 too in low_memory:
    its first rows match the short prompt's."""
    short = IDS[:MAX_INT4_ROWS]
    low = runner(tiny_llama, low_memory=True)
    want = prefill_logits(runner(tiny_llama, quantization="int4"), short)
    got = prefill_logits(low, short)
    assert (got - want).abs().max() < 0.1 * want.std()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.75
    long = prefill_logits(low, IDS)[: len(short)]  # NOTE: same kernel, more rows: bf16 rounds
    assert (long - got).abs().max() < 0.1 * want.std()
    assert (long.argmax(-1) == got.argmax(-1)).float().mean() >= 0.75


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_int8_embedding_reads_the_checkpoint_rows(tiny_model_factory, architecture):
    """The dequantised rows, within int8's half step of the checkpoint's (a safetensors file
    holds ``lm_head`` before the embedding: the embedding converts only once it is loaded)."""
    path = tiny_model_factory(architecture)
    r, ids = runner(path, low_memory=True), torch.tensor([3, 0, 17, 3, 1500])
    embed = r.model.embed_tokens
    dense = ref_int8_head_mm(torch.eye(embed.codes.shape[0] * embed.codes.shape[2]),
                             embed.codes, embed.scales)  # fmt: skip
    assert torch.equal(embed(ids).float(), dense.t()[ids].bfloat16().float())
    want = runner(path, quantization="int4").model.embed_tokens(ids).float()
    assert (embed(ids).float() - want).abs().max() <= 0.01 * want.abs().max()


def test_tied_embedding_shares_the_head_copy(smollm_path):
    r = runner(smollm_path, low_memory=True)
    assert r.model.embed_tokens.codes is r.model.lm_head.codes
    assert r.memory_bytes()["weights"] < 1 << 20


def test_smollm_answers_the_same(smollm_path):
    from radixlm.runtime.messages import GenerateReq, Sampling
    from radixlm.runtime.scheduler.scheduler import Scheduler

    scheduler = Scheduler(ServerArgs(device="cpu", dtype="bfloat16", max_total_tokens=256,
                                     low_memory=True, disable_cpu_compile=True))  # fmt: skip
    tok = scheduler.runner.tokenizer
    prompt = "The capital of France is a city that many people visit every year, and its name is"
    scheduler.handle(GenerateReq("r", tok.encode(prompt), Sampling(max_new_tokens=3,
                                                                   temperature=0)))  # fmt: skip
    out = []
    while scheduler.has_work:
        out += [t for o in scheduler.step() for t in o.new_ids]
    assert tok.decode(out).startswith(" Paris")


def test_low_memory_is_validated(tiny_llama):
    with pytest.raises(ValueError, match="low_memory=True.*quantization='none'"):
        ServerArgs(low_memory=True, quantization="none")
    with pytest.raises(ValueError, match="low_memory=True runs on CPU in bfloat16"):
        ModelRunner(ServerArgs(model_path=tiny_llama, dtype="float32", low_memory=True))


def test_the_load_hook_runs_once_per_parameter_when_all_its_shards_are_in(tiny_llama):
    from radixlm.runtime.loader.loader import load_model

    seen: list[str] = []
    loaded = load_model(ServerArgs(model_path=tiny_llama), torch.device("cpu"), torch.bfloat16,
                        on_loaded=lambda model, name: seen.append(name))  # fmt: skip
    names = [name for name, _ in loaded.model.named_parameters()]
    assert sorted(seen) == sorted(names) and len(seen) == len(set(seen))
    # NOTE: q, k and v fill one fused parameter: it is complete only after the last of them
    assert "layers.0.self_attn.qkv_proj.weight" in seen


def test_a_bias_loaded_after_its_weight_was_converted_is_kept(tiny_model_factory):
    """Qwen2's q/k/v bias is its own checkpoint tensor: the int4 module made when the weight
    completed holds the same bias parameter, which the loader then fills."""
    path = tiny_model_factory("Qwen2ForCausalLM")
    low, default = runner(path, low_memory=True), runner(path, quantization="int4")
    got = low.model.layers[0].self_attn.qkv_proj.bias
    want = default.model.layers[0].self_attn.qkv_proj.bias
    assert got is not None and torch.equal(got, want) and want.abs().sum() > 0
    short = IDS[:MAX_INT4_ROWS]
    a, b = prefill_logits(low, short), prefill_logits(default, short)
    assert (a - b).abs().max() < 0.1 * b.std()
