"""Start the scheduler (tensor-parallel rank 0), the other ranks and the detokenizer, and watch
them."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass

from radixlm.runtime import ipc, threads
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.distributed.placement import (
    RankInfo,
    check_gpu_count,
    check_tp_size,
    file_init_method,
)
from radixlm.runtime.loader.model_files import load_config
from radixlm.runtime.tokenizer_manager import TokenizerManager

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0
GRAPHS_TIMEOUT_S = 1800.0  # NOTE: with wait_cpu_graphs, a first start builds them (minutes)


@dataclass
class Backend:
    """The running child processes of one runtime."""

    args: ServerArgs
    ports: ipc.PortArgs
    procs: dict[str, subprocess.Popen]
    info: dict
    watched = True  # NOTE: the Runtime's watchdog pings this scheduler (Ray watches its own)

    def manager(self, tokenizer) -> TokenizerManager:
        """The front that sends requests to these processes."""
        return TokenizerManager(self.args, self.ports, tokenizer, self.info)

    def rss_bytes(self) -> dict[str, int | None]:
        """Resident memory of each child process (None where it cannot be read)."""
        return {name: rss_bytes(proc.pid) for name, proc in self.procs.items()}

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
        with contextlib.suppress(OSError):
            os.unlink(file_init_method(private_dir(self.ports)).removeprefix("file://"))
        self.ports.cleanup()


def launch(args: ServerArgs, gpu_offset: int = 0) -> Backend:
    """Start the processes and wait until the model is loaded. Bad paths, formats, architectures
    or tensor-parallel sizes raise here, in the caller's process, before anything is spawned.

    ``gpu_offset``: the first GPU of this replica (rank r uses GPU ``gpu_offset + r``).
    With ``dp_size > 1``, starts that many replicas and returns a ``ReplicaSet``."""
    if args.dp_size > 1:
        from radixlm.runtime.distributed.data_parallel import launch_replicas

        return launch_replicas(args)
    config, _, _ = load_config(args)
    check_tp_size(config, args.tp_size)
    check_gpu_count(args.device, args.tp_size)
    per_rank = threads.compute_threads(args.num_threads, args.tp_size)
    big_steps = threads.big_step_threads(args.num_threads)  # NOTE: the runner decides if it applies
    ports = ipc.PortArgs.new()
    init = file_init_method(private_dir(ports))
    procs, pipes = {}, {}
    for name, role, rank in _processes(args, init, gpu_offset):
        n = 1 if role == "detokenizer" else per_rank
        payload = {"args": dataclasses.asdict(args), "ports": dataclasses.asdict(ports)}
        config = {**payload, "rank": rank.to_dict(), "threads": n, "big_step_threads": big_steps}
        procs[name], pipes[name] = _spawn(role, config)
    backend = Backend(args, ports, procs, {})
    try:
        backend.info.update(_wait_ready(pipes, procs, GRAPHS_TIMEOUT_S if args.wait_cpu_graphs
                                       else STARTUP_TIMEOUT_S))  # fmt: skip
    except BaseException:
        backend.shutdown()
        raise
    finally:
        for fd in pipes.values():
            os.close(fd)
    return backend


def rss_bytes(pid: int) -> int | None:
    """A process's resident set size, from ``/proc`` (None elsewhere or once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def private_dir(ports: ipc.PortArgs) -> str:
    """The runtime's private temporary directory (where the ``ipc://`` sockets live)."""
    return os.path.dirname(ports.scheduler.removeprefix("ipc://"))


def _processes(args: ServerArgs, init: str, gpu_offset: int):
    """(name, role, rank) of each child: rank 0 schedules, ranks > 0 follow it."""
    tp = args.tp_size
    yield "scheduler", "scheduler", RankInfo(0, tp, gpu_offset, init)
    for r in range(1, tp):
        yield f"tp rank {r}", "tp_worker", RankInfo(r, tp, gpu_offset + r, init)
    yield "detokenizer", "detokenizer", RankInfo()


def _spawn(role: str, config: dict) -> tuple[subprocess.Popen, int]:
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixlm.runtime.worker", role, str(write_fd)],
        stdin=subprocess.PIPE,
        pass_fds=(write_fd,),
        start_new_session=False,
        env=threads.child_env(config["threads"]),
    )
    os.close(write_fd)
    proc.stdin.write(json.dumps(config).encode())
    proc.stdin.close()
    return proc, read_fd


def _wait_ready(
    pipes: dict[str, int], procs: dict[str, subprocess.Popen], timeout: float
) -> dict:
    """Wait for every child's ready line; the first one that fails raises (the ranks of a
    tensor-parallel group would otherwise wait for each other forever). Each child's torch
    thread count lands in ``info["threads"]``, by process name (and the scheduler's count for
    big steps as ``scheduler_big_steps``)."""
    deadline = time.monotonic() + timeout
    data = {name: b"" for name in pipes}
    done: dict[str, dict] = {}
    while pending := [n for n in pipes if n not in done]:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the {pending[0]} process did not start within {timeout:.0f} s"
            )
        ready, _, _ = select.select([pipes[n] for n in pending], [], [], 0.2)
        for name in pending:
            if pipes[name] in ready:
                chunk = os.read(pipes[name], 65536)
                data[name] += chunk
                finished = not chunk or data[name].endswith(b"\n")
            else:
                finished = procs[name].poll() is not None
            if finished:
                done[name] = _parse_ready(name, data[name], procs[name])
    counts = {name: info.pop("threads", None) for name, info in done.items()}
    merged = {k: v for info in done.values() for k, v in info.items()}
    if (big := merged.pop("big_step_threads", None)) is not None:
        counts["scheduler_big_steps"] = big
    return {**merged, "threads": counts}


def _parse_ready(name: str, data: bytes, proc: subprocess.Popen) -> dict:
    if not data.strip():
        proc.wait(1.0)
        raise RuntimeError(f"the {name} process died while starting (exit code {proc.returncode})")
    msg = json.loads(data)
    if not msg.pop("ok"):
        if not msg["error"].startswith("ValueError"):  # NOTE: a bad option needs no traceback
            logger.error("the %s process failed to start:\n%s", name, msg.get("trace", ""))
        raise RuntimeError(f"the {name} process failed to start: {msg['error']}")
    return msg
