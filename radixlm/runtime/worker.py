"""Entry point of the child processes: ``python -m radixlm.runtime.worker ROLE READY_FD``.

Roles: ``scheduler`` (tensor-parallel rank 0), ``tp_worker`` (ranks > 0), ``detokenizer``.
The configuration (server args, ports, the process's rank, its torch thread count and the
scheduler's count for big steps) arrives as
JSON on stdin; readiness goes back as one JSON line on READY_FD, with the process's own count of
torch threads (0 where it does not import torch: the detokenizer).
Children are started with subprocess rather than multiprocessing's spawn, so that a user's
script without an ``if __name__ == "__main__"`` guard is never re-run in them.
"""

from __future__ import annotations

import json
import os
import sys

from radixlm.runtime import threads
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.distributed.placement import RankInfo
from radixlm.runtime.ipc import PortArgs


class ReadyPipe:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, msg: dict) -> None:
        if msg.get("ok"):
            msg = {**msg, "threads": threads.torch_threads()}
        os.write(self.fd, (json.dumps(msg) + "\n").encode())
        os.close(self.fd)


def main() -> None:
    role, fd = sys.argv[1], int(sys.argv[2])
    config = json.loads(sys.stdin.read())
    args, ports = ServerArgs(**config["args"]), PortArgs(**config["ports"])
    rank = RankInfo(**config.get("rank", {}))
    if role != "detokenizer":  # NOTE: its environment gives torch, if it ever loads, 1 thread
        threads.apply(config.get("threads", 1))
    if role == "scheduler":
        from radixlm.runtime.scheduler.process import run_scheduler_process

        step_threads = threads.StepThreads(config["threads"], config["big_step_threads"])
        run_scheduler_process(args, ports, ReadyPipe(fd), rank, step_threads)
    elif role == "tp_worker":
        from radixlm.runtime.distributed.tp_worker import run_tp_worker_process

        run_tp_worker_process(args, rank, ReadyPipe(fd))
    elif role == "detokenizer":
        from radixlm.runtime.detokenizer import run_detokenizer_process

        run_detokenizer_process(args, ports, ReadyPipe(fd))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
