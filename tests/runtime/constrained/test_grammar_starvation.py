"""Pathological specs time out for real: their workers are killed, they are not cached, and
ordinary specs sent meanwhile compile in their normal time, without growing the scheduler."""

from __future__ import annotations

import json
import time

import pytest
from worker_helpers import wait_until, worker_pids

from radixlm.runtime.constrained.base import Grammar
from radixlm.runtime.constrained.compiler import GrammarCompiler

TIMEOUT_S = 4.0
PATHOLOGICAL = ("(a|b)*a(a|b){16}", "(a|b)*b(a|b){16}", "a{100000}", "(a{1,100}){1,100}")
KILLED = (PATHOLOGICAL[0], PATHOLOGICAL[1], PATHOLOGICAL[3])
ORDINARY = ("regex", r"[A-Z][a-z]{2,8}-[0-9]{3}")
SCHEMA = ("json_schema", json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}}))


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


@pytest.fixture
def compiler(backends):
    compiler = GrammarCompiler(backends["outlines"], timeout_s=TIMEOUT_S, slow_after_s=0.5)
    yield compiler
    compiler.shutdown()


def test_pathological_specs_do_not_starve_ordinary_ones(compiler):
    others = worker_pids()
    compiler.submit("regex", "warm-up [0-9]+").result(timeout=30)
    rss = rss_mib()
    bad = {spec: compiler.submit("regex", spec) for spec in PATHOLOGICAL}
    assert wait_until(lambda: len(worker_pids() - others) == len(KILLED))
    busy = worker_pids() - others

    start = time.monotonic()
    good = [compiler.submit(*ORDINARY), compiler.submit(*SCHEMA)]
    for future in good:
        assert isinstance(future.result(timeout=TIMEOUT_S), Grammar)
    assert time.monotonic() - start < TIMEOUT_S
    assert not any(bad[spec].done() for spec in KILLED)

    assert "100000 positions" in str(bad["a{100000}"].exception(timeout=1))
    for spec in KILLED:
        assert isinstance(bad[spec].exception(timeout=2 * TIMEOUT_S), TimeoutError)
    assert wait_until(lambda: not busy & worker_pids())
    assert rss_mib() - rss < 256

    again = compiler.submit("regex", KILLED[0])
    assert again is not bad[KILLED[0]] and not again.done()
    assert compiler.submit("regex", "a{100000}") is bad["a{100000}"]


def test_memory_cap_fails_the_spec_with_a_clear_error(backends):
    others = worker_pids()
    compiler = GrammarCompiler(backends["outlines"], memory_mib=256)
    try:
        future = compiler.submit("regex", "[a-z]{0,1000}")
        error = future.exception(timeout=60)
        assert isinstance(error, ValueError) and "more than 256 MiB" in str(error)
        assert compiler.submit("regex", "[a-z]{0,1000}") is future
        assert isinstance(compiler.submit("regex", "[a-z]{0,10}").result(timeout=30), Grammar)
    finally:
        compiler.shutdown()
    assert wait_until(lambda: worker_pids() <= others)
