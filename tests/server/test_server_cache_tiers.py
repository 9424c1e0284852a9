"""The cache tiers over HTTP: ``cache_salt`` on every generation route, ``/flush_cache`` tiers,
and the disk tier's counters; a server restarted on the same directory serves a known prefix."""

from __future__ import annotations

import pytest
from server_helpers import launch_server

PROMPT = "You are the agent of tenant A. These are your tools and rules. " * 10


def cached_chat(client, salt: str | None) -> int:
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2}
    if salt is not None:
        body["cache_salt"] = salt
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_cache_salt_separates_tenants_on_the_openai_routes(tiny_client):
    assert tiny_client.post("/flush_cache").status_code == 200
    assert cached_chat(tiny_client, "a") == 0
    assert cached_chat(tiny_client, "b") == 0
    assert cached_chat(tiny_client, "a") > 0
    completion = {"prompt": PROMPT, "max_tokens": 1, "cache_salt": "d"}
    cached = [tiny_client.post("/v1/completions", json=completion).json()["usage"]
              ["prompt_tokens_details"]["cached_tokens"] for _ in range(2)]  # fmt: skip
    assert cached[0] == 0 and cached[1] > 0
    r = tiny_client.post("/generate", json={"text": PROMPT, "cache_salt": "c",
                                            "sampling_params": {"max_new_tokens": 1}})  # fmt: skip
    assert r.json()["meta_info"]["cached_tokens"] == 0


@pytest.mark.parametrize("route, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "cache_salt": ""}),
    ("/v1/completions", {"prompt": "x", "cache_salt": 7}),
    ("/generate", {"text": "x", "cache_salt": "s" * 257}),
    ("/flush_cache", {"tiers": ["memory", "tape"]}),
    ("/flush_cache", {"tiers": []}),
])  # fmt: skip
def test_bad_cache_fields_are_400_naming_the_field(tiny_client, route, body):
    r = tiny_client.post(route, json=body)
    assert r.status_code == 400, r.text
    assert ("cache_salt" if "cache_salt" in body else "tiers") in r.text


def test_a_restarted_server_serves_a_known_prefix_from_disk(tiny_llama, tmp_path):
    flags = ["--kv-disk-cache", str(tmp_path), "--kv-disk-block-size", "16",
             "--max-total-tokens", "4096"]  # fmt: skip
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    server = launch_server(tiny_llama, *flags)
    try:
        with server.client() as client:
            first = client.post("/generate", json=body).json()
    finally:
        server.stop()
    server = launch_server(tiny_llama, *flags)
    try:
        with server.client() as client:
            again = client.post("/generate", json=body).json()
            stats = client.get("/get_server_info").json()["stats"]
            metrics = client.get("/metrics").text
            assert client.post("/flush_cache", json={"tiers": ["disk"]}).json()["success"]
            assert client.get("/get_server_info").json()["stats"]["disk_blocks"] == 0
    finally:
        server.stop()
    meta = again["meta_info"]
    assert again["text"] == first["text"]
    assert meta["cached_tokens"] >= 0.9 * meta["prompt_tokens"]
    assert stats["disk_hit_tokens"] == meta["cached_tokens"]
    assert f'radixlm:kv_disk_hits_total{{model_name="{tiny_llama}"}} {meta["cached_tokens"]}.0' \
        in metrics
