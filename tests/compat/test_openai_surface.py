"""The OpenAI-compatible surface, driven by the official ``openai`` client as SGLang's and vLLM's
own server tests drive theirs, on the embedded SmolLM2-135M-Instruct.

Every check is about the shape of the answers (fields, types, finish reasons, usage, chunking,
error codes) or about relations between answers (a stream adds up to the whole answer, a stop
string trims the greedy text at its first occurrence), never about what the model knows."""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

CHAT = [{"role": "user", "content": "Tell me a short story about a cat."}]
PROMPT = "Once upon a time"


def _extra(choice) -> dict:
    """The fields a choice carries beyond OpenAI's (SGLang's ``matched_stop``)."""
    return choice.model_extra or {}


def _window(text: str) -> str:
    """Three characters from the middle of ``text``, starting at a non-space one."""
    start = len(text) // 2
    while text[start].isspace():
        start += 1
    return text[start : start + 3]


def test_models_list_and_retrieve(client, model):
    listed = client.models.list()
    assert [m.id for m in listed.data] == [model] and listed.data[0].object == "model"
    one = client.models.retrieve(model)  # GET /v1/models/{model}
    assert one.id == model and one.object == "model"
    assert isinstance(one.created, int) and isinstance(one.owned_by, str)
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.status_code == 404


def test_chat_completion_fields_and_cached_tokens(client, model):
    before = int(time.time())
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=0)
    assert isinstance(r.id, str) and r.id and r.object == "chat.completion"
    assert r.model == model and before - 5 <= r.created <= time.time() + 5
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length") and "matched_stop" in _extra(choice)
    usage = r.usage
    assert usage.prompt_tokens > 0 and 1 <= usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert isinstance(usage.prompt_tokens_details.cached_tokens, int)
    again = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8,
                                           temperature=0)  # fmt: skip
    assert again.id != r.id and again.choices[0].message.content == choice.message.content
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < again.usage.prompt_tokens  # the radix cache held the prompt


def test_completion_fields(client, model, smollm_tokenizer):
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0)
    assert isinstance(r.id, str) and r.id and r.object == "text_completion"
    assert r.model == model and isinstance(r.created, int)
    choice = r.choices[0]
    assert choice.index == 0 and isinstance(choice.text, str) and choice.text
    assert choice.finish_reason in ("stop", "length") and choice.logprobs is None
    assert "matched_stop" in _extra(choice)
    assert r.usage.prompt_tokens == len(smollm_tokenizer.encode(PROMPT))
    assert 1 <= r.usage.completion_tokens <= 6
    assert isinstance(r.usage.prompt_tokens_details.cached_tokens, int)


def test_stop_string_gives_stop_and_matched_stop(client, model):
    ask = {"model": model, "messages": CHAT, "max_tokens": 12, "temperature": 0,
           "extra_body": {"ignore_eos": True}}  # fmt: skip
    full = client.chat.completions.create(**ask).choices[0].message.content
    stop = _window(full)
    r = client.chat.completions.create(**ask, stop=[stop, "never-seen-zq"])
    choice = r.choices[0]
    assert choice.message.content == full[: full.index(stop)]
    assert choice.finish_reason == "stop" and _extra(choice)["matched_stop"] == stop
    # streamed, no part of the stop string leaks out before it is recognised
    chunks = list(client.chat.completions.create(**ask, stop=[stop], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full[: full.index(stop)]
    last = [c.choices[0] for c in chunks if c.choices][-1]
    assert last.finish_reason == "stop" and _extra(last)["matched_stop"] == stop

    full = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text  # fmt: skip
    stop = _window(full)
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                  stop=stop, extra_body={"ignore_eos": True})  # fmt: skip
    choice = r.choices[0]
    assert choice.text == full[: full.index(stop)]
    assert choice.finish_reason == "stop" and _extra(choice)["matched_stop"] == stop


def test_a_natural_end_names_the_eos_token(client, model, smollm_tokenizer):
    """SGLang's ``matched_stop`` is the token id when the model ends its turn."""
    ask = {"model": model, "max_tokens": 32, "temperature": 0,
           "messages": [{"role": "user", "content": "Say only the word yes."}]}  # fmt: skip
    choice = client.chat.completions.create(**ask).choices[0]
    assert choice.finish_reason == "stop"
    assert _extra(choice)["matched_stop"] == smollm_tokenizer.eos_token_id
    last = [c.choices[0] for c in client.chat.completions.create(**ask, stream=True)
            if c.choices][-1]  # fmt: skip
    assert last.finish_reason == "stop"
    assert _extra(last)["matched_stop"] == smollm_tokenizer.eos_token_id


def test_max_tokens_gives_length(client, model):
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, temperature=0,
                                  extra_body={"ignore_eos": True})  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "length" and _extra(choice)["matched_stop"] is None
    assert r.usage.completion_tokens == 3
    r = client.chat.completions.create(model=model, messages=CHAT, max_completion_tokens=2,
                                       extra_body={"ignore_eos": True})  # fmt: skip
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2


