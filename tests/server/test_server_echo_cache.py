"""lm-eval's request shapes through the openai client: echoed prompt logprobs are the same
whether the radix cache serves them or they are computed (token-id prompts, batches of
prompts, echo with max_tokens 0 and 1, logprobs 0-5)."""

from __future__ import annotations

import openai
import pytest

CONTEXT = "Question: which planet has the most moons? Answer:"
CHOICES = [" Saturn", " Jupiter", " Mars", " Venus"]


@pytest.fixture(scope="module")
def oai(tiny_server):
    return openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0)


def _ids(client, text):
    return client.post("/tokenize", json={"prompt": text}).json()["tokens"]


def _echo(oai, prompts, logprobs, max_tokens):
    out = oai.completions.create(model="tiny", prompt=prompts, echo=True, logprobs=logprobs,
                                 max_tokens=max_tokens, temperature=0)  # fmt: skip
    return sorted(out.choices, key=lambda c: c.index), out.usage


def _check_same(got, want, prompt_len):
    a, b = got.logprobs, want.logprobs
    assert a.tokens[:prompt_len] == b.tokens[:prompt_len]
    assert a.token_logprobs[0] is None and b.token_logprobs[0] is None
    assert a.token_logprobs[1:prompt_len] == pytest.approx(b.token_logprobs[1:prompt_len], abs=1e-4)
    if a.top_logprobs is None or b.top_logprobs is None:  # logprobs=0: no alternatives
        assert a.top_logprobs is None and b.top_logprobs is None
        return
    for x, y in zip(a.top_logprobs[1:prompt_len], b.top_logprobs[1:prompt_len]):
        assert sorted(x.values()) == pytest.approx(sorted(y.values()), abs=1e-4)


@pytest.mark.parametrize("max_tokens", [0, 1])
@pytest.mark.parametrize("logprobs", [0, 1, 5])
def test_echo_logprobs_cached_equal_computed(oai, tiny_client, max_tokens, logprobs):
    prompts = [_ids(tiny_client, CONTEXT + c) for c in CHOICES]
    tiny_client.post("/flush_cache")
    fresh, _ = _echo(oai, prompts[:1], logprobs, max_tokens)  # the context computed alone
    cached, usage = _echo(oai, prompts, logprobs, max_tokens)  # the batch reuses it
    assert usage.prompt_tokens_details.cached_tokens > 0
    tiny_client.post("/flush_cache")
    for i, ids in enumerate(prompts):
        alone, _ = _echo(oai, [ids], logprobs, max_tokens)  # computed, nothing cached
        _check_same(cached[i], alone[0], len(ids))
        assert len(cached[i].logprobs.tokens) == len(ids) + max_tokens
        if logprobs:
            assert all(len(t) <= logprobs for t in cached[i].logprobs.top_logprobs[1:])
        else:
            assert cached[i].logprobs.top_logprobs is None
    _check_same(fresh[0], cached[0], len(prompts[0]))
