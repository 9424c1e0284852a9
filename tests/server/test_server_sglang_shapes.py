"""Where SGLang's own tests expect SGLang's shapes: tool_choice without tools, the Responses
usage's chat names, the context-length message, reasoning_content in every streamed delta,
/v1/score, token_ids_logprob."""

from __future__ import annotations

import json
import math

import pytest

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
        "temperature": 0}  # fmt: skip


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses"])
def test_tool_choice_auto_without_tools_is_plain_text(tiny_client, route):
    body = {**CHAT, "tool_choice": "auto"}
    if route == "/v1/responses":
        body = {"model": "tiny", "input": "Hi", "max_output_tokens": 4, "tool_choice": "auto"}
    r = tiny_client.post(route, json=body)
    assert r.status_code == 200, r.text
    r = tiny_client.post(route, json={**body, "tool_choice": "required"})
    assert r.status_code == 400 and "tool_choice" in r.json()["error"]["message"]


def test_responses_usage_has_the_chat_names_too(tiny_client):
    r = tiny_client.post("/v1/responses", json={"model": "tiny", "input": "Hi",
                                                 "max_output_tokens": 4}).json()  # fmt: skip
    usage = r["usage"]
    assert usage["prompt_tokens"] == usage["input_tokens"] > 0
    assert usage["completion_tokens"] == usage["output_tokens"] > 0


def test_context_length_message_reads_as_sglangs(tiny_client):
    r = tiny_client.post("/v1/completions", json={"model": "tiny", "prompt": "word " * 1100,
                                                   "max_tokens": 8})  # fmt: skip
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"].startswith("Requested token count exceeds the model's maximum context")
    assert error["code"] == "context_length_exceeded"


def test_every_chat_message_and_delta_has_reasoning_content(tiny_client):
    with tiny_client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        frames = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    deltas = [c["delta"] for f in frames for c in f["choices"]]  # the role chunk's too
    assert deltas[0]["role"] == "assistant" and len(deltas) > 1
    assert all("reasoning_content" in d for d in deltas)
    assert all(d["reasoning_content"] is None for d in deltas)  # the tiny model has no parser
    message = tiny_client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]
    assert "reasoning_content" in message and message["reasoning_content"] is None


def test_image_parts_are_refused_by_name(tiny_client):
    """What SGLang's image_qa sends through the OpenAI backend; text parts still work."""
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    text = {"type": "text", "text": "What is this?"}
    body = {**CHAT, "messages": [{"role": "user", "content": [text, picture]}]}
    r = tiny_client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "messages[0].content[1] (image_url) is not supported by this text-only model")
    r = tiny_client.post("/v1/chat/completions",
                         json={**CHAT, "messages": [{"role": "user", "content": [text]}]})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/generate"])
def test_max_tokens_beyond_the_context_reads_as_sglangs(tiny_client, route):
    """SGLang's words when max_tokens alone exceeds the context (not a prompt overflow, which
    clients tell by the code); the context length is named."""
    body = {**CHAT, "max_tokens": 5000}
    if route == "/v1/completions":
        body = {"model": "tiny", "prompt": "Hi", "max_tokens": 5000}
    elif route == "/generate":
        body = {"text": "Hi", "sampling_params": {"max_new_tokens": 5000}}
    r = tiny_client.post(route, json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    field = "max_new_tokens" if route == "/generate" else "max_completion_tokens"
    assert error["message"].startswith(f"{field} is too large: 5000. This model supports at most")
    assert "Requested token count exceeds the model's maximum context length" in error["message"]
    if route != "/generate":
        assert error["param"] == "max_tokens" and error["code"] != "context_length_exceeded"


def _generate(tiny_client, **fields):
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 3, "temperature": 0},
            "return_logprob": True, **fields}  # fmt: skip
    return tiny_client.post("/generate", json=body)