def test_chat_stream_with_usage_in_every_chunk(client, model):
    whole = client.chat.completions.create(model=model, messages=CHAT, max_tokens=10,
                                           temperature=0)  # fmt: skip
    chunks = list(client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    ))  # fmt: skip
    assert {c.id for c in chunks} == {chunks[0].id} and len(chunks) >= 4
    assert all(c.object == "chat.completion.chunk" and c.model == model for c in chunks)
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta.content or "" for c in with_choices]
    assert sum(1 for d in deltas if d) >= 2  # incremental, not one piece
    assert "".join(deltas) == whole.choices[0].message.content
    reasons = [c.choices[0].finish_reason for c in with_choices]
    assert reasons[-1] == whole.choices[0].finish_reason and not any(reasons[:-1])
    # continuous_usage_stats: usage so far in every chunk; the last chunk has no choices
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and {c.usage.prompt_tokens for c in chunks} == {
        whole.usage.prompt_tokens
    }
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert isinstance(chunks[-1].usage.prompt_tokens_details.cached_tokens, int)


def test_completion_stream_with_final_usage_only(client, model):
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))  # fmt: skip
    assert all(c.object == "text_completion" for c in chunks)
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_n_choices(client, model):
    r = client.chat.completions.create(model=model, messages=CHAT, n=2, max_tokens=4,
                                       temperature=0.8, seed=11)  # fmt: skip
    assert [c.index for c in r.choices] == [0, 1]
    assert all(isinstance(c.message.content, str) and c.finish_reason in ("stop", "length")
               for c in r.choices)  # fmt: skip
    assert 2 <= r.usage.completion_tokens <= 8  # both samples are counted
    # streamed: each index gets its own deltas and one finish_reason
    chunks = list(client.chat.completions.create(model=model, messages=CHAT, n=2, max_tokens=4,
                                                 temperature=0.8, seed=11,
                                                 stream=True))  # fmt: skip
    texts, finished = {0: "", 1: ""}, {0: [], 1: []}
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished[c.index].append(c.finish_reason)
    assert all(texts.values()) and all(len(f) == 1 for f in finished.values())
    # several prompts: choices are prompt-major (index = prompt * n + sample)
    one = client.completions.create(model=model, prompt="Red,", max_tokens=3, temperature=0)
    r = client.completions.create(model=model, prompt=["Red,", PROMPT], n=2, max_tokens=3,
                                  temperature=0)  # fmt: skip
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    texts = [c.text for c in r.choices]
    assert texts[0] == texts[1] == one.choices[0].text and texts[2] == texts[3]


def test_logprobs_and_top_logprobs_shape(client, model):
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=3)  # fmt: skip
    choice = r.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == r.usage.completion_tokens
    for e in entries:
        assert isinstance(e.token, str) and e.logprob <= 0 and len(e.top_logprobs) == 3
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert e.top_logprobs[0].token == e.token  # greedy picks the most likely token
    assert b"".join(bytes(e.bytes) for e in entries).decode() == choice.message.content

    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0,
                                  logprobs=2)  # fmt: skip
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(1 <= len(top) <= 2 and all(v <= 0 for v in top.values()) for top in lp.top_logprobs)
    steps = [b - a for a, b in zip(lp.text_offset, lp.text_offset[1:])]
    assert steps == [len(t) for t in lp.tokens[:-1]]


PET = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "legs": {"type": "integer"},
                   "indoor": {"type": "boolean"}},
    "required": ["name", "legs", "indoor"],
    "additionalProperties": False,
}  # fmt: skip


def test_response_format_json_schema(client, model):
    r = client.chat.completions.create(
        model=model, temperature=0, max_tokens=48,
        messages=[{"role": "user", "content": "Describe a pet as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "pet", "schema": PET, "strict": True}},
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    pet = json.loads(choice.message.content)
    jsonschema.validate(pet, PET)
    assert set(pet) == {"name", "legs", "indoor"}


def test_stop_regex_extra_field(client, model):
    ask = {"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
    full = client.completions.create(**ask, extra_body={"ignore_eos": True}).choices[0].text
    middle = _window(full)
    pattern = re.escape(middle[0]) + "." + re.escape(middle[2])
    match = re.search(pattern, full)
    r = client.completions.create(**ask, extra_body={"ignore_eos": True, "stop_regex": pattern})
    choice = r.choices[0]
    assert choice.text == full[: match.start()] and choice.finish_reason == "stop"
    # radixlm names the matched text; SGLang names the pattern
    assert _extra(choice)["matched_stop"] in (match.group(0), pattern)
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=16, temperature=0,
                                       extra_body={"stop_regex": r"[.,!?]"})  # fmt: skip
    content = r.choices[0].message.content
    assert not re.search(r"[.,!?]", content)
    assert r.choices[0].finish_reason == "stop" or r.usage.completion_tokens == 16


def test_continue_final_message(client, model, smollm_tokenizer):
    """vLLM's prefill: the last assistant message is continued, as the model's own chat
    template renders it with ``continue_final_message=True``."""
    messages = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "My favourite colour is"},
    ]
    prompt = smollm_tokenizer.apply_chat_template(
        messages, tokenize=False, continue_final_message=True
    )
    assert prompt.endswith("My favourite colour is")
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=6,
                                       temperature=0,
                                       extra_body={"continue_final_message": True})  # fmt: skip
    raw = client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0)
    assert r.choices[0].message.content == raw.choices[0].text
    assert r.usage.prompt_tokens == raw.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError, match="continue_final_message"):
        client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=2,
            extra_body={"continue_final_message": True, "add_generation_prompt": True},
        )


