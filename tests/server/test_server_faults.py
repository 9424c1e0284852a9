"""Faults: API keys, a full queue, disconnecting clients, a dead scheduler, SIGTERM."""

from __future__ import annotations

import glob
import json
import os
import signal
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from server_helpers import flush_and_check_no_leak, launch_server

from tests.conftest import force_token_processor

KEY = "s3cret-key"
LONG = {"max_new_tokens": 1000, "ignore_eos": True}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stats(client: httpx.Client) -> dict:
    return client.get("/get_server_info").json()["stats"]


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


def wait_idle(client: httpx.Client) -> dict:
    return wait_for(lambda: (s := stats(client))["num_running"] + s["num_waiting"] == 0 and s)


@pytest.fixture(scope="module")
def restricted(tiny_llama):
    """One running request at most, no queue, an API key, unknown fields refused and any model
    name answered; SGLang's flags for no chunking, incremental streams and its backend name."""
    server = launch_server(
        tiny_llama, "--max-total-tokens", "4096", "--api-key", KEY, "--strict-api",
        "--ignore-model-name",
        "--max-running-requests", "1", "--max-queued-requests", "0",
        "--chunked-prefill-size", "-1", "--incremental-streaming-output",
        "--attention-backend", "torch_native", "--enable-metrics",
        "--enable-custom-logit-processor",
    )
    yield server
    server.stop()


