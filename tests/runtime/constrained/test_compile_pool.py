"""CompilePool: index builds in killable worker processes, a slow lane, and no leftovers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from outlines_core import Index
from worker_helpers import in_thread, tiny_vocabulary, wait_until, worker_pids

from radixlm.runtime.constrained.compile_pool import CompilePool, PoolLimits

ENDLESS = "(a|b)*a(a|b){22}"
ORDINARY = "[a-c]+x"


@pytest.fixture
def pool():
    pool = CompilePool(tiny_vocabulary(), PoolLimits(workers=1, max_slow=1, slow_after_s=0.3))
    yield pool
    pool.shutdown()


def test_build_returns_the_same_index_as_in_process(pool):
    index = pool.build(ORDINARY, time.monotonic() + 10)
    assert isinstance(index, Index)
    assert index.get_transitions() == Index(ORDINARY, tiny_vocabulary()).get_transitions()


def test_bad_regex_is_a_value_error_and_the_worker_is_reused(pool):
    with pytest.raises(ValueError):
        pool.build("(a", time.monotonic() + 10)
    pids = worker_pids()
    pool.build(ORDINARY, time.monotonic() + 10)
    assert worker_pids() == pids and len(pids) == 1


def test_deadline_kills_the_worker_and_the_next_build_gets_a_fresh_one(pool):
    slow = in_thread(pool, ENDLESS, 1.0)
    assert wait_until(lambda: len(worker_pids()) == 1)
    busy = worker_pids()
    slow["thread"].join(10)
    assert isinstance(slow["error"], TimeoutError)
    assert not busy & worker_pids()
    pool.build(ORDINARY, time.monotonic() + 10)


def test_slow_build_frees_its_place_for_an_ordinary_one(pool):
    slow = in_thread(pool, ENDLESS, 3.0)
    start = time.monotonic()
    pool.build(ORDINARY, start + 3.0)
    assert "at" not in slow
    assert time.monotonic() - start < 2.5
    slow["thread"].join(10)
    assert isinstance(slow["error"], TimeoutError)


def test_shutdown_kills_busy_and_idle_workers():
    pool = CompilePool(tiny_vocabulary(), PoolLimits(workers=2, max_slow=1, slow_after_s=0.3))
    slow = in_thread(pool, ENDLESS, 30.0)
    assert wait_until(lambda: len(worker_pids()) == 1)
    pool.build(ORDINARY, time.monotonic() + 10)
    assert len(worker_pids()) == 2
    pool.shutdown()
    slow["thread"].join(5)
    assert isinstance(slow["error"], RuntimeError)
    assert worker_pids() == set()


def test_workers_die_with_a_killed_scheduler():
    script = textwrap.dedent(
        f"""
        import sys, threading, time
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from worker_helpers import tiny_vocabulary
        from radixlm.runtime.constrained.compile_pool import CompilePool, PoolLimits
        pool = CompilePool(tiny_vocabulary(), PoolLimits())
        run = lambda: pool.build({ENDLESS!r}, time.monotonic() + 60)
        threading.Thread(target=run, daemon=True).start()
        time.sleep(0.5)
        pool.build("a+", time.monotonic() + 10)
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        assert wait_until(lambda: len(worker_pids(proc.pid)) == 2)
        workers = worker_pids(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in workers))
