"""Prompt logprobs kept beside the KV: echo requests reuse a cached prefix's logprobs and give
the same numbers as computing them all (lm-eval's loglikelihood request shapes)."""

from __future__ import annotations

import pytest

from tests.conftest import assert_no_leak

CONTEXT = "Question: which of these animals can fly the longest without landing? Answer:"
CHOICES = [" the swift", " a penguin", " the ostrich", " an albatross"]


@pytest.fixture(scope="module")
def engines(tiny_llama):
    """A cached engine with small prefill chunks (so prompts cross chunk boundaries) and one
    without a radix cache: the reference that computes every logprob."""
    from radixlm import Engine

    cached = Engine(tiny_llama, dtype="float32", max_total_tokens=4096, chunked_prefill_size=16,
                    cached_top_logprobs=3)  # fmt: skip
    plain = Engine(tiny_llama, dtype="float32", max_total_tokens=4096, disable_radix_cache=True)
    yield cached, plain
    cached.shutdown()
    plain.shutdown()


def _score(engine, ids, top_n=1, max_new_tokens=1, start=0, salt=None):
    extra = {"cache_salt": salt} if salt else {}
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": max_new_tokens,
                          "temperature": 0}, return_logprob=True, logprob_start_len=start,
                          top_logprobs_num=top_n, **extra)  # fmt: skip
    return out["meta_info"]


def _stats(engine):
    return engine.get_server_info()["stats"]


def _same(got, want):
    assert [t for _, t, _ in got["input_token_logprobs"]] == [
        t for _, t, _ in want["input_token_logprobs"]
    ]
    for (a, _, _), (b, _, _) in zip(got["input_token_logprobs"], want["input_token_logprobs"]):
        assert (a is None and b is None) or a == pytest.approx(b, abs=1e-4)
    for a, b in zip(got.get("input_top_logprobs", []), want.get("input_top_logprobs", [])):
        assert (a is None) == (b is None)
        if a is not None:
            assert [v for v, _, _ in a] == pytest.approx([v for v, _, _ in b], abs=1e-4)


def _ids(engine, text):
    return engine.tokenizer.encode(text)


@pytest.mark.parametrize("max_new_tokens", [0, 1])
def test_choices_of_a_question_reuse_the_contexts_logprobs(engines, max_new_tokens):
    cached, plain = engines
    cached.flush_cache()
    prompts = [_ids(cached, CONTEXT + c) for c in CHOICES]
    context_len = len(_ids(cached, CONTEXT))
    first = _score(cached, prompts[0], max_new_tokens=max_new_tokens)
    assert first["cached_tokens"] == 0
    before = _stats(cached)["prompt_logprob_hit_tokens"]
    for ids in prompts[1:]:
        got = _score(cached, ids, max_new_tokens=max_new_tokens)
        # NOTE: the context's KV and logprobs come from the cache, all but its last token
        assert got["cached_tokens"] >= context_len - 2
        _same(got, _score(plain, ids, max_new_tokens=max_new_tokens))
    reused = _stats(cached)["prompt_logprob_hit_tokens"] - before
    assert reused >= (len(CHOICES) - 1) * (context_len - 2)
    assert_no_leak(cached)


@pytest.mark.parametrize("top_n", [0, 1, 3])
def test_a_repeated_prompt_reads_everything_but_one_token(engines, top_n):
    cached, plain = engines
    cached.flush_cache()
    ids = _ids(cached, CONTEXT * 3)  # longer than a prefill chunk
    _score(cached, ids, top_n=top_n)
    again = _score(cached, ids, top_n=top_n)
    assert again["cached_tokens"] == len(ids) - 2
    want = _score(plain, ids, top_n=top_n)
    _same(again, want)
    if top_n:
        assert all(len(row) == top_n for row in again["input_top_logprobs"][1:])


def test_more_top_logprobs_than_kept_are_computed_again(engines):
    cached, plain = engines
    cached.flush_cache()
    ids = _ids(cached, CONTEXT)
    _score(cached, ids, top_n=3)
    misses = _stats(cached)["prompt_logprob_top_n_misses"]
    wide = _score(cached, ids, top_n=5)  # the engine keeps 3
    assert wide["cached_tokens"] == 0
    assert _stats(cached)["prompt_logprob_top_n_misses"] > misses
    _same(wide, _score(plain, ids, top_n=5))


def test_a_prefix_cached_without_logprobs_has_its_logprobs_computed(engines):
    cached, plain = engines
    cached.flush_cache()
    ids = _ids(cached, CONTEXT + CHOICES[0])
    cached.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})  # KV only
    got = _score(cached, ids)
    assert got["cached_tokens"] == 0  # NOTE: the first prompt logprob needs position 0's logits
    _same(got, _score(plain, ids))
    # NOTE: the KV computed again duplicated the tree's: the logprobs went to the tree's slots
    again = _score(cached, ids)
    assert again["cached_tokens"] == len(ids) - 2
    _same(again, got)


def test_a_start_past_the_cached_prefix_and_a_salt(engines):
    cached, plain = engines
    cached.flush_cache()
    ids = _ids(cached, CONTEXT + CHOICES[1])
    _score(cached, ids, salt="tenant-a")
    other = _score(cached, ids, salt="tenant-b")
    assert other["cached_tokens"] == 0  # another salt shares neither KV nor logprobs
    start = len(ids) - 3
    tail = _score(cached, ids, start=start, salt="tenant-a")
    assert tail["cached_tokens"] == len(ids) - 2
    _same(tail, _score(plain, ids, start=start))
    assert len(tail["input_token_logprobs"]) == 3


def test_slots_handed_out_again_forget_their_logprobs(engines):
    """After a flush the same slots hold other tokens: nothing stale may be read."""
    cached, plain = engines
    cached.flush_cache()
    x = _ids(cached, "Once upon a time in a land far away there lived a")
    _score(cached, x, top_n=2)
    cached.flush_cache()
    y = _ids(cached, "Once upon a time the stock market fell by a large margin")
    cached.generate(input_ids=y, sampling_params={"max_new_tokens": 1})  # same slots, KV only
    _score(cached, y[:6], top_n=2)  # a short echo that may land in y's slots
    got = _score(cached, y, top_n=2)
    _same(got, _score(plain, y, top_n=2))
    assert_no_leak(cached)


def test_a_batch_of_choices_in_one_call(engines):
    cached, plain = engines
    cached.flush_cache()
    prompts = [_ids(cached, CONTEXT * 3 + c) for c in CHOICES]  # shares > 32 tokens
    params = {"max_new_tokens": 1, "temperature": 0}
    outs = cached.generate(input_ids=prompts, sampling_params=params, return_logprob=True,
                           logprob_start_len=0, top_logprobs_num=1)  # fmt: skip
    for ids, out in zip(prompts, outs):
        _same(out["meta_info"], _score(plain, ids))
    assert sum(o["meta_info"]["cached_tokens"] for o in outs) > 0  # the context computed once
    assert_no_leak(cached)
