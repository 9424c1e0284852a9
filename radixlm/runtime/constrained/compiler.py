"""Compiles grammars off the scheduler's hot loop: threads, an LRU cache of futures, deadlines.

A backend whose heavy step is an outlines-core index (``IndexBackend``) builds it in worker
processes (``compile_pool.py``): a build past its deadline is killed there, and its memory is
capped. Other backends (llguidance compiles lazily and fast) compile in the threads.

What is cached: a grammar, and a ValueError (a bad spec stays bad). A timeout is not: at the
deadline the entry is dropped, so a later identical request compiles again. A thread compile
cannot be stopped; if it ends after its deadline, its grammar fills the entry when it is empty.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import CancelledError, Future, InvalidStateError, ThreadPoolExecutor
from functools import partial

from radixlm.runtime.constrained.base import Grammar, GrammarBackend
from radixlm.runtime.constrained.compile_pool import CompilePool, IndexBackend, PoolLimits
from radixlm.runtime.constrained.limits import check_spec_size

Key = tuple[str, str]


class GrammarCompiler:
    """Hands out futures of compiled grammars, one compile per distinct ``(kind, spec)``.

    The scheduler calls ``submit`` when a constrained request arrives, then ``result`` (or
    ``future.done()``) once per step: the future ends with the ``Grammar``, with a
    ``ValueError`` for a bad or oversized spec, or with ``TimeoutError`` after ``timeout_s``
    (counted from ``submit``). ``max_workers`` compiles run at once, plus up to ``max_slow``
    that have run longer than ``slow_after_s`` (worker processes only; see ``compile_pool``).
    ``disk_cache``: a directory where slow indexes are kept across restarts (``index_cache``).
    """

    def __init__(
        self,
        backend: GrammarBackend,
        max_workers: int = 2,
        cache_size: int = 256,
        timeout_s: float = 30.0,
        *,
        max_slow: int = 4,
        slow_after_s: float = 2.0,
        memory_mib: int = 2048,
        disk_cache: str | None = None,
    ) -> None:
        self.backend = backend
        self.cache_size = cache_size
        self.timeout_s = timeout_s
        self._workers: CompilePool | None = None
        threads = max_workers
        if isinstance(backend, IndexBackend):
            limits = PoolLimits(max_workers, max_slow, slow_after_s, memory_mib)
            self._workers = CompilePool(backend.vocabulary, limits, disk_cache)
            threads += max_slow
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="grammar-compile")
        self._cache: OrderedDict[Key, Future[Grammar]] = OrderedDict()
        self._lock = threading.Lock()

    def submit(self, kind: str, spec: str) -> Future[Grammar]:
        """The future grammar for ``(kind, spec)``; a cached one is returned as is."""
        key = (kind, spec)
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                return future
            future = Future()
            self._store(key, future)
        deadline = time.monotonic() + self.timeout_s
        timer = threading.Timer(self.timeout_s, self._expire, (key, future))
        timer.daemon = True
        timer.start()
        self._pool.submit(self._compile, key, future, timer, deadline)
        return future

    @staticmethod
    def result(future: Future[Grammar]) -> Grammar | Exception | None:
        """Non-blocking: None while compiling, else the grammar or the exception that ended it."""
        if not future.done():
            return None
        if future.cancelled():
            return CancelledError("the grammar compile was cancelled")
        error = future.exception()
        return error if error is not None else future.result()

    def shutdown(self) -> None:
        """Stop the threads and kill the worker processes: compiles not yet started are
        cancelled, builds in flight on a worker end with RuntimeError."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._workers is not None:
            self._workers.shutdown()

    def __len__(self) -> int:
        return len(self._cache)

    def _compile(
        self, key: Key, future: Future[Grammar], timer: threading.Timer, deadline: float
    ) -> None:
        if future.done():
            return
        try:
            check_spec_size(*key)
            grammar = self._backend(deadline).compile(*key)
        except TimeoutError:
            self._expire(key, future)
        except Exception as e:  # noqa: BLE001 - any failure ends only this constraint
            _settle(future, error=e)
        else:
            if not _settle(future, grammar=grammar):
                self._cache_late(key, grammar)
        finally:
            timer.cancel()

    def _backend(self, deadline: float) -> GrammarBackend:
        if self._workers is None:
            return self.backend
        return self.backend.using(partial(self._workers.build, deadline=deadline))

    def _expire(self, key: Key, future: Future[Grammar]) -> None:
        message = f"compiling the {key[0]} constraint took over {self.timeout_s}s"
        _settle(future, error=TimeoutError(message))
        with self._lock:
            if self._cache.get(key) is future:
                del self._cache[key]

    def _cache_late(self, key: Key, grammar: Grammar) -> None:
        done: Future[Grammar] = Future()
        done.set_result(grammar)
        with self._lock:
            if key not in self._cache:
                self._store(key, done)

    def _store(self, key: Key, future: Future[Grammar]) -> None:
        self._cache[key] = future
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)


def _settle(
    future: Future[Grammar], grammar: Grammar | None = None, error: Exception | None = None
) -> bool:
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(grammar)
    except InvalidStateError:
        return False
    return True
