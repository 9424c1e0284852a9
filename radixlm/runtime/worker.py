"""Entry point of the child processes: ``python -m radixlm.runtime.worker ROLE READY_FD``.

The configuration arrives as JSON on stdin; readiness goes back as one JSON line on READY_FD.
Children are started with subprocess rather than multiprocessing's spawn, so that a user's
script without an ``if __name__ == "__main__"`` guard is never re-run in them.
"""

from __future__ import annotations

import json
import os
import sys

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.ipc import PortArgs


class ReadyPipe:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, msg: dict) -> None:
        os.write(self.fd, (json.dumps(msg) + "\n").encode())
        os.close(self.fd)


def main() -> None:
    role, fd = sys.argv[1], int(sys.argv[2])
    config = json.loads(sys.stdin.read())
    args, ports = ServerArgs(**config["args"]), PortArgs(**config["ports"])
    if role == "scheduler":
        from radixlm.runtime.scheduler.process import run_scheduler_process as run
    elif role == "detokenizer":
        from radixlm.runtime.detokenizer import run_detokenizer_process as run
    else:
        raise SystemExit(f"unknown role {role!r}")
    run(args, ports, ReadyPipe(fd))


if __name__ == "__main__":
    main()
