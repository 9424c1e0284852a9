"""SGLang's ``stop_regex``: generation stops where a pattern matches the output's recent text,
on /generate, /v1/completions and in programs; bad patterns are a 400 naming the field."""

from __future__ import annotations

import re

import pytest

PROMPT = "Once upon a time"
GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


def test_stop_regex_ends_the_output_at_the_match(tiny_client):
    full = tiny_client.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY}).json()
    text = full["text"]
    target = text[len(text) // 2 : len(text) // 2 + 3]
    pattern = re.escape(target[0]) + "." + re.escape(target[2])
    r = tiny_client.post("/generate", json={
        "text": PROMPT, "sampling_params": {**GREEDY, "stop_regex": [pattern, "zzzq+"]},
    }).json()  # fmt: skip
    match = re.search(pattern, text)
    assert r["text"] == text[: match.start()]
    # NOTE: SGLang's finish reason names the pattern; the text is cut where it matched
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    kept = tiny_client.post("/generate", json={
        "text": PROMPT, "sampling_params": {**GREEDY, "stop_regex": pattern, "no_stop_trim": True},
    }).json()  # fmt: skip
    # NOTE: untrimmed, the text runs to the end of the token that completed the match
    assert kept["text"].startswith(text[: match.end()]) and len(kept["text"]) < len(text)


def test_stop_regex_on_the_openai_route(tiny_client):
    r = tiny_client.post("/v1/completions", json={
        "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stop_regex": r"\s",
    }).json()  # fmt: skip
    choice = r["choices"][0]
    assert choice["finish_reason"] == "stop" and not re.search(r"\s", choice["text"])


@pytest.mark.parametrize("value, message", [
    ("(unclosed", "stop_regex '(unclosed' is not a valid regex"),
    ([""], "stop_regex must be a non-empty string"),
    (["a"] * 17, "stop_regex must hold at most 16 patterns"),
])  # fmt: skip
def test_bad_stop_regex_is_400(tiny_client, value, message):
    r = tiny_client.post("/generate", json={"text": "x", "sampling_params": {"stop_regex": value}})
    assert r.status_code == 400 and message in r.json()["error"]["message"]