def test_api_key_is_required_except_for_health(restricted):
    with restricted.client() as c:
        assert c.get("/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            response = c.get("/v1/models", headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["type"] == "authentication_error"
        assert c.post("/generate", json={"text": "x"}).status_code == 401
        ok = c.get("/get_model_info", headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200
    client = openai.OpenAI(base_url=f"{restricted.url}/v1", api_key=KEY, max_retries=0)
    model = client.models.list().data[0].id
    assert client.completions.create(model=model, prompt="x", max_tokens=1).choices
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{restricted.url}/v1", api_key="nope", max_retries=0).models.list()


def test_strict_api_refuses_unknown_fields(restricted):
    client = openai.OpenAI(base_url=f"{restricted.url}/v1", api_key=KEY, max_retries=0)
    kw = {"model": client.models.list().data[0].id, "prompt": "hi", "max_tokens": 1}
    with pytest.raises(openai.BadRequestError, match="store") as e:
        client.completions.create(**kw, extra_body={"store": 1})
    assert e.value.body["param"] == "store"
    assert client.completions.create(**kw).choices[0].finish_reason == "length"


def test_ignore_model_name_answers_any_model(restricted):
    client = openai.OpenAI(base_url=f"{restricted.url}/v1", api_key=KEY, max_retries=0)
    out = client.completions.create(model="meta-llama/Llama-3.1-8B", prompt="hi", max_tokens=1)
    assert out.model == client.models.list().data[0].id  # NOTE: the served name, as SGLang
    with pytest.raises(openai.NotFoundError):  # NOTE: a lookup by name still 404s, as SGLang's
        client.models.retrieve("meta-llama/Llama-3.1-8B")
    assert client.models.retrieve(out.model).id == out.model


def test_sglang_flags_take_effect(restricted):
    with restricted.client(headers={"Authorization": f"Bearer {KEY}"}) as c:
        info = c.get("/get_server_info").json()
        assert info["chunked_prefill_size"] is None and info["attention_backend"] == "torch"
        params = {"max_new_tokens": 12, "ignore_eos": True, "temperature": 0}
        whole = c.post("/generate", json={"text": "count", "sampling_params": params}).json()
        body = {"text": "count", "sampling_params": params, "stream": True}
        with c.stream("POST", "/generate", json=body) as r:
            frames = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
        assert len(frames) > 1  # NOTE: each frame holds only its own new text and ids
        assert "".join(f["text"] for f in frames) == whole["text"]
        assert sum((f["output_ids"] for f in frames), []) == whole["output_ids"]
        assert c.get("/metrics").status_code == 200


def test_custom_logit_processors_over_http(restricted, tiny_client, smollm_tokenizer):
    processor = force_token_processor()
    body = {"input_ids": [5, 6, 7], "custom_logit_processor": processor,
            "sampling_params": {"max_new_tokens": 3, "custom_params": {"token_id": 42}}}
    with restricted.client(headers={"Authorization": f"Bearer {KEY}"}) as c:
        assert c.post("/generate", json=body).json()["output_ids"] == [42, 42, 42]
    client = openai.OpenAI(base_url=f"{restricted.url}/v1", api_key=KEY, max_retries=0)
    out = client.completions.create(model="any", prompt=[5, 6, 7], max_tokens=2, extra_body={
        "custom_logit_processor": processor, "custom_params": {"token_id": 42}})
    assert out.choices[0].text == smollm_tokenizer.decode([42, 42])
    off = tiny_client.post("/generate", json=body)  # NOTE: a server without the flag
    assert off.status_code == 400 and "--enable-custom-logit-processor" in off.text


def test_queue_beyond_limit_is_429_with_retry_after_and_not_ready(restricted):
    auth = {"Authorization": f"Bearer {KEY}"}
    with restricted.client(headers=auth) as c:
        assert c.get("/ready").status_code == 200
        body = {"text": "busy", "stream": True, "sampling_params": LONG}
        with c.stream("POST", "/generate", json=body) as response:
            lines = response.iter_lines()  # NOTE: dropping the iterator would close the stream
            assert next(lines).startswith("data: ")
            second = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert second.status_code == 429 and int(second.headers["Retry-After"]) >= 1
            assert second.json()["error"]["code"] == "queue_full"
            with restricted.client() as probe:  # NOTE: probes need no API key
                full = probe.get("/ready")
                assert full.status_code == 503 and full.json()["error"]["code"] == "queue_full"
                assert probe.get("/health").status_code == 200  # alive, just busy
        wait_idle(c)
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
        assert c.get("/ready").status_code == 200


def test_sigterm_stops_everything(restricted):
    children = restricted.children()
    assert len(children) >= 2
    with restricted.client(headers={"Authorization": f"Bearer {KEY}"}) as c:
        body = {"text": "busy", "stream": True, "sampling_params": LONG}
        with c.stream("POST", "/generate", json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            restricted.proc.send_signal(signal.SIGTERM)
            assert [ln for ln in lines if ln][-1] == "data: [DONE]"
    assert restricted.proc.wait(30) == 0
    wait_for(lambda: not any(alive(pid) for pid in children), timeout=10)


def finished_count(client: httpx.Client) -> float:
    """Requests that ran to a stop or length finish (aborted ones are not counted)."""
    metric = "radixlm:e2e_request_latency_seconds_count"
    lines = [ln for ln in client.get("/metrics").text.splitlines() if ln.startswith(metric)]
    return float(lines[0].split()[-1])


@pytest.mark.parametrize("streaming", [False, True])
def test_client_disconnect_aborts_and_frees_kv(tiny_server, streaming):
    with tiny_server.client() as c:
        flush_and_check_no_leak(c)
        before = (stats(c)["generated_tokens"], finished_count(c))
        body = {"prompt": "b", "stream": streaming, "max_tokens": 1000, "ignore_eos": True}
        if streaming:
            with c.stream("POST", "/v1/completions", json=body) as response:
                for i, _ in enumerate(response.iter_lines()):
                    if i > 4:
                        break
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{tiny_server.url}/v1/completions", json=body, timeout=1.0)
        generated = wait_idle(c)["generated_tokens"] - before[0]
        assert finished_count(c) == before[1] and generated < 1000, "the request was not aborted"
        flush_and_check_no_leak(c)


def test_scheduler_death_fails_requests_and_exits_nonzero(tiny_llama):
    server = launch_server(tiny_llama, "--max-total-tokens", "4096")
    try:
        children = server.children()
        scheduler = next(p for p in children if b"scheduler" in _cmdline(p))
        with ThreadPoolExecutor(2) as pool, server.client() as c:
            plain = pool.submit(c.post, "/generate", json={"text": "p", "sampling_params": LONG})
            streamed = pool.submit(_read_stream, server.url)
            wait_for(lambda: stats(c)["num_running"] == 2)
            os.kill(scheduler, signal.SIGKILL)
            wait_for(lambda: c.get("/health").status_code == 503, timeout=2.5)
            assert plain.result(timeout=30).status_code == 503
            frames = streamed.result(timeout=30)
        assert frames[-1] == "[DONE]" and "error" in json.loads(frames[-2])
        assert server.proc.wait(30) != 0
        wait_for(lambda: not any(alive(pid) for pid in children), timeout=10)
    finally:
        server.stop()


def test_hung_scheduler_is_reported_within_the_watchdog_timeout(tiny_llama):
    server = launch_server(tiny_llama, "--max-total-tokens", "4096", "--watchdog-timeout", "3")
    scheduler = next(p for p in server.children() if b"scheduler" in _cmdline(p))
    try:
        with server.client() as c:
            plain = ThreadPoolExecutor(1).submit(
                c.post, "/generate", json={"text": "p", "sampling_params": LONG}
            )
            wait_for(lambda: stats(c)["num_running"] == 1)
            os.kill(scheduler, signal.SIGSTOP)  # hung, not dead
            wait_for(lambda: c.get("/ready").status_code == 503, timeout=15)
            wait_for(lambda: c.get("/health").status_code == 503, timeout=15)
            assert plain.result(timeout=30).status_code == 503
        assert server.proc.wait(30) != 0
    finally:
        if alive(scheduler):
            os.kill(scheduler, signal.SIGCONT)
        server.stop()


def _ipc_dirs() -> set[str]:
    found = glob.glob(os.path.join(tempfile.gettempdir(), "radixlm-*"))
    return {p for p in found if os.path.isdir(p)}


def test_killed_server_leaves_no_children_and_no_ipc_dir(tiny_llama):
    before = _ipc_dirs()
    server = launch_server(tiny_llama, "--max-total-tokens", "4096")
    try:
        children = server.children()
        ours = _ipc_dirs() - before
        assert ours, "the server made no ipc directory"
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
        wait_for(lambda: not any(alive(pid) for pid in children), timeout=15)
        wait_for(lambda: not any(os.path.exists(d) for d in ours), timeout=5)
    finally:
        server.stop()


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def _read_stream(url: str) -> list[str]:
    body = {"text": "s", "stream": True, "sampling_params": LONG}
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as response:
        return [ln[6:] for ln in response.iter_lines() if ln.startswith("data: ")]
