"""Helpers for the server tests: ``python -m radixlm.server`` subprocesses on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import httpx

STARTUP_TIMEOUT_S = 240.0


@dataclass
class ServerProc:
    proc: subprocess.Popen
    port: int
    log_path: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 60.0), **kw)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def children(self) -> list[int]:
        return child_pids(self.proc.pid)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            for pid in [*self.children(), self.proc.pid]:
                _kill(pid)
            return self.proc.wait(10)


def child_pids(parent: int) -> list[int]:
    """Live processes whose parent is ``parent`` (threads' children included)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_server(model_path: str | None, *extra: str) -> ServerProc:
    """Start a server and wait until /health answers 200."""
    port = free_port()
    cmd = [sys.executable, "-m", "radixlm.server", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--dtype", "float32", "--log-level", "warning", *extra]
    if model_path:
        cmd += ["--model-path", model_path]
    fd, log_path = tempfile.mkstemp(prefix="radixlm-server-", suffix=".log")
    proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    os.close(fd)
    server = ServerProc(proc, port, log_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.stop()
    raise TimeoutError(f"server did not start:\n{server.log()}")


def flush_and_check_no_leak(client: httpx.Client, timeout: float = 20.0) -> dict:
    """Wait for idle, flush the cache, and assert every KV slot is free; returns the stats."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.post("/flush_cache")
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert response.status_code == 200, response.text
    stats = client.get("/get_server_info").json()["stats"]
    assert stats["kv_invariant_ok"] is True, stats
    assert stats["free_tokens"] == stats["max_total_tokens"], stats
    return stats
