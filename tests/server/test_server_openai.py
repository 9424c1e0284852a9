"""The official openai client against the server: completions and chat, streaming, n, logprobs."""

from __future__ import annotations

import openai
import pytest

from radixlm.server.chat_prompt import render_chat
from radixlm.server.protocol import ChatCompletionRequest


@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_name(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_completion_with_usage_and_stop_reason(client):
    r = client.completions.create(model="tiny", prompt="The sky is", max_tokens=5, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens == 5 or r.choices[0].finish_reason == "stop"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_repeated_prompt_reports_cached_tokens(client):
    prompt = "A long shared prefix that the radix cache should remember. " * 4
    client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 1


def test_completion_batch_of_prompts_and_token_ids(client):
    r = client.completions.create(model="tiny", prompt=["a b", "c d"], max_tokens=3, n=2)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    r = client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=2)
    assert r.usage.prompt_tokens == 3


def test_completion_logprobs_and_echo(client):
    r = client.completions.create(
        model="tiny", prompt="Hello world", max_tokens=3, logprobs=2, echo=True, temperature=0
    )
    choice = r.choices[0]
    assert choice.text.startswith("Hello world")
    lp = choice.logprobs
    prompt_len = r.usage.prompt_tokens
    assert len(lp.tokens) == prompt_len + r.usage.completion_tokens
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
    assert all(len(top) == 2 for top in lp.top_logprobs[1:])
    assert "".join(lp.tokens) == choice.text


def test_seed_makes_sampling_reproducible(client):
    kw = {"model": "tiny", "prompt": "Once upon", "max_tokens": 8, "temperature": 1.0, "seed": 1234}
    assert client.completions.create(**kw).choices[0].text == (
        client.completions.create(**kw).choices[0].text
    )
    n2 = client.completions.create(**{**kw, "n": 2})
    assert n2.choices[0].text != n2.choices[1].text


def test_completion_stream_with_usage(client):
    stream = client.completions.create(
        model="tiny", prompt="Count:", max_tokens=6, stream=True, n=2, temperature=0,
        stream_options={"include_usage": True},
    )
    text, finish, usage = {0: "", 1: ""}, {}, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] += c.text
            finish[c.index] = c.finish_reason or finish.get(c.index)
    assert set(finish.values()) <= {"length", "stop"} and len(finish) == 2
    assert usage.completion_tokens <= 12 and usage.total_tokens > usage.completion_tokens
    full = client.completions.create(model="tiny", prompt="Count:", max_tokens=6, temperature=0)
    assert text[0] == full.choices[0].text


def test_continuous_usage_stats_count_tokens_so_far_in_every_chunk(client):
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True,
        temperature=0, extra_body={"ignore_eos": True},
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    counts = [c.usage.completion_tokens for c in stream]
    assert counts == sorted(counts) and counts[-1] == 6 and len(counts) >= 6
    assert counts[0] == 0  # NOTE: the role chunk, before any token (vLLM's count)


def test_chat_completion_with_logprobs_and_n(client):
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi"}],
        max_completion_tokens=4, n=2, logprobs=True, top_logprobs=3, seed=7,
    )
    assert len(r.choices) == 2 and r.object == "chat.completion"
    for choice in r.choices:
        assert choice.message.role == "assistant"
        content = choice.logprobs.content
        assert 1 <= len(content) <= 4
        assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)


def test_chat_stream_with_usage(client):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Say something"}]}]
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, stream=True, temperature=0,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] in ("length", "stop") and not any(reasons[:-1])
    full = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, temperature=0
    )
    assert text == full.choices[0].message.content


def test_stop_string_is_trimmed(client):
    base = client.completions.create(model="tiny", prompt="x y z", max_tokens=8, temperature=0)
    text = base.choices[0].text
    stop = text[len(text) // 2 :][:3]
    if not stop.strip():
        pytest.skip("generated text has no usable stop string")
    r = client.completions.create(
        model="tiny", prompt="x y z", max_tokens=8, temperature=0, stop=stop
    )
    assert r.choices[0].finish_reason == "stop"
    assert stop not in r.choices[0].text and text.startswith(r.choices[0].text)


def test_matched_stop_names_the_stop_token_or_string(client, tiny_server):
    kw = {"model": "tiny", "prompt": "x y z", "max_tokens": 8, "temperature": 0}
    ids = client.completions.create(**kw, logprobs=0).choices[0]
    assert ids.matched_stop is None and ids.finish_reason == "length"
    with tiny_server.client() as c:
        first = c.post("/generate", json={"text": "x y z", "sampling_params": {
            "max_new_tokens": 8, "temperature": 0}}).json()["output_ids"]
    by_id = client.completions.create(**kw, extra_body={"stop_token_ids": [first[2]]})
    assert by_id.choices[0].matched_stop == first[2]
    stream = client.completions.create(
        **kw, stream=True, extra_body={"stop_token_ids": [first[2]]}
    )
    last = [c for c in stream if c.choices][-1].choices[0]
    assert last.finish_reason == "stop" and last.matched_stop == first[2]
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2, temperature=0
    )
    assert chat.choices[0].finish_reason == "length" and chat.choices[0].matched_stop is None


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-17", prompt="x", max_tokens=1)
    assert info.value.body["param"] == "model"


def test_smollm_answers_sensibly(smol_server):
    client = openai.OpenAI(base_url=f"{smol_server.url}/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user",
                   "content": "What is the capital of France? Answer in one word."}],
        max_tokens=6, temperature=0,
    )
    assert "paris" in r.choices[0].message.content.lower()
    c = client.completions.create(model=r.model, prompt="1, 2, 3, 4,", max_tokens=4, temperature=0)
    assert c.choices[0].text.strip().startswith("5")


def test_context_overflow_uses_the_phrases_clients_match_on(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="word " * 900, max_tokens=500)
    message = info.value.body["message"]
    assert "maximum context length is 1024 tokens" in message
    assert "longer than the model's context length" in message and "max_tokens" in message
    assert info.value.body["code"] == info.value.code == "context_length_exceeded"


def test_chat_prefill_continues_the_last_assistant_message(tiny_server, smollm_tokenizer):
    messages = [{"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "My favourite colour is"}]
    body = {"model": "tiny", "messages": messages, "max_tokens": 4, "temperature": 0,
            "continue_final_message": True, "rid": "prefill-1"}
    prompt = render_chat(smollm_tokenizer, ChatCompletionRequest(**body), None)
    assert prompt.endswith("My favourite colour is")  # no end of turn, no new turn
    with tiny_server.client() as c:
        assert c.post("/v1/chat/completions", json=body).status_code == 200
        both = c.post("/v1/chat/completions", json={**body, "add_generation_prompt": True})
        assert both.status_code == 400
        assert "continue_final_message" in both.json()["error"]["message"]
        user_last = c.post("/v1/chat/completions", json={**body, "messages": messages[:1]})
        assert user_last.status_code == 400


def test_duplicate_rids_in_one_call_are_refused(client):
    with pytest.raises(openai.BadRequestError, match="rid"):
        client.completions.create(model="tiny", prompt=["a", "b"], max_tokens=1,
                                  extra_body={"rid": "same"})
