"""``--skip-tokenizer-init``: token ids in and out; what needs text is a 400 naming the field."""

from __future__ import annotations

import pytest
from server_helpers import flush_and_check_no_leak, launch_server

IDS = [1, 17, 300, 4000, 42]
GREEDY = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def bare_client(bare_llama):
    server = launch_server(bare_llama, "--skip-tokenizer-init", "--max-total-tokens", "4096")
    try:
        with server.client() as client:
            yield client
            flush_and_check_no_leak(client)
    finally:
        server.stop()


def test_token_ids_in_token_ids_out(bare_client):
    out = bare_client.post("/generate", json={"input_ids": IDS, "sampling_params": GREEDY})
    assert out.status_code == 200, out.text
    assert len(out.json()["output_ids"]) == 4 and out.json()["text"] == ""
    assert bare_client.get("/get_model_info").json()["eos_token"] is None


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/generate", {"text": "hi"}, "text"),
        ("/generate", {"input_ids": IDS, "sampling_params": {"stop": "."}}, "stop"),
        ("/v1/completions", {"prompt": "hi"}, "prompt"),
        ("/v1/completions", {"prompt": IDS, "max_tokens": 4}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "messages"),
        ("/tokenize", {"text": "hi"}, None),
    ],
)
def test_what_needs_a_tokenizer_is_400(bare_client, path, body, param):
    response = bare_client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "skip" in error["message"] and error["param"] == param, error
