"""How many torch threads each process runs, and how idle OpenMP threads wait.

Only the processes that compute (the scheduler and the tensor-parallel ranks) get a thread pool;
the detokenizer and the server do not import torch (with a tokenizer only transformers can load,
they run it with one thread). By default the computing processes share the physical cores but
one (left to the server and the detokenizer), at most 8 threads each; on 2 cores, one thread,
which runs the compiled decode steps (``aot_graphs``: compiled for that count).

A lone scheduler (no tensor parallelism, no count from the user) runs its steps of
``BIG_STEP_TOKENS`` tokens or more (prefills, decode batches of 24 requests and more) and a
lone request's steps (single-stream decode) on every core, through graphs compiled for that
count, or on as many as other
processes left free over the last ``LOAD_WINDOW_S`` (``StepThreads``, ``OtherLoad``): with
another process keeping one core busy, two threads collapse (SmolLM2, batch of 32: 32-132
tok/s against ~250 on one thread; each parallel region waits for the thread the OS put behind
the busy process), so the pool follows the load.
Idle OpenMP threads spin a short while (``SPIN_WAIT``), then sleep: threads that sleep at once
(``OMP_WAIT_POLICY=PASSIVE``) pay a wake-up in each of a step's hundreds of short parallel
regions (2 threads, batch of 32: 204-287 tok/s sleeping, 406-501 spinning briefly).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Mapping

MAX_DEFAULT_THREADS = 8
USER_VARS = ("RADIXLM_NUM_THREADS", "OMP_NUM_THREADS")
# NOTE: SmolLM2, bf16, one process, ms per step on 1 thread / 2 threads (short spin): prefill of
# 24 tokens 56 / 42, 64 tokens 122 / 73, 256 tokens 390 / 217; a decode batch of 16 requests
# 47 (compiled) / 46-48 (eager), 24 requests 64-78 / 50-57, 32 requests 74-75 / 61-64 (a
# graph compiled for 2 threads: 45-64)
BIG_STEP_TOKENS = 24
# NOTE: a lone request's steps (single-stream decode, its verify steps, its prefill) take the
# big count too: SmolLM2's compiled one-token step 9.0 ms on 1 thread, 5.9 on 2 (the int4
# matmuls of one row are bound by reading the weights, which two cores do faster), while the
# server and detokenizer, the ones a small count leaves a core for, have one stream's work
LONE_REQUEST = 1
# NOTE: how often the scheduler re-measures the other processes' load: a step or two of a
# decode on the wrong count at most (a busy core slows a 2-thread step ~10x while it lasts),
# and one /proc/stat read (~20 us) per window
LOAD_WINDOW_S = 0.25
# NOTE: libgomp (torch's OpenMP) reads these once, when it loads: they must be in a child's
# environment before it imports torch. A wait setting the user made is kept. libgomp's own
# default spins 300000 rounds (~ms) before sleeping; 5000 and 50000 gave the same speeds here.
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SPIN_WAIT = {"GOMP_SPINCOUNT": "20000"}
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
    if (chosen := user_threads(num_threads, environ)) is not None:
        return chosen
    spare = max(1, available_cores() - reserved_cores)
    return max(1, min(spare // processes, MAX_DEFAULT_THREADS))


def user_threads(num_threads: int | None, environ: Mapping[str, str] = os.environ) -> int | None:
    """The count the user chose: ``num_threads``, else ``RADIXLM_NUM_THREADS``, else
    ``OMP_NUM_THREADS``; None when none is set."""
    if num_threads is not None:
        return _positive("num_threads", num_threads)
    for name in USER_VARS:
        if environ.get(name, "").strip():  # NOTE: OpenMP also takes a list, one per nesting level
            return _positive(name, environ[name].split(",")[0])
    return None


def big_step_threads(
    num_threads: int | None, processes: int = 1, environ: Mapping[str, str] = os.environ
) -> int:
    """Threads for a computing process's big steps on an otherwise idle machine: as
    ``compute_threads``, with no core kept for the server and the detokenizer (``StepThreads``
    gives way to any process that computes)."""
    return compute_threads(num_threads, processes, environ, reserved_cores=0)


class OtherLoad:
    """The CPUs' worth of time other processes took on this process's CPUs between two
    ``sample`` calls: the busy time of /proc/stat's lines for the CPUs in this process's
    affinity (under a cgroup CPU quota smaller than those, the cgroup's own usage), less this
    process's CPU time. Hypervisor steal counts as taken."""

    def __init__(self) -> None:
        self.cpus = sorted(os.sched_getaffinity(0))
        quota = _cgroup_cpu_quota()
        self.cgroup = quota is not None and quota < len(self.cpus)
        self.capacity = quota if self.cgroup else len(self.cpus)
        self.last = self._read()

    def sample(self) -> float | None:
        """Other processes' load since the last sample, in CPUs; None when unreadable."""
        now = self._read()
        (t0, busy0, own0), (t1, busy1, own1) = self.last, now
        self.last = now
        if busy0 is None or busy1 is None or t1 <= t0:
            return None
        return max(0.0, (busy1 - busy0 - (own1 - own0)) / (t1 - t0))

    def _read(self) -> tuple[float, float | None, float]:
        busy = self._cgroup_busy() if self.cgroup else self._stat_busy()
        return time.monotonic(), busy, time.process_time()

    def _stat_busy(self) -> float | None:
        names = {f"cpu{c}" for c in self.cpus}
        ticks = 0
        try:
            with open("/proc/stat") as f:
                for line in f:
                    fields = line.split()
                    if fields and fields[0] in names:
                        # user nice system idle iowait irq softirq steal: all but idle, iowait
                        user, nice, system, _, _, irq, softirq, steal = map(int, fields[1:9])
                        ticks += user + nice + system + irq + softirq + steal
        except (OSError, ValueError):
            return None
        return ticks / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _cgroup_busy() -> float | None:
        try:
            with open("/sys/fs/cgroup/cpu.stat") as f:
                usage = dict(line.split() for line in f if line.strip())
            return int(usage["usage_usec"]) / 1e6
        except (OSError, ValueError, KeyError):
            return None


class StepThreads:
    """Sizes this process's torch pool before each forward step: ``small`` threads for a step
    of several requests and fewer than ``BIG_STEP_TOKENS`` tokens; from there on, and for a
    lone request's steps (``LONE_REQUEST``), ``big``, or as many CPUs as other processes left
    free over the last ``LOAD_WINDOW_S`` when that is fewer (at least ``small``).
    ``torch.set_num_threads`` runs only when the count changes (well under a microsecond)."""

    def __init__(self, small: int, big: int, load: OtherLoad | None = None) -> None:
        self.small, self.big, self.current = small, big, small
        can_measure = hasattr(os, "sched_getaffinity") and os.path.exists("/proc/stat")
        self.load = (load or OtherLoad()) if big > small and can_measure else None
        self.free = big  # NOTE: CPUs the others left free, as of the last sample
        self.next_sample = time.monotonic() + LOAD_WINDOW_S

    def for_step(self, tokens: int, requests: int = 0) -> int:
        """Set the count for a step of ``tokens`` tokens of ``requests`` requests, and return
        it."""
        if self.load is not None and (now := time.monotonic()) >= self.next_sample:
            self.next_sample = now + LOAD_WINDOW_S
            if (other := self.load.sample()) is not None:
                self.free = int(self.load.capacity - other + 0.5)
        want = self.small
        if tokens >= BIG_STEP_TOKENS or requests == LONE_REQUEST:
            want = max(self.small, min(self.big, self.free))
        if want != self.current:
            import torch

            torch.set_num_threads(want)
            self.current = want
        return want


def child_env(threads: int, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment for a child process that runs torch with ``threads`` threads (and
    glibc with ``MALLOC_ARENAS`` and oneDNN with ``ONEDNN_CACHES``, unless the user set them)."""
    env = {**MALLOC_ARENAS, **ONEDNN_CACHES, **environ}
    if not any(name in env for name in WAIT_VARS):
        env.update(SPIN_WAIT)
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
    adapts = ""
    if steps and steps.big > steps.small:
        adapts = (f" ({steps.big} for steps of >= {BIG_STEP_TOKENS} tokens, fewer while other "
                  "processes take cores)")  # fmt: skip
    return f"torch threads: {torch.get_num_threads()}{adapts}, OpenMP wait policy: {policy}" + (
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
