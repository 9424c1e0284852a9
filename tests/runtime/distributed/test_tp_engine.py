"""Tensor parallelism through the Engine: greedy tokens match tp=1 in float32 on gloo."""

from __future__ import annotations

import time

import pytest

from radixlm import Engine
from radixlm.runtime.threads import compute_threads
from radixlm.runtime.tokenizer_manager import EngineDeadError
from tests.conftest import assert_no_leak

GREEDY = {"max_new_tokens": 8, "temperature": 0.0}
PROMPTS = [
    "The capital of France is",
    "List three colours: red,",
    "The capital of France is a city where",  # shares a cached prefix with the first
]


def greedy_ids(engine: Engine, prompts: list[str]) -> list[list[int]]:
    return [out["output_ids"] for out in engine.generate(prompts, GREEDY)]


@pytest.fixture(scope="module")
def tiny_tp2(tiny_llama):
    engine = Engine(
        tiny_llama, dtype="float32", tp_size=2, max_total_tokens=2048, chunked_prefill_size=16
    )
    yield engine
    engine.shutdown()


def test_tp2_tiny_model_matches_tp1(tiny_tp2, tiny_engine):
    long_prompt = " ".join(["one two three four"] * 10)  # several prefill chunks
    prompts = [*PROMPTS, long_prompt]
    expected = greedy_ids(tiny_engine, prompts)
    assert greedy_ids(tiny_tp2, prompts) == expected
    assert greedy_ids(tiny_tp2, prompts) == expected  # again, from the radix cache
    assert tiny_tp2.get_server_info()["stats"]["hit_tokens"] > 0
    assert_no_leak(tiny_tp2)


def test_ranks_share_the_cores(tiny_tp2):
    counts = tiny_tp2.get_server_info()["threads"]
    assert counts["scheduler"] == counts["tp rank 1"] == compute_threads(None, processes=2)
    assert counts["detokenizer"] == 0  # NOTE: it imports no torch
    assert "scheduler_big_steps" not in counts  # NOTE: ranks keep one count for every step


def test_tp3_smollm_matches_tp1(smol_engine):
    engine = Engine(dtype="float32", tp_size=3, max_total_tokens=2048)
    try:
        assert engine.get_server_info()["tp_size"] == 3
        assert greedy_ids(engine, PROMPTS[:2]) == greedy_ids(smol_engine, PROMPTS[:2])
    finally:
        engine.shutdown()


def test_tp_size_that_does_not_divide_the_heads_is_refused(tiny_llama):
    with pytest.raises(ValueError, match=r"tp_size=3 .*4 attention heads and 2 KV heads"):
        Engine(tiny_llama, dtype="float32", tp_size=3)


def test_ranks_that_fail_to_start_fail_the_launch(tiny_llama):
    # NOTE: a device name torch does not know passes the option checks and fails in each rank
    with pytest.raises(RuntimeError, match="failed to start: RuntimeError: .*no-such-device"):
        Engine(tiny_llama, dtype="float32", tp_size=2, device="no-such-device")


def test_unknown_backends_are_refused_before_anything_starts(tiny_llama):
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        Engine(tiny_llama, dtype="float32", attention_backend="no-such-backend")
    with pytest.raises(ValueError, match="grammar_backend must be one of"):
        Engine(tiny_llama, dtype="float32", grammar_backend="no-such-backend")


def test_dead_rank_is_reported(tiny_tp2):
    tiny_tp2.runtime.backend.procs["tp rank 1"].kill()
    deadline = time.monotonic() + 30
    with pytest.raises(EngineDeadError, match="tp rank 1"):
        while time.monotonic() < deadline:
            tiny_tp2.get_server_info()
            time.sleep(0.2)
