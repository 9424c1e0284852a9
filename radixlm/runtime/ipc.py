"""ZMQ endpoints between the processes: ``ipc://`` paths in a private temporary directory."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import zmq

from radixlm.runtime import messages


@dataclass(frozen=True)
class PortArgs:
    scheduler: str  # tokenizer manager -> scheduler
    detokenizer: str  # scheduler -> detokenizer
    tokenizer: str  # detokenizer -> tokenizer manager

    @classmethod
    def new(cls) -> PortArgs:
        root = tempfile.mkdtemp(prefix="radixlm-")
        os.chmod(root, 0o700)
        return cls(*(f"ipc://{os.path.join(root, n)}" for n in ("sched", "detok", "tok")))

    def cleanup(self) -> None:
        root = os.path.dirname(self.scheduler.removeprefix("ipc://"))
        for path in (self.scheduler, self.detokenizer, self.tokenizer):
            try:
                os.unlink(path.removeprefix("ipc://"))
            except OSError:
                pass
        try:
            os.rmdir(root)
        except OSError:
            pass


def pull(ctx: zmq.Context, addr: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PULL)
    sock.bind(addr)
    return sock


def push(ctx: zmq.Context, addr: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    return sock


def send(sock: zmq.Socket, msg: messages.Message) -> None:
    sock.send(messages.encode(msg), copy=False)


def recv_all(sock: zmq.Socket, timeout_ms: int) -> list[messages.Message]:
    """Every message waiting on ``sock``, waiting up to ``timeout_ms`` for the first."""
    out = []
    if sock.poll(timeout_ms):
        while True:
            try:
                out.append(messages.decode(sock.recv(zmq.NOBLOCK)))
            except zmq.Again:
                break
    return out
