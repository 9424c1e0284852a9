"""IndexCache: slow outlines-core indexes kept on disk across pools (restarts), keyed by the
vocabulary, bounded in bytes, and a damaged file is rebuilt, not trusted."""

from __future__ import annotations

import os
import pickle
import time

from outlines_core import Index, Vocabulary
from worker_helpers import tiny_vocabulary, worker_pids

from radixlm.runtime.constrained.compile_pool import CompilePool, PoolLimits
from radixlm.runtime.constrained.index_cache import IndexCache

REGEX = "[a-c]+x"


def _cache(root, vocabulary=None, **kw) -> IndexCache:
    return IndexCache(str(root), pickle.dumps(vocabulary or tiny_vocabulary()), **kw)


def test_a_slow_build_is_read_back_by_a_new_pool_without_a_worker(tmp_path):
    first = CompilePool(tiny_vocabulary(), PoolLimits(workers=1), disk_cache=str(tmp_path))
    first._disk.min_build_s = 0.0  # NOTE: the tiny regex builds in milliseconds
    try:
        built = first.build(REGEX, time.monotonic() + 10)
    finally:
        first.shutdown()
    second = CompilePool(tiny_vocabulary(), PoolLimits(workers=1), disk_cache=str(tmp_path))
    before = worker_pids()  # NOTE: other tests' pools may keep idle workers in this process
    try:
        read = second.build(REGEX, time.monotonic() + 10)
        assert worker_pids() <= before  # NOTE: no worker was started for it
    finally:
        second.shutdown()
    assert read.get_transitions() == built.get_transitions()


def test_fast_builds_are_not_stored_and_vocabularies_do_not_share(tmp_path):
    cache = _cache(tmp_path)
    index = Index(REGEX, tiny_vocabulary())
    cache.put(REGEX, index, build_s=0.01)
    assert cache.get(REGEX) is None
    cache.put(REGEX, index, build_s=5.0)
    assert cache.get(REGEX).get_transitions() == index.get_transitions()
    other = _cache(tmp_path, Vocabulary(0, {b"a": [1], b"x": [2]}))
    assert other.dir != cache.dir and other.get(REGEX) is None


def test_the_oldest_files_go_past_the_budget_and_damaged_files_are_misses(tmp_path):
    cache = _cache(tmp_path)
    regexes = ["[a-c]+x", "a+x", "b+x"]
    for i, regex in enumerate(regexes):
        cache.put(regex, Index(regex, tiny_vocabulary()), build_s=5.0)
        os.utime(cache._path(regex), (1000 + i, 1000 + i))
    one = os.path.getsize(cache._path(regexes[0]))
    cache.budget_bytes = 2 * one + one // 2
    cache.put("c+x", Index("c+x", tiny_vocabulary()), build_s=5.0)
    kept = [r for r in [*regexes, "c+x"] if os.path.exists(cache._path(r))]
    assert kept == ["b+x", "c+x"]
    with open(cache._path("c+x"), "wb") as f:
        f.write(b"not a pickle")
    assert cache.get("c+x") is None and not os.path.exists(cache._path("c+x"))
