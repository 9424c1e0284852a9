"""Start the scheduler and detokenizer processes and watch them."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass

from radixlm.runtime import ipc
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.loader.loader import load_config

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0
ROLES = ("scheduler", "detokenizer")


@dataclass
class Backend:
    """The running child processes of one runtime."""

    args: ServerArgs
    ports: ipc.PortArgs
    procs: dict[str, subprocess.Popen]
    info: dict

    def dead_reason(self) -> str | None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                return f"the {name} process exited with code {proc.returncode}"
        return None

    def shutdown(self, timeout: float = 5.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(1.0)
        self.ports.cleanup()


def launch(args: ServerArgs) -> Backend:
    """Start the processes and wait until the model is loaded. Bad paths, formats or
    architectures raise here, in the caller's process, before anything is spawned."""
    load_config(args)
    ports = ipc.PortArgs.new()
    config = json.dumps({"args": dataclasses.asdict(args), "ports": dataclasses.asdict(ports)})
    procs, pipes = {}, {}
    for role in ROLES:
        read_fd, write_fd = os.pipe()
        proc = subprocess.Popen(
            [sys.executable, "-m", "radixlm.runtime.worker", role, str(write_fd)],
            stdin=subprocess.PIPE,
            pass_fds=(write_fd,),
            start_new_session=False,
        )
        os.close(write_fd)
        proc.stdin.write(config.encode())
        proc.stdin.close()
        procs[role], pipes[role] = proc, read_fd
    backend = Backend(args, ports, procs, {})
    try:
        for role, fd in pipes.items():
            backend.info.update(_wait_ready(role, fd, procs[role]))
    except BaseException:
        backend.shutdown()
        raise
    finally:
        for fd in pipes.values():
            os.close(fd)
    return backend


def _wait_ready(name: str, fd: int, proc: subprocess.Popen) -> dict:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            chunk = os.read(fd, 65536)
            data += chunk
            if data.endswith(b"\n") or not chunk:
                break
        elif proc.poll() is not None:
            break
    if not data:
        if proc.poll() is not None:
            raise RuntimeError(
                f"the {name} process died while starting (exit code {proc.returncode})"
            )
        raise TimeoutError(f"the {name} process did not start within {STARTUP_TIMEOUT_S:.0f} s")
    msg = json.loads(data)
    if not msg.pop("ok"):
        raise RuntimeError(f"the {name} process failed to start: {msg['error']}")
    return msg
