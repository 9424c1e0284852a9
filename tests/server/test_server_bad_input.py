"""Every route x every kind of bad input: a 4xx whose message names the field, never a 5xx; and
afterwards the server still answers and holds no request state (issue #13)."""

from __future__ import annotations

import copy
import json

import pytest

BIG = 2**70
SURROGATE = "\ud800"
DEEP = {"type": "object"}
for _ in range(150):
    DEEP = {"type": "object", "properties": {"a": DEEP}, "required": ["a"]}

USER = [{"role": "user", "content": "hi"}]
ROUTES = {
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 2}},
    "/v1/completions": {"model": "tiny", "prompt": "hi", "max_tokens": 2},
    "/v1/chat/completions": {"model": "tiny", "messages": USER, "max_tokens": 2},
    "/tokenize": {"text": "hi"},
    "/detokenize": {"tokens": [1, 2]},
    "/abort_request": {"rid": "x"},
}
SAMPLING = {"/generate": "sampling_params.", "/v1/completions": "", "/v1/chat/completions": ""}


def _cases() -> list[tuple[str, str, object, str]]:
    """(route, dotted field, bad value, text the error message must contain)."""
    cases = []
    for route, prefix in SAMPLING.items():
        max_tokens = "sampling_params.max_new_tokens" if prefix else "max_tokens"
        cases += [
            (route, max_tokens, BIG, max_tokens.split(".")[-1]),
            (route, max_tokens, -1, max_tokens.split(".")[-1]),
            (route, max_tokens, "two", max_tokens.split(".")[-1]),
            (route, prefix + "temperature", "hot", "temperature"),
            (route, prefix + "temperature", float("inf"), "temperature"),
            (route, prefix + "top_p", 7, "top_p"),
            (route, prefix + "top_k", BIG, "top_k"),
            (route, prefix + "n", 0, "n"),
            (route, prefix + "n", 1000, "n"),
            (route, prefix + "stop", ["x"] * 5000, "stop"),
            (route, prefix + "stop", ["y" * 100_000], "stop"),
            (route, prefix + "stop", [SURROGATE], "stop"),
            (route, prefix + ("sampling_seed" if prefix else "seed"), BIG, "seed"),
        ]
    cases += [
        ("/generate", "text", 5, "text"),
        ("/generate", "text", "a" + SURROGATE, "text"),
        ("/generate", "input_ids", [BIG], "input_ids"),
        ("/generate", "rid", 5, "rid"),
        ("/generate", "return_logprob", "yes", "return_logprob"),
        ("/generate", "logprob_start_len", BIG, "logprob_start_len"),
        ("/generate", "sampling_params.regex", "(", "regex"),
        ("/generate", "sampling_params.regex", "a{100000}", "regex"),
        ("/generate", "sampling_params.json_schema", "{not json", "json_schema"),
        ("/generate", "sampling_params.json_schema", json.dumps(DEEP), "json_schema"),
        ("/generate", "sampling_params.stop_token_ids", [BIG], "stop_token_ids"),
        ("/generate", "sampling_params.stop_token_ids", 5, "stop_token_ids"),
        ("/generate", "sampling_params.ignore_eos", "yes", "ignore_eos"),
        ("/generate", "sampling_params.skip_special_tokens", 1, "skip_special_tokens"),
        ("/v1/completions", "prompt", {"a": 1}, "prompt"),
        ("/v1/completions", "prompt", [BIG], "prompt"),
        ("/v1/completions", "logprobs", 100, "logprobs"),
        ("/v1/completions", "logit_bias", {"x": 1}, "logit_bias"),
        ("/v1/chat/completions", "messages", "hi", "messages"),
        ("/v1/chat/completions", "messages", [], "messages"),
        ("/v1/chat/completions", "messages.0.role", "wizard", "role"),
        ("/v1/chat/completions", "messages.0.content", SURROGATE, "messages"),
        ("/v1/chat/completions", "top_logprobs", BIG, "top_logprobs"),
        ("/v1/chat/completions", "tools", [{"type": "x"}], "tools"),
        ("/v1/chat/completions", "tool_choice", "required", "tool_choice"),
        (
            "/v1/chat/completions",
            "response_format",
            {"type": "json_schema", "json_schema": {"name": "d", "schema": DEEP}},
            "json_schema",
        ),
        ("/v1/chat/completions", "response_format", {"type": "yaml"}, "response_format"),
        ("/tokenize", "text", 5, "text"),
        ("/tokenize", "text", SURROGATE, "text"),
        ("/detokenize", "tokens", ["a"], "tokens"),
        ("/detokenize", "tokens", [BIG], "tokens"),
        ("/abort_request", "rid", 5, "rid"),
    ]
    return cases


CASES = _cases()


def _with(body: dict, field: str, value: object) -> dict:
    body = copy.deepcopy(body)
    *path, last = field.split(".")
    node = body
    for key in path:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return body


def _post(client, route: str, body: dict):
    text = json.dumps(body, allow_nan=True)  # NOTE: inf travels as the bare word Infinity
    return client.post(route, content=text, headers={"content-type": "application/json"})


def _assert_client_error(r, needle: str) -> None:
    assert 400 <= r.status_code < 500, r.text
    error = r.json()["error"]
    assert isinstance(error["code"], str) and error["type"]
    assert needle in error["message"], error["message"]


@pytest.mark.parametrize(
    ("route", "field", "value", "needle"), CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES]
)
def test_bad_field_is_4xx_naming_it(tiny_client, route, field, value, needle):
    _assert_client_error(_post(tiny_client, route, _with(ROUTES[route], field, value)), needle)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"text": ', "JSON"),
        (b"[1, 2]", "object"),
        (b"\xff\xfe", "JSON"),
        (b"", "JSON object"),
    ],
    ids=["truncated", "not-an-object", "not-utf8", "empty"],
)
def test_malformed_bodies_are_400(tiny_client, route, body, needle):
    r = tiny_client.post(route, content=body, headers={"content-type": "application/json"})
    _assert_client_error(r, needle)


@pytest.mark.parametrize("route", list(ROUTES))
def test_64_mib_bodies_are_413(tiny_client, route):
    r = tiny_client.post(route, content=b"{" + b" " * (64 * 1024 * 1024) + b"}")
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


def test_after_all_of_it_the_server_answers_and_holds_nothing(tiny_client):
    for route, field, value, _ in CASES:
        _post(tiny_client, route, _with(ROUTES[route], field, value))
    assert tiny_client.get("/get_server_info").json()["requests_in_flight"] == 0
    for route, body in ROUTES.items():
        assert _post(tiny_client, route, body).status_code == 200, route
