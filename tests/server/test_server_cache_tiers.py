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
    ("/cache/save", {"text": "x"}),  # NOTE: this server has no disk tier
])  # fmt: skip
def test_bad_cache_fields_are_400_naming_the_field(tiny_client, route, body):
    r = tiny_client.post(route, json=body)
    assert r.status_code == 400, r.text
    field = "cache_salt" if "cache_salt" in body else "tiers" if "tiers" in body else "kv_disk"
    assert field in r.text


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
            saved = client.post("/cache/save", json={"text": PROMPT + " saved"}).json()
            assert saved["pinned_tokens"] >= saved["prompt_tokens"] - 16, saved
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


def test_each_api_key_tenant_gets_its_own_cache(tiny_llama, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("key-a acme\nkey-b globex\n\nkey-c\n")
    server = launch_server(tiny_llama, "--api-keys-file", str(keys))
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 1}}

    def cached(key: str, **extra) -> int:
        r = client.post("/generate", json={**body, **extra},
                        headers={"Authorization": f"Bearer {key}"})  # fmt: skip
        assert r.status_code == 200, r.text
        return r.json()["meta_info"]["cached_tokens"]

    try:
        with server.client() as client:
            assert cached("key-a") == 0 and cached("key-a") > 0
            assert cached("key-b") == 0  # NOTE: another tenant, same prompt
            assert cached("key-c") == 0 and cached("key-c") > 0  # tenant-4
            assert cached("key-b", cache_salt="acme") == 0  # cannot name another tenant's salt
            r = client.post("/generate", json=body, headers={"Authorization": "Bearer nope"})
            assert r.status_code == 401
    finally:
        server.stop()


def test_a_bad_api_keys_file_stops_the_server_before_loading(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "keys"
    bad.write_text("key tenant extra\n")
    for path, message in [(bad, "line 1: expected 'KEY [TENANT]'"),
                          (tmp_path / "missing", "No such file")]:  # fmt: skip
        run = subprocess.run(
            [sys.executable, "-m", "radixlm.server", "--api-keys-file", str(path),
             "--port", "0"], capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 1 and "radixlm serve: error: api_keys_file" in run.stderr
        assert message in run.stderr
