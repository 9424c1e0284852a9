"""Every model family against Hugging Face on a tiny random checkpoint of it, in float32: the
logits of a prompt longer than the sliding window (whole and in chunks), and the Engine's greedy
tokens against ``generate()``: batched, one at a time, through the radix cache (a request that
shares a cached prefix) and with chunked prefill; with ``tp_size=2`` for a dense and a MoE
family."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.runtime.models.architectures import ARCHITECTURES
from tests.conftest import TINY_SHAPES, assert_no_leak
from tests.runtime.models.test_model_logits import hf_logits, our_logits

NEW = ["Mistral", "Gemma", "Gemma2", "Gemma3", "Phi3", "Granite", "Olmo2", "SmolLM3",
       "Mixtral", "Qwen2Moe", "Qwen3Moe", "Olmoe"]  # fmt: skip
FAMILIES = [f"{name}ForCausalLM" for name in NEW]
NEW_TOKENS = 10


def _prompts() -> list[list[int]]:
    rng = random.Random(0)
    # NOTE: longer than the windows (8), and longer than a prefill chunk (16) but for one
    return [[rng.randrange(2, 40000) for _ in range(n)] for n in (21, 13, 35, 30)]


def _hf_greedy(path: str, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # NOTE: random weights: run every token
    with torch.no_grad():
        return [
            model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False,
                           pad_token_id=0)[0, len(p):].tolist()
            for p in prompts
        ]  # fmt: skip


def _greedy() -> dict:
    return {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}


def test_every_architecture_is_tested():
    assert set(ARCHITECTURES) == set(TINY_SHAPES) and set(FAMILIES) <= set(ARCHITECTURES)


@pytest.mark.parametrize("arch", FAMILIES)
def test_family_matches_hf(tiny_model_factory, arch):
    from radixlm import Engine

    path = tiny_model_factory(arch)
    prompt = _prompts()[2]
    expected = hf_logits(path, prompt)
    torch.testing.assert_close(our_logits(path, prompt), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(our_logits(path, prompt, chunks=3), expected, atol=1e-4, rtol=1e-4)

    prompts = _prompts()
    shared = prompts[2][:28] + prompts[1][:5]  # NOTE: 28 tokens cached by prompt 2
    hf = _hf_greedy(path, prompts + [shared])
    engine = Engine(path, dtype="float32", max_total_tokens=4096, chunked_prefill_size=16)
    try:
        batched = engine.generate(input_ids=prompts, sampling_params=_greedy())
        assert [o["output_ids"] for o in batched] == hf[:4]
        engine.flush_cache()
        for ids, want in zip(prompts, hf):
            assert engine.generate(input_ids=ids, sampling_params=_greedy())["output_ids"] == want
        out = engine.generate(input_ids=shared, sampling_params=_greedy())
        assert out["meta_info"]["cached_tokens"] >= 16
        assert out["output_ids"] == hf[4]
        assert_no_leak(engine)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("arch", ["Gemma2ForCausalLM", "Qwen2MoeForCausalLM"])
def test_tp2_matches_hf(tiny_model_factory, arch):
    """Heads (and each expert's intermediate slice) split over two ranks."""
    from radixlm import Engine

    path = tiny_model_factory(arch)
    prompts = _prompts()
    hf = _hf_greedy(path, prompts)
    engine = Engine(path, dtype="float32", tp_size=2, max_total_tokens=2048)
    try:
        out = engine.generate(input_ids=prompts, sampling_params=_greedy())
        assert [o["output_ids"] for o in out] == hf
    finally:
        engine.shutdown()


def test_whole_qk_norm_models_refuse_tensor_parallelism(tiny_model_factory):
    from radixlm import Engine

    with pytest.raises(ValueError, match="Olmo2ForCausalLM .* tp_size=1"):
        Engine(tiny_model_factory("Olmo2ForCausalLM"), dtype="float32", tp_size=2)
