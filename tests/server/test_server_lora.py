"""LoRA over HTTP: OpenAI ``model`` names an adapter (404 when unknown), /v1/models lists them
with the base as parent, native ``lora_path``, and vLLM's load/unload routes."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.runtime.lora.lora_helpers import make_adapter, peft_greedy
from tests.server.server_helpers import flush_and_check_no_leak, launch_server

PROMPT = [1, 5, 9, 200, 17, 33, 4]
NEW = 6


@pytest.fixture(scope="module")
def setup(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-http")
    one = make_adapter(tiny_llama, str(root / "one"), seed=11)
    two = make_adapter(tiny_llama, str(root / "two"), seed=12, r=2)
    server = launch_server(tiny_llama, "--lora-paths", f"one={one}", "--max-loras", "2")
    want = {
        name: peft_greedy(tiny_llama, path, [PROMPT], NEW)[0]
        for name, path in (("one", one), ("two", two), (None, None))
    }
    yield server, {"one": one, "two": two}, want
    server.stop()


def test_model_names_an_adapter_and_models_lists_it(setup, tiny_llama):
    server, paths, want = setup
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
    models = {m.id: m for m in client.models.list().data}
    assert models["one"].model_extra["parent"] == tiny_llama
    assert models["one"].model_extra["root"] == paths["one"]
    for model, name in (("one", "one"), (tiny_llama, None)):
        out = client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=NEW,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
        assert out.model == model
        with httpx.Client(base_url=server.url) as http:
            ids = http.post(
                "/tokenize", json={"prompt": out.choices[0].text, "add_special_tokens": False}
            ).json()["tokens"]
        assert ids == want[name], model
    with pytest.raises(openai.NotFoundError, match="'nope' does not exist"):
        client.completions.create(model="nope", prompt=PROMPT, max_tokens=2)


def test_native_lora_path_and_load_unload_routes(setup):
    server, paths, want = setup
    with httpx.Client(base_url=server.url, timeout=60) as http:
        params = {"max_new_tokens": NEW, "temperature": 0}
        r = http.post(
            "/generate", json={"input_ids": PROMPT, "sampling_params": params, "lora_path": "two"}
        )
        assert r.status_code == 400 and "'two' is not a loaded LoRA adapter" in r.text
        r = http.post("/v1/load_lora_adapter", json={"lora_name": "two", "lora_path": paths["two"]})
        assert r.status_code == 200 and set(r.json()["loaded_adapters"]) == {"one", "two"}
        r = http.post(
            "/generate",
            json={
                "input_ids": [PROMPT] * 3,
                "sampling_params": params,
                "lora_path": ["two", None, "one"],
            },
        )
        assert [o["output_ids"] for o in r.json()] == [want["two"], want[None], want["one"]]
        r = http.post("/load_lora_adapter", json={"lora_name": "bad", "lora_path": "/nowhere"})
        assert r.status_code == 400 and "is not a directory" in r.json()["error"]["message"]
        r = http.post("/unload_lora_adapter", json={"lora_name": "two"})
        assert r.status_code == 200 and set(r.json()["loaded_adapters"]) == {"one"}
        r = http.post("/v1/unload_lora_adapter", json={"lora_name": "two"})
        assert r.status_code == 404
        r = http.post("/v1/completions", json={"model": "two", "prompt": "hi", "max_tokens": 1})
        assert r.status_code == 404
        flush_and_check_no_leak(http)
