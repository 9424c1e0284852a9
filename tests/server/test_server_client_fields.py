"""Fields clients send, through the official openai client's ``extra_body``: unknown ones are
ignored and named, ``logit_bias`` forces and bans tokens, vLLM's and SGLang's structured-output
fields constrain the output; a known field with a bad value is still a 400 naming it."""

from __future__ import annotations

import json
import re

import openai
import pytest
from test_server_errors import assert_error

CHAT = [{"role": "user", "content": "Say something."}]
HEADER = "x-radixlm-ignored-fields"


@pytest.fixture(scope="module")
def oai(tiny_server):
    return openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0)


def _token(client, text: str) -> int:
    ids = client.post("/tokenize", json={"text": text, "add_special_tokens": False}).json()
    return ids["tokens"][0]


# -- unknown fields -------------------------------------------------------------------------------


EVERY = "metadata, service_tier, store, zz_next_month"


@pytest.mark.parametrize("path, body, named", [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, EVERY),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}, EVERY),
    # NOTE: the Responses API defines the first three (accepted, not used)
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 2}, "zz_next_month"),
])  # fmt: skip
def test_unknown_fields_are_ignored_and_named(tiny_client, path, body, named):
    extra = {"store": False, "metadata": {"k": "v"}, "service_tier": "auto", "zz_next_month": 1}
    plain = tiny_client.post(path, json={**body, "temperature": 0})
    r = tiny_client.post(path, json={**body, **extra, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.headers[HEADER] == named
    assert HEADER not in plain.headers
    if path != "/v1/responses":  # NOTE: its items carry fresh ids; compare completions' text
        key = "text" if path == "/v1/completions" else "message"
        assert r.json()["choices"][0][key] == plain.json()["choices"][0][key]


def test_unknown_fields_on_a_stream_are_named_in_its_headers(tiny_client):
    body = {"prompt": "Hi", "max_tokens": 3, "stream": True, "prompt_cache_key": "x"}
    with tiny_client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers[HEADER] == "prompt_cache_key"
        assert "[DONE]" in "".join(r.iter_text())


def test_openai_client_extra_fields_reach_the_server(oai):
    raw = oai.chat.completions.with_raw_response.create(
        model="tiny", messages=CHAT, max_tokens=2, store=True, metadata={"a": "b"},
        extra_body={"verbosity": "low"},
    )  # fmt: skip
    assert raw.headers[HEADER] == "metadata, store, verbosity"
    assert raw.parse().choices[0].finish_reason == "length"


@pytest.mark.parametrize("body, field", [
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"a": 1}}, "logit_bias"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"logit_bias": "x"}, "logit_bias"),
    ({"guided_choice": "yes"}, "guided_choice"),
    ({"guided_regex": "a", "guided_json": {}}, "guided_regex, guided_json"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.regex"),
    ({"structured_outputs": {"bogus": 1}}, "structured_outputs.bogus"),
    ({"ebnf": "root ::= ("}, "ebnf"),
    ({"guided_grammar": "root ::= undefined"}, "ebnf"),
    ({"response_format": {"type": "json_object"}, "regex": "a"}, "response_format"),
    ({"priority": 1}, "priority"),  # NOTE: the tiny server's policy is lpm, not priority
    ({"priority": 2**40}, "priority"),
])  # fmt: skip
def test_known_fields_with_bad_values_are_still_400(tiny_client, body, field):
    r = tiny_client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, **body})
    assert_error(r, 400, field)


# -- logit_bias -----------------------------------------------------------------------------------


def test_logit_bias_forces_and_bans_tokens(oai, tiny_client):
    token = _token(tiny_client, " the")
    forced = oai.completions.create(
        model="tiny", prompt="Once", max_tokens=4, temperature=0, logit_bias={str(token): 100}
    )
    word = tiny_client.post("/detokenize", json={"tokens": [token] * 4}).json()["text"]
    assert forced.choices[0].text == word
    plain = oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6, temperature=0)
    ids = tiny_client.post("/tokenize", json={
        "text": plain.choices[0].message.content, "add_special_tokens": False,
    }).json()["tokens"]  # fmt: skip
    banned = oai.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=6, temperature=0,
        logit_bias={str(t): -100 for t in set(ids[:1])},
    )  # fmt: skip
    assert banned.choices[0].message.content != plain.choices[0].message.content


# -- structured outputs ---------------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _check_json(text: str) -> bool:
    obj = json.loads(text)
    return set(obj) == {"name", "age"} and isinstance(obj["age"], int)


@pytest.mark.parametrize("extra, check", [
    ({"guided_choice": ["alpha", "beta"]}, lambda t: t in ("alpha", "beta")),
    ({"guided_regex": "[0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch("[0-9]{3}-[a-z]{2}", t)),
    ({"guided_json": SCHEMA}, _check_json),
    ({"guided_grammar": 'root ::= "yes" | "no"'}, lambda t: t in ("yes", "no")),
    ({"structured_outputs": {"choice": ["up", "down"]}}, lambda t: t in ("up", "down")),
    ({"structured_outputs": {"json": SCHEMA}}, _check_json),
    ({"structured_outputs": {"regex": "[A-C]"}}, lambda t: t in ("A", "B", "C")),
    ({"structured_outputs": {"grammar": 'root ::= "x" [0-9]'}}, re.compile("x[0-9]").fullmatch),
    ({"ebnf": 'root ::= ("ab" | "cd") "!"'}, lambda t: t in ("ab!", "cd!")),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "p", "schema": SCHEMA}}}, _check_json),
])  # fmt: skip
@pytest.mark.parametrize("route", ["completions", "chat"])
def test_structured_output_fields_constrain_the_output(oai, extra, check, route):
    if route == "chat" and "response_format" in extra:
        pytest.skip("chat's response_format is covered by the chat tests")
    kw = {"model": "tiny", "max_tokens": 60, "temperature": 0.8, "seed": 3, "extra_body": extra}
    if route == "chat":
        out = oai.chat.completions.create(messages=CHAT, **kw).choices[0]
        text = out.message.content
    else:
        out = oai.completions.create(prompt="Answer:", **kw).choices[0]
        text = out.text
    assert out.finish_reason == "stop", text
    assert check(text), text


def test_json_object_on_completions(oai):
    out = oai.completions.create(
        model="tiny", prompt="JSON:", max_tokens=80, temperature=0,
        extra_body={"structured_outputs": {"json_object": True}},
    ).choices[0]  # fmt: skip
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text), dict)
    else:  # NOTE: a random model may write a long object; what it wrote is a prefix of one
        assert out.text.lstrip().startswith("{")


def test_include_stop_str_in_output(tiny_client):
    body = {"prompt": "Hi", "max_tokens": 8, "temperature": 0}
    text = tiny_client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    stop = text[2:4] if len(text) >= 4 else text
    kept = tiny_client.post("/v1/completions", json={
        **body, "stop": [stop], "include_stop_str_in_output": True,
    }).json()["choices"][0]["text"]  # fmt: skip
    trimmed = tiny_client.post("/v1/completions", json={**body, "stop": [stop]}).json()
    # NOTE: the stop string is kept, with the rest of the token it ended in
    assert stop in kept and text.startswith(kept)
    assert stop not in trimmed["choices"][0]["text"]
