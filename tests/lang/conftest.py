"""Backends for the language tests, on the shared session engines."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time

import httpx
import pytest

from radixlm.lang.backend.engine import EngineBackend


@pytest.fixture(scope="session")
def smol(smol_engine) -> EngineBackend:
    """SmolLM2 (ChatML, from its own template): for tests about meaning."""
    return EngineBackend(smol_engine)


@pytest.fixture(scope="session")
def tiny(tiny_engine) -> EngineBackend:
    """The tiny random Llama: for mechanics."""
    return EngineBackend(tiny_engine)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}")
        try:
            if httpx.get(url + "/health_generate", timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise TimeoutError("the server did not become ready")


@pytest.fixture(scope="session")
def server_url(tmp_path_factory) -> str:
    """A ``python -m radixlm.server`` subprocess on SmolLM2 (float32, like ``smol_engine``)."""
    if importlib.util.find_spec("radixlm.server.__main__") is None:
        pytest.skip("radixlm.server is not available")
    port = _free_port()
    log = open(tmp_path_factory.mktemp("server") / "server.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixlm.server", "--port", str(port), "--dtype", "float32",
         "--max-total-tokens", "16384", "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="session")
def endpoint(server_url):
    from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint

    backend = RuntimeEndpoint(server_url)
    yield backend
    backend.shutdown()
