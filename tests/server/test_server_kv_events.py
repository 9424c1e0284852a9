"""A server started with --kv-events-endpoint publishes the blocks its requests cache, and a
clear on /flush_cache (issue #15)."""

from __future__ import annotations

import time

import msgspec
import zmq
from server_helpers import free_port, launch_server


def test_server_publishes_stored_blocks_and_a_clear_on_flush(tiny_llama):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = launch_server(
        tiny_llama, "--max-total-tokens", "4096", "--kv-events-endpoint", endpoint,
        "--kv-events-block-size", "8",
    )
    sub = zmq.Context.instance().socket(zmq.SUB)
    try:
        sub.connect(endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        time.sleep(0.5)  # NOTE: PUB drops messages until the subscription has arrived
        prompt = list(range(100, 140))
        with server.client() as c:
            body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4}}
            assert c.post("/generate", json=body).status_code == 200
            stored = _events(sub, "BlockStored")
            tokens = [t for e in stored for t in e[3]]
            assert tokens[:40] == prompt and all(e[4] == 8 for e in stored)
            assert c.post("/flush_cache").status_code == 200
            assert _events(sub, "AllBlocksCleared")
    finally:
        sub.close(0)
        server.stop()


def _events(sub, kind: str) -> list:
    deadline, found = time.monotonic() + 30, []
    while not found and time.monotonic() < deadline:
        if sub.poll(500):
            _, _, payload = sub.recv_multipart()
            found = [e for e in msgspec.msgpack.decode(payload)[1] if e[0] == kind]
    return found