def test_cache_salt_separates_cached_prefixes(client, model):
    prompt = f"[{uuid.uuid4().hex}] " + "A long shared system preamble about foxes. " * 6

    def cached(salt=None):
        extra = {"cache_salt": salt} if salt else {}
        r = client.completions.create(model=model, prompt=prompt, max_tokens=1, extra_body=extra)
        return r.usage.prompt_tokens_details.cached_tokens

    assert cached("tenant-a") == 0
    assert cached("tenant-a") > 0  # same salt: the prefix is shared
    assert cached("tenant-b") == 0  # another salt: nothing shared
    assert cached() == 0  # no salt is its own tenant too
    r = client.chat.completions.create(model=model, max_tokens=1,
                                       messages=[{"role": "user", "content": prompt}],
                                       extra_body={"cache_salt": "tenant-c"})  # fmt: skip
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_responses_api(client, model):
    ask = {"model": model, "input": "Say hello.", "temperature": 0}
    r = client.responses.create(**ask, max_output_tokens=12)
    assert r.object == "response" and isinstance(r.id, str) and r.model == model
    assert r.status in ("completed", "incomplete") and r.output[0].type == "message"
    assert r.output[0].role == "assistant" and isinstance(r.output_text, str) and r.output_text
    assert r.usage.input_tokens > 0 and 1 <= r.usage.output_tokens <= 12
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens

    events = list(client.responses.create(**ask, max_output_tokens=12, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == f"response.{r.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 2 and "".join(deltas) == events[-1].response.output_text
    assert events[-1].response.output_text == r.output_text

    cut = client.responses.create(**ask, max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 2


@pytest.mark.parametrize("call", ["chat", "completions", "responses"])
def test_unknown_model_is_404(client, call):
    create = {
        "chat": lambda: client.chat.completions.create(model="no-such-model", messages=CHAT,
                                                       max_tokens=1),
        "completions": lambda: client.completions.create(model="no-such-model", prompt="x",
                                                         max_tokens=1),
        "responses": lambda: client.responses.create(model="no-such-model", input="x",
                                                     max_output_tokens=1),
    }[call]  # fmt: skip
    with pytest.raises(openai.NotFoundError) as info:
        create()
    assert info.value.status_code == 404
    body = info.value.body
    assert body["param"] == "model" and isinstance(body["code"], str) and body["message"]


def test_context_overflow_is_400_naming_the_maximum_context_length(client, model):
    long = "word " * 9000
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, max_tokens=4,
                                       messages=[{"role": "user", "content": long}])  # fmt: skip
    assert info.value.status_code == 400
    assert "maximum context length" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model, prompt="word " * 100, max_tokens=100_000)
    assert "maximum context length" in info.value.body["message"]


@pytest.mark.parametrize("field, value", [
    ("temperature", -1), ("top_p", 7), ("n", 0), ("top_logprobs", 50), ("max_tokens", -3),
    ("presence_penalty", 5),
])  # fmt: skip
def test_bad_field_is_400_naming_it(client, model, field, value):
    extra = {"logprobs": True} if field == "top_logprobs" else {}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model, messages=CHAT, **{"max_tokens": 2, **extra, field: value}
        )
    body = info.value.body
    assert info.value.status_code == 400 and body["param"] == field
    assert field in body["message"] and isinstance(body["code"], str) and body["type"]


def test_cache_salt_as_sglangs_test_checks_it(client, model):
    """SGLang's test_cache_salt_effectiveness, in its shape: a chat request repeated with the
    same salt is served from the cache up to its last prompt token; another salt is not."""
    message = [{"role": "user", "content": f"[{uuid.uuid4().hex}] What is the capital of Japan?"}]

    def ask(salt):
        r = client.chat.completions.create(
            model=model, messages=message, temperature=0, max_tokens=10,
            extra_body={"cache_salt": salt},
        )
        return r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens

    first, prompt_tokens = ask("salt1")
    second, _ = ask("salt1")
    assert first == 0 and second == prompt_tokens - 1
    other_first, _ = ask("salt2")
    other_second, _ = ask("salt2")
    assert other_first == 0 and other_second == prompt_tokens - 1
