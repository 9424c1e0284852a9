"""Worker processes for grammar compiles, in two lanes, so slow specs cannot starve the others.

Policy (each compile runs on its own worker process: an idle one, else a newly started one):

- The *regular* lane holds ``workers`` compiles at once; more wait their turn, first come first
  served.
- A compile still running after ``slow_after_s`` moves to the *slow* lane, freeing its regular
  place for the next compile (on another worker). The slow lane holds ``max_slow`` compiles;
  while it is full, a compile that turns slow keeps its regular place.
- At its deadline a compile's worker is killed (SIGKILL) and the compile raises TimeoutError;
  the next compile starts a fresh worker, so the capacity is back at once.
- Up to ``workers`` idle workers are kept for reuse; any other worker exits with its compile.

So at most ``workers + max_slow`` workers exist, each capped at ``memory_mib`` of address space.
With up to ``max_slow`` pathological specs in flight, an ordinary one waits about
``slow_after_s`` for each ``workers`` of them queued ahead of it; only beyond that does it wait
for a deadline to free a place.
"""

from __future__ import annotations

import pickle
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from radixlm.runtime.constrained.compile_worker import CompileWorker
from radixlm.runtime.constrained.index_cache import IndexCache

SHUT_DOWN = "the grammar compiler was shut down"


@runtime_checkable
class IndexBackend(Protocol):
    """A backend whose heavy step is an outlines-core ``Index(regex, vocabulary)``."""

    vocabulary: Any

    def using(self, build_index: Any) -> Any:
        """This backend with its indexes built by ``build_index(regex)``."""


@dataclass(frozen=True)
class PoolLimits:
    """How many workers run compiles, when a compile counts as slow, and each one's memory."""

    workers: int = 2
    max_slow: int = 4
    slow_after_s: float = 2.0
    memory_mib: int = 2048

    def __post_init__(self) -> None:
        if self.workers < 1 or self.max_slow < 0:
            raise ValueError("grammar compiles need workers >= 1 and max_slow >= 0")
        if self.slow_after_s <= 0 or self.memory_mib < 256:
            raise ValueError("grammar compiles need slow_after_s > 0 and memory_mib >= 256")


class _Turn:
    """One compile's ticket while it waits, then its lane."""

    slow = False


class CompilePool:
    """Builds outlines-core indexes in worker processes under the policy above."""

    def __init__(self, vocabulary: Any, limits: PoolLimits, disk_cache: str | None = None) -> None:
        self.limits = limits
        self._vocabulary = pickle.dumps(vocabulary)
        self._disk = None if disk_cache is None else IndexCache(disk_cache, self._vocabulary)
        self._idle: list[CompileWorker] = []
        self._live: set[CompileWorker] = set()
        self._queue: deque[_Turn] = deque()
        self._regular = 0
        self._slow = 0
        self._closed = False
        self._cond = threading.Condition()

    def build(self, regex: str, deadline: float) -> Any:
        """The ``Index`` of ``regex``: TimeoutError at ``deadline`` (``time.monotonic``),
        ValueError for a regex the worker rejects or that needs more than ``memory_mib``. With
        a disk cache, a slow build is read back from it after a restart."""
        if self._disk is not None and (index := self._disk.get(regex)) is not None:
            return index
        turn = self._enter(deadline)
        worker = None
        started = time.monotonic()
        try:
            worker = self._worker()
            index = self._run(worker, regex, deadline, turn)
        finally:
            self._leave(turn, worker)
        if self._disk is not None:
            self._disk.put(regex, index, time.monotonic() - started)
        return index

    def shutdown(self) -> None:
        """Kill every worker; compiles in flight or waiting raise RuntimeError."""
        with self._cond:
            self._closed = True
            idle, busy = list(self._idle), self._live - set(self._idle)
            self._idle.clear()
            self._live.clear()
            self._cond.notify_all()
        for worker in idle:
            worker.close()
        for worker in busy:
            worker.kill()

    def _enter(self, deadline: float) -> _Turn:
        turn = _Turn()
        with self._cond:
            self._queue.append(turn)
            wait_s = max(0.0, deadline - time.monotonic())
            started = self._cond.wait_for(lambda: self._may_start(turn), wait_s)
            self._queue.remove(turn)
            self._cond.notify_all()
            if self._closed:
                raise RuntimeError(SHUT_DOWN)
            if not started:
                raise TimeoutError("no grammar compile worker was free before the deadline")
            self._regular += 1
        return turn

    def _may_start(self, turn: _Turn) -> bool:
        first = self._queue[0] is turn
        return self._closed or (first and self._regular < self.limits.workers)

    def _worker(self) -> CompileWorker:
        with self._cond:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                self._live.discard(worker)
                worker.close()
        worker = CompileWorker(self._vocabulary, self.limits.memory_mib)
        with self._cond:
            self._live.add(worker)
            closed = self._closed
        if closed:
            raise RuntimeError(SHUT_DOWN)
        return worker

    def _run(self, worker: CompileWorker, regex: str, deadline: float, turn: _Turn) -> Any:
        worker.send(regex)
        slow_at = time.monotonic() + self.limits.slow_after_s
        if not worker.wait(min(slow_at, deadline) - time.monotonic()):
            self._to_slow_lane(turn)
            if not worker.wait(deadline - time.monotonic()):
                worker.kill()
                raise TimeoutError("the grammar compile ran past its deadline")
        return self._outcome(*worker.reply())

    def _to_slow_lane(self, turn: _Turn) -> None:
        with self._cond:
            if self._slow < self.limits.max_slow:
                self._slow, self._regular, turn.slow = self._slow + 1, self._regular - 1, True
                self._cond.notify_all()

    def _outcome(self, status: str, payload: Any) -> Any:
        if status == "ok":
            return payload
        if self._closed:
            raise RuntimeError(SHUT_DOWN)
        if status == "error":
            raise ValueError(payload)
        if status == "memory" or payload in (-signal.SIGABRT, -signal.SIGKILL):
            raise ValueError(f"the grammar needs more than {self.limits.memory_mib} MiB to compile")
        raise ValueError(f"the grammar compile worker exited with code {payload}")

    def _leave(self, turn: _Turn, worker: CompileWorker | None) -> None:
        with self._cond:
            if turn.slow:
                self._slow -= 1
            else:
                self._regular -= 1
            keep = worker is not None and not worker.busy and worker.alive()
            keep = keep and not self._closed and len(self._idle) < self.limits.workers
            if keep:
                self._idle.append(worker)
            else:
                self._live.discard(worker)
            self._cond.notify_all()
        if worker is not None and not keep:
            worker.close()
