"""Native routes over httpx: /generate (plain, batch, streamed), info, cache, tokenizer, metrics."""

from __future__ import annotations

import itertools
import json

GREEDY = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}


def sse_frames(response) -> list:
    frames = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


def test_generate_text_and_input_ids_agree(tiny_client):
    by_text = tiny_client.post("/generate", json={"text": "Hello", "sampling_params": GREEDY})
    by_text = by_text.json()
    ids = tiny_client.post("/tokenize", json={"text": "Hello"}).json()["tokens"]
    by_ids = tiny_client.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY})
    by_ids = by_ids.json()
    assert by_text["output_ids"] == by_ids["output_ids"] and len(by_ids["output_ids"]) == 6
    meta = by_text["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 6
    assert {"id", "cached_tokens", "e2e_latency"} <= set(meta)


def test_generate_batch_returns_a_list(tiny_client):
    out = tiny_client.post("/generate", json={
        "text": ["a", "b", "c"], "sampling_params": {"max_new_tokens": 2},
        "rid": ["r1", "r2", "r3"],
    }).json()
    assert [o["meta_info"]["id"] for o in out] == ["r1", "r2", "r3"]


def test_generate_logprobs(tiny_client):
    out = tiny_client.post("/generate", json={
        "text": "one two three", "sampling_params": GREEDY, "return_logprob": True,
        "logprob_start_len": 0, "top_logprobs_num": 2, "return_text_in_logprobs": True,
    }).json()
    meta = out["meta_info"]
    assert len(meta["output_token_logprobs"]) == 6
    lp, tid, text = meta["output_token_logprobs"][0]
    assert lp <= 0 and tid == out["output_ids"][0] and isinstance(text, str)
    assert meta["input_token_logprobs"][0][0] is None
    assert all(len(row) == 2 for row in meta["output_top_logprobs"])


def test_generate_stream_frames_carry_text_so_far(tiny_client):
    body = {"text": "Hello", "sampling_params": GREEDY, "stream": True}
    with tiny_client.stream("POST", "/generate", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        frames = sse_frames(response)
    texts = [f["text"] for f in frames]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert frames[-1]["meta_info"]["finish_reason"]["type"] == "length"
    full = tiny_client.post("/generate", json={"text": "Hello", "sampling_params": GREEDY}).json()
    assert texts[-1] == full["text"]


def test_generate_stream_of_several_samples_is_indexed(tiny_client):
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 3, "n": 2}, "stream": True}
    with tiny_client.stream("POST", "/generate", json=body) as response:
        frames = sse_frames(response)
    assert {f["index"] for f in frames} == {0, 1}


def test_health_and_health_generate(tiny_client):
    assert tiny_client.get("/health").status_code == 200
    assert tiny_client.get("/health_generate").status_code == 200


def test_model_and_server_info(tiny_client, tiny_llama):
    info = tiny_client.get("/get_model_info").json()
    assert info["model_path"] == tiny_llama and info["is_generation"] is True
    assert "tokenizer_path" in info
    server = tiny_client.get("/get_server_info").json()
    assert server["max_total_tokens"] == 16384 and server["max_running_requests"] == 64
    assert "api_key" not in server
    # NOTE: 0: neither process imports torch
    assert server["threads"]["server"] == server["threads"]["detokenizer"] == 0
    expected = {"num_running", "free_tokens", "kv_invariant_ok", "cache_hit_rate"}
    assert expected <= set(server["stats"])


def test_flush_cache_empties_the_radix_tree(tiny_client):
    tiny_client.post("/generate", json={"text": "cache me " * 8, "sampling_params": GREEDY})
    before = tiny_client.get("/get_server_info").json()["stats"]
    assert before["evictable_tokens"] > 0
    assert tiny_client.post("/flush_cache").json() == {"success": True, "tiers": ["memory"]}
    after = tiny_client.get("/get_server_info").json()["stats"]
    assert after["evictable_tokens"] == 0 and after["free_tokens"] == after["max_total_tokens"]


def test_abort_request_ends_a_running_request(tiny_client, tiny_server):
    body = {"text": "go", "rid": "to-abort", "stream": True,
            "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}}
    with tiny_client.stream("POST", "/generate", json=body) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        with tiny_server.client() as other:
            aborted = other.post("/abort_request", json={"rid": "to-abort"}).json()["aborted"]
            assert aborted == ["to-abort"]
        frames = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert frames[-1]["meta_info"]["finish_reason"] == {"type": "abort", "message": "aborted"}
    assert len(frames[-1]["output_ids"]) < 900


def test_tokenize_detokenize_round_trip(tiny_client):
    tokens = tiny_client.post("/tokenize", json={"text": "round trip"}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == 1024
    text = tiny_client.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["text"]
    assert text.endswith("round trip")
    assert tiny_client.post("/detokenize", json={"tokens": [-1]}).status_code == 400


def test_metrics_use_the_radixlm_names(tiny_client):
    tiny_client.post("/generate", json={"text": "metrics", "sampling_params": GREEDY})
    text = tiny_client.get("/metrics").text
    for name in (
        "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
        "prefix_cache_queries_total", "prefix_cache_hits_total", "prompt_tokens_total",
        "generation_tokens_total", "num_preemptions_total", "time_to_first_token_seconds_bucket",
        "inter_token_latency_seconds_bucket", "e2e_request_latency_seconds_bucket",
    ):
        assert f"radixlm:{name}" in text, name
    success = [ln for ln in text.splitlines() if ln.startswith("radixlm:request_success_total{")]
    assert any('finished_reason="length"' in ln for ln in success)
    generated = [ln for ln in text.splitlines() if ln.startswith("radixlm:generation_tokens_total")]
    assert float(generated[0].split()[-1]) >= 6
