"""Bad input gets OpenAI's error body with the right status and names what is wrong."""

from __future__ import annotations

import pytest

CHAT = [{"role": "user", "content": "hi"}]


def assert_error(response, status: int, *words: str, param: str | None = "any") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"], error
    if param != "any":
        assert error["param"] == param, error
    return error


@pytest.mark.parametrize("path", ["/generate", "/v1/completions", "/v1/chat/completions"])
def test_malformed_json_is_400(tiny_client, path):
    headers = {"content-type": "application/json"}
    response = tiny_client.post(path, content=b'{"text": "x",', headers=headers)
    assert_error(response, 400, "malformed JSON")


@pytest.mark.parametrize("body, field", [
    ({"prompt": "x", "temperature": 3.5}, "temperature"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "top_k": -7}, "top_k"),
    ({"prompt": "x", "logprobs": 99}, "logprobs"),
    ({"prompt": "x", "logit_bias": {"1": 500}}, "logit_bias"),
    ({"prompt": 5}, "prompt"),
    ({"temperature": 0.5}, "prompt"),
])
def test_bad_completion_parameter_names_the_field(tiny_client, body, field):
    error = assert_error(tiny_client.post("/v1/completions", json=body), 400, field)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("body, field", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"messages": CHAT, "top_logprobs": 50}, "top_logprobs"),
    ({"messages": CHAT, "response_format": {"type": "yaml"}}, "response_format"),
    ({"messages": CHAT, "tools": [{"type": "function"}]}, "tools"),
])
def test_bad_chat_parameter_names_the_field(tiny_client, body, field):
    assert_error(tiny_client.post("/v1/chat/completions", json=body), 400, field)


@pytest.mark.parametrize("sampling, field", [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_new_tokens": "many"}, "max_new_tokens"),
    ({"made_up": 1}, "made_up"),
])
def test_bad_native_sampling_parameter_names_the_field(tiny_client, sampling, field):
    response = tiny_client.post("/generate", json={"text": "x", "sampling_params": sampling})
    assert_error(response, 400, field)


def test_native_shape_errors(tiny_client):
    response = tiny_client.post("/generate", json={"sampling_params": {}})
    assert_error(response, 400, "text", "input_ids")
    response = tiny_client.post("/generate", json={"input_ids": [10**9]})
    assert_error(response, 400, "input_ids")
    response = tiny_client.post("/generate", json={"text": "x", "extra_thing": True})
    assert_error(response, 400, "extra_thing", param="extra_thing")


def test_context_overflow_gives_both_numbers(tiny_client):
    prompt = "word " * 300
    n_prompt = tiny_client.post("/tokenize", json={"text": prompt}).json()["count"]
    response = tiny_client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1000})
    assert_error(response, 400, str(n_prompt), "1000", "1024", "max_tokens")
    response = tiny_client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 5000})
    assert_error(response, 400, "5000", "1024")
    response = tiny_client.post("/generate", json={"text": "word " * 1100})
    assert_error(response, 400, "1024")


def test_streaming_errors_keep_their_status(tiny_client):
    body = {"prompt": "x", "max_tokens": 5000, "stream": True}
    assert_error(tiny_client.post("/v1/completions", json=body), 400, "5000")


def test_unknown_model_is_404(tiny_client):
    response = tiny_client.post("/v1/chat/completions", json={"model": "nope", "messages": CHAT})
    error = assert_error(response, 404, "nope", param="model")
    assert error["code"] == "model_not_found"


def test_two_constraints_at_once_is_400(tiny_client):
    body = {"messages": CHAT, "regex": "[ab]+", "response_format": {"type": "json_object"}}
    assert_error(tiny_client.post("/v1/chat/completions", json=body), 400, "response_format")
    body = {"prompt": "x", "regex": "[ab]+", "json_schema": {"type": "object"}}
    assert_error(tiny_client.post("/v1/completions", json=body), 400, "regex", "json_schema")


def test_unknown_route_is_404_with_error_body(tiny_client):
    assert_error(tiny_client.get("/v2/nothing"), 404)