def test_token_ids_logprob_reports_the_asked_ids_at_every_output_token(tiny_client):
    """SGLang's token_ids_logprob: per output token, [logprob, id, text] of each asked id; the
    chosen token's entry equals its output_token_logprobs entry."""
    first = _generate(tiny_client, top_logprobs_num=2).json()["meta_info"]
    chosen = [entry[1] for entry in first["output_token_logprobs"]]
    meta = _generate(tiny_client, token_ids_logprob=[chosen[0], 0]).json()["meta_info"]
    rows = meta["output_token_ids_logprobs"]
    assert len(rows) == 3 and all([e[1] for e in row] == [chosen[0], 0] for row in rows)
    assert rows[0][0][0] == pytest.approx(first["output_token_logprobs"][0][0], abs=1e-4)
    assert all(e[0] <= 0 for row in rows for e in row)
    batch = tiny_client.post("/generate", json={
        "text": ["Hi", "Yo"], "sampling_params": {"max_new_tokens": 1}, "return_logprob": True,
        "token_ids_logprob": [[1], [2, 3]]}).json()  # fmt: skip
    assert [[e[1] for e in b["meta_info"]["output_token_ids_logprobs"][0]] for b in batch] \
        == [[1], [2, 3]]


@pytest.mark.parametrize("asked, words", [
    ([-1], "out-of-vocabulary"), ([2_000_000_000], "out-of-vocabulary"),
    ([[0]], "flat list of integers"), ([[0], [1, 2]], "flat list of integers"), ("3", "valid list"),
])  # fmt: skip
def test_token_ids_logprob_is_checked(tiny_client, asked, words):
    r = _generate(tiny_client, token_ids_logprob=asked)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_token_ids_logprob_of_a_batch_with_one_bad_id_is_refused_whole(tiny_client):
    r = tiny_client.post("/generate", json={
        "text": ["Hi", "Hi"], "sampling_params": {"max_new_tokens": 1}, "return_logprob": True,
        "token_ids_logprob": [[0], [2_000_000_000]]})  # fmt: skip
    assert r.status_code == 400 and "out-of-vocabulary" in r.text


def test_score_route_equals_the_generate_logprobs_and_checks_labels(tiny_client):
    """SGLang's /v1/score: each item's label probabilities are those /generate reports for the
    first token after query + item (the engine's are checked against transformers in
    tests/runtime/test_scoring.py)."""
    labels = [5, 17, 300]
    body = {"model": "tiny", "query": [11, 12, 13], "items": [[21], [22, 23]],
            "label_token_ids": labels}  # fmt: skip
    r = tiny_client.post("/v1/score", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "scoring" and out["model"] == "tiny"
    assert out["usage"]["prompt_tokens"] == 4 + 5
    for item, row in zip(body["items"], out["scores"]):
        gen = tiny_client.post("/generate", json={
            "input_ids": body["query"] + item, "return_logprob": True,
            "token_ids_logprob": labels, "sampling_params": {"max_new_tokens": 1}}).json()
        entries = {e[1]: e[0] for e in gen["meta_info"]["output_token_ids_logprobs"][0]}
        assert row == pytest.approx([math.exp(entries[t]) for t in labels], rel=1e-5)
    soft = tiny_client.post("/v1/score", json={**body, "apply_softmax": True}).json()["scores"]
    assert all(sum(row) == pytest.approx(1.0) for row in soft)
    text = {"query": "Is Paris in France? Answer:", "items": [" yes", " no"],
            "label_token_ids": labels, "item_first": True}
    assert len(tiny_client.post("/v1/score", json=text).json()["scores"]) == 2
    bad = tiny_client.post("/v1/score", json={**body, "label_token_ids": [10**7]})
    assert bad.status_code == 400 and bad.json()["type"] == "BadRequestError"  # NOTE: SGLang's
    assert "Token ID 10000000 is out of vocabulary" in bad.json()["error"]["message"]
    mixed = tiny_client.post("/v1/score", json={**body, "query": "text"})
    assert mixed.status_code == 400 and "both be text" in mixed.json()["error"]["message"]


def test_retrieving_an_unknown_model_is_a_404(tiny_client):
    assert tiny_client.get("/v1/models/tiny").json()["id"] == "tiny"
    r = tiny_client.get("/v1/models/not-served")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
