"""How many torch threads each process runs, and how idle OpenMP threads wait.

Only the processes that compute (the scheduler and the tensor-parallel ranks) get a thread pool;
the detokenizer and the server do not import torch (with a tokenizer only transformers can load,
they run it with one thread). By default the computing processes
share the physical cores but one (left to the server and the detokenizer), at most 8 threads
each, and idle OpenMP threads sleep instead of spinning: with spinning threads, one core taken by
other work stalls every parallel region (on 2 cores a 2-thread greedy decode fell from 55 to
2-16 tok/s), while sleeping ones only slow it down. On 2 cores one thread decodes fastest, idle
(about 40 tok/s against 31 for two sleeping threads) and beside a busy core alike.

A single scheduler (no tensor parallelism) widens its pool to every core for the steps of
``BIG_STEP_TOKENS`` tokens or more (long prefills), where the matrix products are large enough
to split: a 788-token prefill of SmolLM2 took 0.95 s on 2 threads against 1.62 s on one, and
with the other core busy, 1.59 s against 1.60 (sleeping threads: the half on the busy core just
runs later). A thread count the user gives holds for every step.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Mapping

MAX_DEFAULT_THREADS = 8
USER_VARS = ("RADIXLM_NUM_THREADS", "OMP_NUM_THREADS")
# NOTE: 2 threads against 1 on SmolLM2, one request's prefill: 64 tokens 1.3x slower, 128 even,
# 256 1.0-1.3x faster, 512 1.1-1.5x, 788 1.7x (the spread is this machine's noise)
BIG_STEP_TOKENS = 256
# NOTE: libgomp (torch's OpenMP) reads these once, when it loads: they must be in a child's
# environment before it imports torch. A wait setting the user made is kept.
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
PASSIVE_WAIT = {"OMP_WAIT_POLICY": "PASSIVE"}
# NOTE: glibc gives each thread that allocates its own heap (up to 8 per core), and memory freed
# there goes back to the OS far less readily than the main heap's: loading and quantising
# SmolLM2 in one process (the tokenizer loads on a thread) ended at 665 MB and peaked at 836
# with glibc's default, 518 and 547 with 2 heaps (one run each; start-ups vary by ~100 MB).
# Read once, at start: set in a child's environment.
MALLOC_ARENAS = {"MALLOC_ARENA_MAX": "2"}
# NOTE: oneDNN (bf16 matmuls on CPU) keeps each matmul shape's JIT-compiled primitive in two
# caches of 1024 entries (oneDNN's own and ideep's, ~0.35 MB an entry): every new KV length of
# an eager decode step or new prompt length added ~1.4 MB to the scheduler until they were full
# (a low_memory server grew 435 -> 545 MB over its first 8 requests; capped, with decode
# lengths padded to 16 slots by the torch backend: 445). A step takes a handful (the
# projections, the head, two attention matmuls), so 64 keep a few steps' worth. Read once, at
# start.
ONEDNN_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


def compute_threads(
    num_threads: int | None,
    processes: int = 1,
    environ: Mapping[str, str] = os.environ,
    reserved_cores: int = 1,
) -> int:
    """Threads for each computing process: ``num_threads`` when given, else the
    ``RADIXLM_NUM_THREADS`` variable, else ``OMP_NUM_THREADS``, else the physical cores but
    ``reserved_cores`` (by default one, for the server and the detokenizer), shared among
    ``processes`` (at most ``MAX_DEFAULT_THREADS``, at least 1)."""
    if num_threads is not None:
        return _positive("num_threads", num_threads)
    for name in USER_VARS:
        if environ.get(name, "").strip():  # NOTE: OpenMP also takes a list, one per nesting level
            return _positive(name, environ[name].split(",")[0])
    spare = max(1, available_cores() - reserved_cores)
    return max(1, min(spare // processes, MAX_DEFAULT_THREADS))


def big_step_threads(
    num_threads: int | None, processes: int = 1, environ: Mapping[str, str] = os.environ
) -> int:
    """Threads for a computing process's big steps: as ``compute_threads``, with no core kept
    for the server and the detokenizer."""
    return compute_threads(num_threads, processes, environ, reserved_cores=0)


class StepThreads:
    """Sets this process's torch threads before each forward step: ``small`` below
    ``BIG_STEP_TOKENS`` tokens, ``big`` from there on (``torch.set_num_threads`` only when the
    count changes; it costs well under a microsecond)."""

    def __init__(self, small: int, big: int) -> None:
        self.small, self.big, self.current = small, big, small

    def for_step(self, tokens: int) -> None:
        want = self.big if tokens >= BIG_STEP_TOKENS else self.small
        if want != self.current:
            import torch

            torch.set_num_threads(want)
            self.current = want


def child_env(threads: int, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment for a child process that runs torch with ``threads`` threads (and
    glibc with ``MALLOC_ARENAS`` and oneDNN with ``ONEDNN_CACHES``, unless the user set them)."""
    env = {**MALLOC_ARENAS, **ONEDNN_CACHES, **environ}
    if not any(name in env for name in WAIT_VARS):
        env.update(PASSIVE_WAIT)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def torch_threads() -> int:
    """This process's torch intra-op threads; 0 when it has not imported torch (the server and
    the detokenizer of ``radixlm serve`` do not)."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else 0


def apply(threads: int) -> None:
    """Run this process's torch with ``threads`` intra-op threads and one inter-op thread."""
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # NOTE: refused once inter-op work has started
        torch.set_num_interop_threads(1)


def describe(steps: StepThreads | None = None) -> str:
    """One line for the log: this process's torch threads (and with ``steps``, its count for
    big steps) and OpenMP wait policy."""
    import torch

    policy = os.environ.get("OMP_WAIT_POLICY", "default").lower()
    spin = os.environ.get("GOMP_SPINCOUNT")
    big = f" ({steps.big} for steps of >= {BIG_STEP_TOKENS} tokens)" if steps else ""
    return f"torch threads: {torch.get_num_threads()}{big}, OpenMP wait policy: {policy}" + (
        f" (GOMP_SPINCOUNT={spin})" if spin is not None else ""
    )


def available_cores() -> int:
    """Physical cores this process may use: its CPU affinity, one per group of SMT siblings,
    capped by a cgroup CPU quota."""
    if hasattr(os, "sched_getaffinity"):
        cpus = os.sched_getaffinity(0)
    else:
        cpus = range(os.cpu_count() or 1)
    cores = len({_core_of(cpu) for cpu in cpus})
    quota = _cgroup_cpu_quota()
    return max(1, min(cores, quota) if quota else cores)


def _core_of(cpu: int) -> str:
    path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return str(cpu)


def _cgroup_cpu_quota() -> int | None:
    """``cpu.max`` of cgroup v2 in whole CPUs (rounded up), or None without a limit."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))


def _positive(name: str, value: int | str) -> int:
    try:
        threads = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}") from None
    if threads < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return threads
