"""The tokenizer routes in SGLang's and vLLM's shapes, and what lm-eval's remote tokenizer reads."""

from __future__ import annotations

import pytest


def _tokens(client, **body):
    response = client.post("/tokenize", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_prompt_is_vllms_name_for_text(tiny_client):
    assert _tokens(tiny_client, prompt="same words") == _tokens(tiny_client, text="same words")
    bare = _tokens(tiny_client, prompt="same words", add_special_tokens=False)["tokens"]
    full = _tokens(tiny_client, prompt="same words")["tokens"]
    assert full[-len(bare) :] == bare and len(full) >= len(bare)


def test_messages_are_rendered_by_the_chat_template(tiny_client):
    messages = [{"role": "user", "content": "What is two plus two?"}]
    chat = _tokens(tiny_client, messages=messages, add_generation_prompt=True)
    rendered = tiny_client.post("/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    assert "What is two plus two?" in rendered
    plain = _tokens(tiny_client, text="What is two plus two?", add_special_tokens=False)
    assert chat["count"] > plain["count"]  # the template's role markers are there


def test_token_strs_are_the_tokens_pieces(tiny_client):
    out = _tokens(tiny_client, prompt="hello world", return_token_strs=True)
    assert len(out["token_strs"]) == len(out["tokens"])
    assert all(isinstance(piece, str) for piece in out["token_strs"])
    assert "token_strs" not in _tokens(tiny_client, prompt="hello world")


def test_detokenize_answers_in_both_names(tiny_client):
    ids = _tokens(tiny_client, prompt="both names", add_special_tokens=False)["tokens"]
    out = tiny_client.post("/detokenize", json={"tokens": ids, "model": "tiny"}).json()
    assert out["text"] == out["prompt"] and out["prompt"].endswith("both names")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"text": "a", "prompt": "b"},
        {"prompt": "a", "messages": [{"role": "user", "content": "b"}]},
        {"messages": []},
    ],
)
def test_exactly_one_input_or_400(tiny_client, body):
    response = tiny_client.post("/tokenize", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_another_model_is_404(tiny_client):
    response = tiny_client.post("/tokenize", json={"prompt": "x", "model": "not-served"})
    assert response.status_code == 404


def test_tokenizer_info_has_what_lm_eval_reads(tiny_client):
    info = tiny_client.get("/tokenizer_info").json()
    for key in ("eos_token", "bos_token", "pad_token", "chat_template"):
        assert key in info
    assert info["eos_token"] and info["model_max_length"] == 1024
    assert info["eos_token_ids"] and all(0 <= t < info["vocab_size"] for t in info["eos_token_ids"])
    eos = _tokens(tiny_client, prompt=info["eos_token"], add_special_tokens=False)["tokens"]
    assert eos[0] in info["eos_token_ids"]
