"""Helpers for the compile-worker tests: a tiny vocabulary and a look at our child processes."""

from __future__ import annotations

import os
import threading
import time

from outlines_core import Vocabulary

from radixlm.runtime.constrained.compile_pool import CompilePool


def tiny_vocabulary() -> Vocabulary:
    return Vocabulary(0, {bytes([c]): [i + 1] for i, c in enumerate(b"abcxyz")})


def worker_pids(parent: int | None = None) -> set[int]:
    """Live compile workers whose parent is ``parent`` (this process by default)."""
    parent = os.getpid() if parent is None else parent
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"compile_worker.py" in command:
            found.add(int(entry))
    return found


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def in_thread(pool: CompilePool, regex: str, timeout: float) -> dict:
    out: dict = {}

    def run() -> None:
        try:
            out["index"] = pool.build(regex, time.monotonic() + timeout)
        except Exception as e:  # noqa: BLE001
            out["error"] = e
        out["at"] = time.monotonic()

    out["thread"] = threading.Thread(target=run, daemon=True)
    out["thread"].start()
    return out
