"""The Engine's greedy output equals Hugging Face ``generate()`` on the embedded SmolLM2."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import assert_no_leak

RAW = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
]
CHAT = [
    "What is 2 + 2?",
    "Write a haiku about the sea.",
    "Name three fruits.",
    "Why is the sky blue?",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def prompts(smollm_tokenizer) -> list[list[int]]:
    chat = [
        smollm_tokenizer.apply_chat_template(
            [{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True
        )
        for c in CHAT
    ]
    return [smollm_tokenizer.encode(p) for p in RAW + chat]


@pytest.fixture(scope="module")
def hf_outputs(smollm_path, prompts) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(smollm_path), gguf_file=os.path.basename(smollm_path), dtype=torch.float32
    ).eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            gen = model.generate(
                torch.tensor([ids]),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                eos_token_id=2,
                pad_token_id=2,
            )
            outs.append(gen[0, len(ids) :].tolist())
    return outs


def _greedy() -> dict:
    return {"max_new_tokens": NEW_TOKENS, "temperature": 0.0}


def test_batched_greedy_equals_hf(smol_engine, prompts, hf_outputs):
    outs = smol_engine.generate(input_ids=prompts, sampling_params=_greedy())
    assert [o["output_ids"] for o in outs] == hf_outputs
    assert_no_leak(smol_engine)


def test_one_at_a_time_greedy_equals_hf(smol_engine, prompts, hf_outputs):
    for ids, expected in zip(prompts, hf_outputs):
        out = smol_engine.generate(input_ids=ids, sampling_params=_greedy())
        assert out["output_ids"] == expected
    assert_no_leak(smol_engine)


def test_text_prompt_and_response_shape(smol_engine):
    out = smol_engine.generate("The capital of France is", {"max_new_tokens": 4, "temperature": 0})
    assert out["text"].strip().startswith("Paris")
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == 5 and meta["completion_tokens"] == 4
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert meta["e2e_latency"] > 0 and "id" in meta and "cached_tokens" in meta
