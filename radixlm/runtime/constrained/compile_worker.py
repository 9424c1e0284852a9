"""One compile worker: a process that builds outlines-core indexes, so a runaway build can be
killed and its memory capped without touching the scheduler.

The process runs this file as a script, with nothing prepended to ``sys.path`` (``BOOT``): it
imports only the standard library and outlines_core and is ready in about 0.1 s. (A
``multiprocessing`` spawn or forkserver child would re-import the scheduler's ``__main__``, and
with it torch; ``fork`` is unsafe in a process with threads.) Messages are pickles on a socket
pair, framed by ``multiprocessing.connection`` as a ``Pipe`` would be: the vocabulary once, then
per build a regex one way and ``("ok", Index)``, ``("error", text)`` or ``("memory", None)`` back.
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from typing import Any

from outlines_core import Index

MIB = 1 << 20
PR_SET_PDEATHSIG = 1
BOOT = "import runpy, sys; del sys.path[0]; runpy.run_path(sys.argv[1], run_name='__main__')"


class CompileWorker:
    """The scheduler's end of one worker process; ``busy`` from a send until its reply."""

    busy = False

    def __init__(self, vocabulary: bytes, memory_mib: int) -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            argv = [__file__, str(theirs.fileno()), str(os.getpid()), str(memory_mib)]
            self.proc = subprocess.Popen(
                [sys.executable, "-c", BOOT, *argv],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        self.conn = Connection(ours.detach())
        try:
            self.conn.send_bytes(vocabulary)
        except OSError as e:
            self.close()
            raise RuntimeError(f"a grammar compile worker failed to start: {e}") from e

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, regex: str) -> None:
        """Start building the index of ``regex``."""
        self.busy = True
        self.conn.send(regex)

    def wait(self, timeout: float) -> bool:
        """Whether the reply (or the worker's exit) came within ``timeout`` seconds."""
        return self.conn.poll(max(timeout, 0.0))

    def reply(self) -> tuple[str, Any]:
        """``(status, payload)`` of the last build; ``("exited", returncode)`` if the worker died.

        NOTE: this unpickles only what this worker, our own child process, wrote; nothing from
        a client crosses this socket except the regex text going the other way.
        """
        try:
            status, payload = self.conn.recv()
        except (EOFError, OSError):
            return "exited", self.proc.wait()
        self.busy = False
        return status, payload

    def kill(self) -> None:
        """SIGKILL the worker (it holds no state worth a graceful exit) and reap it; safe from
        any thread."""
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Kill the worker and close the socket; only by the thread that uses the worker."""
        self.kill()
        self.conn.close()


def main(fd: int, parent: int, memory_mib: int) -> None:
    """Serve builds until the scheduler closes the socket."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limit = memory_mib * MIB
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    conn = Connection(fd)
    vocabulary = conn.recv()
    while True:
        try:
            regex = conn.recv()
        except EOFError:
            return
        conn.send_bytes(_build(regex, vocabulary))


def _build(regex: str, vocabulary: Any) -> bytes:
    try:
        return pickle.dumps(("ok", Index(regex, vocabulary)))
    except MemoryError:
        return pickle.dumps(("memory", None))
    except BaseException as e:  # noqa: BLE001 - pyo3 panics derive from BaseException
        return pickle.dumps(("error", str(e) or type(e).__name__))


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this worker when the scheduler dies, even mid-build."""
    # NOTE: the signal follows the *thread* that started the worker: a compile thread of the
    # GrammarCompiler, which lives until the compiler is shut down or collected.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[2:5]))
