"""A bounded load test: 64 concurrent clients, a quarter of them leaving early."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from server_helpers import flush_and_check_no_leak

CLIENTS = 64
TOKENS = 12


async def _client(http: httpx.AsyncClient, i: int) -> str:
    stream, leaves = i % 2 == 0, i % 4 == 3
    body = {"model": "tiny", "prompt": f"Client number {i} says", "stream": stream,
            "max_tokens": 400 if leaves else TOKENS, "ignore_eos": True}
    if leaves and stream:
        async with http.stream("POST", "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    return "left"
    if leaves:
        try:
            await http.post("/v1/completions", json=body, timeout=0.3)
        except httpx.TimeoutException:
            return "left"
        return "finished before leaving"
    if stream:
        return await _read_stream(http, body)
    response = await http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == TOKENS
    return "done"


async def _read_stream(http: httpx.AsyncClient, body: dict) -> str:
    frames = []
    async with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        frames = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]"
    assert '"finish_reason": "length"' in frames[-2]
    return "done"


async def _run(url: str) -> list[str]:
    limits = httpx.Limits(max_connections=CLIENTS + 8)
    async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits) as http:
        return await asyncio.wait_for(
            asyncio.gather(*(_client(http, i) for i in range(CLIENTS))), timeout=240
        )


@pytest.mark.timeout(300)
def test_64_concurrent_clients_with_early_leavers(tiny_server):
    outcomes = asyncio.run(_run(tiny_server.url))
    assert outcomes.count("done") == CLIENTS - CLIENTS // 4
    with tiny_server.client() as client:
        stats = flush_and_check_no_leak(client, timeout=60)
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
