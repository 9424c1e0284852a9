"""Compiles grammars off the scheduler's hot loop: a thread pool, an LRU cache and a deadline."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import CancelledError, Future, InvalidStateError, ThreadPoolExecutor

from radixlm.runtime.constrained.base import Grammar, GrammarBackend

Key = tuple[str, str]


class GrammarCompiler:
    """Hands out futures of compiled grammars, one compile per distinct ``(kind, spec)``.

    The scheduler calls ``submit`` when a constrained request arrives, then ``result`` (or
    ``future.done()``) once per step: the future ends with the ``Grammar``, with the backend's
    ``ValueError`` for a bad spec, or with ``TimeoutError`` after ``timeout_s``. Failures are
    cached too (a bad spec stays bad); a compile that finishes after its deadline still fills
    the cache for later requests.
    """

    def __init__(
        self,
        backend: GrammarBackend,
        max_workers: int = 2,
        cache_size: int = 256,
        timeout_s: float = 30.0,
    ) -> None:
        self.backend = backend
        self.cache_size = cache_size
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="grammar-compile")
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
        timer = threading.Timer(self.timeout_s, _expire, (future, key, self.timeout_s))
        timer.daemon = True
        timer.start()
        self._pool.submit(self._compile, key, future, timer)
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
        """Stop the workers; compiles not yet started are cancelled."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __len__(self) -> int:
        return len(self._cache)

    def _compile(self, key: Key, future: Future[Grammar], timer: threading.Timer) -> None:
        try:
            grammar = self.backend.compile(*key)
        except Exception as e:  # noqa: BLE001 - any failure ends only this constraint
            _settle(future, error=e)
        else:
            if not _settle(future, grammar=grammar):
                self._cache_late(key, future, grammar)
        finally:
            timer.cancel()

    def _cache_late(self, key: Key, expired: Future[Grammar], grammar: Grammar) -> None:
        done: Future[Grammar] = Future()
        done.set_result(grammar)
        with self._lock:
            if self._cache.get(key) is expired:
                self._cache[key] = done

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


def _expire(future: Future[Grammar], key: Key, timeout_s: float) -> None:
    kind = key[0]
    _settle(future, error=TimeoutError(f"compiling the {kind} constraint took over {timeout_s}s"))
