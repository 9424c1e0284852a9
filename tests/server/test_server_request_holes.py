"""Holes bad input opened in the request path: integers beyond 64 bits, n out of range, rids
matched by prefix or reused, and request state left behind by a failure (issue #13)."""

from __future__ import annotations

import json
import threading

import pytest

BIG = 2**70
NATIVE_BIG = [
    ({"sampling_params": {"sampling_seed": BIG}}, "sampling_seed"),
    ({"sampling_params": {"seed": -BIG}}, "sampling_seed"),
    ({"sampling_params": {"top_k": BIG}}, "top_k"),
    ({"sampling_params": {"stop_token_ids": [BIG]}}, "stop_token_ids"),
    ({"sampling_params": {"min_new_tokens": BIG, "max_new_tokens": BIG}}, "max_new_tokens"),
    ({"logprob_start_len": BIG}, "logprob_start_len"),
    ({"return_logprob": True, "logprob_start_len": BIG}, "logprob_start_len"),
    ({"sampling_params": {"n": 0}}, "n must be"),
    ({"sampling_params": {"n": 1000}}, "n must be"),
    ({"sampling_params": {"n": True}}, "n must be"),
]


@pytest.mark.parametrize(("extra", "needle"), NATIVE_BIG)
def test_out_of_range_integers_are_400_naming_the_field(tiny_client, extra, needle):
    r = tiny_client.post("/generate", json={"text": "hi", **extra})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


@pytest.mark.parametrize("field", ["seed", "top_k", "min_tokens"])
def test_openai_routes_bound_integers_too(tiny_client, field):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, field: BIG}
    r = tiny_client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text


def test_no_request_state_is_left_after_failures(tiny_client):
    for extra, _ in NATIVE_BIG * 2:
        tiny_client.post("/generate", json={"text": "hi", **extra})
    assert tiny_client.get("/get_server_info").json()["requests_in_flight"] == 0
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
    assert tiny_client.post("/generate", json=body).status_code == 200


def _stream_in_background(server, rid: str, tokens: int) -> tuple[threading.Thread, list]:
    frames: list = []
    started = threading.Event()

    def run() -> None:
        body = {"text": "go", "rid": rid, "stream": True,
                "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
        with server.client() as c, c.stream("POST", "/generate", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    frames.append(json.loads(line[6:]))
                    started.set()
        started.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(60)
    return thread, frames


def test_abort_matches_rids_exactly(tiny_server, tiny_client):
    thread, frames = _stream_in_background(tiny_server, "alice-session-42", 200)
    assert tiny_client.post("/abort_request", json={"rid": "alice"}).json()["aborted"] == []
    thread.join(120)
    assert frames[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_a_rid_in_flight_is_409_and_a_finished_one_is_reusable(tiny_server, tiny_client):
    thread, _ = _stream_in_background(tiny_server, "dup", 300)
    r = tiny_client.post("/generate", json={"text": "x", "rid": "dup"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "rid_in_flight"
    tiny_client.post("/abort_request", json={"rid": "dup"})
    thread.join(120)
    again = tiny_client.post(
        "/generate", json={"text": "x", "rid": "dup", "sampling_params": {"max_new_tokens": 3}}
    )
    assert again.status_code == 200
    assert again.json()["meta_info"]["finish_reason"]["type"] == "length"


def test_samples_of_n_are_aborted_through_their_parent(tiny_server, tiny_client):
    body = {"text": "go", "rid": "fam", "stream": True,
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True, "n": 2}}
    with tiny_client.stream("POST", "/generate", json=body) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        with tiny_server.client() as other:
            aborted = other.post("/abort_request", json={"rid": "fam"}).json()["aborted"]
        assert sorted(aborted) == ["fam-0", "fam-1"]
        for _ in lines:
            pass


SURROGATE = '"a\\ud800b"'  # JSON text of a string holding a lone surrogate


@pytest.mark.parametrize(("route", "body", "needle"), [
    ("/generate", '{"text": S}', "text"),
    ("/generate", '{"text": "a", "sampling_params": {"stop": [S]}}', "stop[0]"),
    ("/tokenize", '{"text": S}', "text"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": S}]}', "messages"),
])
def test_lone_surrogates_are_400_naming_the_field(tiny_client, route, body, needle):
    body = body.replace("S", SURROGATE)
    r = tiny_client.post(route, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(f"{needle} is not valid Unicode")


def test_oversized_bodies_are_413_before_parsing(tiny_client):
    huge = b'{"text": "' + b"a" * (9 * 1024 * 1024) + b'"}'
    r = tiny_client.post("/generate", content=huge)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert r.json()["error"]["message"].startswith("Payload Too Large")  # NOTE: SGLang's words

    def chunks():  # no Content-Length: refused while it is read
        for _ in range(10):
            yield b"a" * (1024 * 1024)

    r = tiny_client.post("/generate", content=chunks())
    assert r.status_code == 413
    assert tiny_client.get("/health").status_code == 200
