"""Engine.encode: pooled hidden states equal transformers' on tiny random models, whole, in
chunks, from the radix cache, and batched with generation."""

from __future__ import annotations

import threading

import pytest
import torch

from radixlm import Engine
from tests.conftest import assert_no_leak

ARCHITECTURES = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Gemma2ForCausalLM"]


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    lengths = [5, 23, 41, 64, 1]
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _reference(path: str, prompts: list[list[int]]) -> dict[str, list[torch.Tensor]]:
    """transformers' final hidden states (after the last norm), pooled and normalised."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    out = {"last": [], "mean": []}
    with torch.no_grad():
        for ids in prompts:
            h = model(torch.tensor([ids])).last_hidden_state[0]
            out["last"].append(torch.nn.functional.normalize(h[-1], dim=0))
            out["mean"].append(torch.nn.functional.normalize(h.mean(0), dim=0))
    return out


def _close(got: list[float], want: torch.Tensor) -> None:
    torch.testing.assert_close(torch.tensor(got), want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_encode_equals_transformers_whole_chunked_and_cached(tiny_model_factory, architecture):
    path = tiny_model_factory(architecture)
    # NOTE: chunks of 16 split the longer prompts; the cache then serves repeated prefixes
    engine = Engine(path, dtype="float32", chunked_prefill_size=16, max_total_tokens=4096)
    try:
        prompts = _prompts(engine.info["vocab_size"])
        want = _reference(path, prompts)
        for pooling in ("last", "mean"):
            got = engine.encode(input_ids=prompts, pooling=pooling)
            assert [r["meta_info"]["prompt_tokens"] for r in got] == [len(p) for p in prompts]
            for r, w in zip(got, want[pooling]):
                _close(r["embedding"], w)
        # NOTE: again, one at a time: "last" reuses the cached prefix (all but the last
        # token), "mean" needs every hidden state and takes nothing from the cache
        again = engine.encode(input_ids=prompts[3], pooling="last")
        assert again["meta_info"]["cached_tokens"] == len(prompts[3]) - 1
        _close(again["embedding"], want["last"][3])
        mean = engine.encode(input_ids=prompts[3], pooling="mean")
        assert mean["meta_info"]["cached_tokens"] == 0
        _close(mean["embedding"], want["mean"][3])
        raw = engine.encode(input_ids=prompts[2], normalize=False)
        norm = torch.tensor(raw["embedding"]).norm()
        _close([x / norm.item() for x in raw["embedding"]], want["last"][2])
        assert abs(norm.item() - 1.0) > 1e-3
        assert_no_leak(engine)
    finally:
        engine.shutdown()


def test_encode_batched_with_generation_changes_neither(tiny_llama):
    engine = Engine(tiny_llama, dtype="float32", max_total_tokens=4096)
    try:
        prompts = _prompts(engine.info["vocab_size"])
        greedy = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
        alone_gen = engine.generate(input_ids=prompts[:3], sampling_params=greedy)
        alone_emb = engine.encode(input_ids=prompts, pooling="mean")
        engine.flush_cache()
        results = {}
        # NOTE: both calls in flight at once: the scheduler mixes their requests in its steps
        gen = threading.Thread(target=lambda: results.update(
            gen=engine.generate(input_ids=prompts[:3], sampling_params=greedy)))  # fmt: skip
        gen.start()
        results["emb"] = engine.encode(input_ids=prompts, pooling="mean")
        gen.join()
        assert [r["output_ids"] for r in results["gen"]] == [r["output_ids"] for r in alone_gen]
        for a, b in zip(results["emb"], alone_emb):
            _close(a["embedding"], torch.tensor(b["embedding"]))
            assert a["meta_info"]["completion_tokens"] == 0
        assert_no_leak(engine)
    finally:
        engine.shutdown()


def test_encode_refuses_bad_input(tiny_llama):
    engine = Engine(tiny_llama, dtype="float32", max_total_tokens=4096, context_length=64)
    try:
        with pytest.raises(ValueError, match="pooling must be one of"):
            engine.encode("hi", pooling="cls")
        with pytest.raises(ValueError, match="maximum context length"):
            engine.encode(input_ids=[5] * 64)
        with pytest.raises(ValueError, match="input_ids"):
            engine.encode(input_ids=[10**9])
        with pytest.raises(ValueError, match="empty"):
            engine.encode("")
        assert len(engine.encode(input_ids=[5] * 63)["embedding"]) == 64
        assert_no_leak(engine)
    finally:
        engine.shutdown()


def test_an_embedding_engine_refuses_generation(tiny_llama):
    engine = Engine(tiny_llama, dtype="float32", is_embedding=True, max_total_tokens=1024)
    try:
        assert len(engine.encode(input_ids=[5, 6, 7])["embedding"]) == engine.info["hidden_size"]
        with pytest.raises(ValueError, match="is_embedding"):
            engine.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 2})
        assert_no_leak(engine)
    finally:
        engine.shutdown()
