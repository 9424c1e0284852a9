"""Server fixtures: ``python -m radixlm.server`` subprocesses on free 127.0.0.1 ports."""

from __future__ import annotations

import pytest
from server_helpers import flush_and_check_no_leak, launch_server


@pytest.fixture(scope="session")
def tiny_server(tiny_llama):
    """The tiny random Llama; checks after all its users that no KV slot leaked."""
    server = launch_server(
        tiny_llama, "--max-total-tokens", "16384", "--context-length", "1024",
        "--max-running-requests", "64", "--served-model-name", "tiny",
    )
    yield server
    try:
        with server.client() as client:
            flush_and_check_no_leak(client)
    finally:
        server.stop()


@pytest.fixture()
def tiny_client(tiny_server):
    with tiny_server.client() as client:
        yield client
