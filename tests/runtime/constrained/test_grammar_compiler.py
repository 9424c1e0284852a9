"""GrammarCompiler: one compile per spec, errors and timeouts through the future, LRU bound."""

from __future__ import annotations

import threading
import time

import pytest

from radixlm.runtime.constrained.base import Grammar
from radixlm.runtime.constrained.compiler import GrammarCompiler


class _StubGrammar(Grammar):
    def matcher(self):
        raise NotImplementedError


class _StubBackend:
    """Compiles instantly, or blocks until ``release`` is set for specs starting with 'slow'."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.release = threading.Event()

    def compile(self, kind: str, spec: str) -> Grammar:
        self.calls.append((kind, spec))
        if spec.startswith("bad"):
            raise ValueError(f"bad spec {spec}")
        if spec.startswith("slow"):
            self.release.wait(5)
        return _StubGrammar()


@pytest.fixture
def stub():
    backend = _StubBackend()
    yield backend
    backend.release.set()


def test_same_spec_shares_one_future_and_grammar(stub):
    compiler = GrammarCompiler(stub)
    first = compiler.submit("regex", "a+")
    grammar = first.result(timeout=5)
    again = compiler.submit("regex", "a+")
    assert again is first and again.done() and compiler.result(again) is grammar
    assert stub.calls == [("regex", "a+")]


def test_compile_error_arrives_through_the_future(stub):
    compiler = GrammarCompiler(stub)
    future = compiler.submit("regex", "bad(")
    future.exception(timeout=5)
    outcome = compiler.result(future)
    assert isinstance(outcome, ValueError) and "bad(" in str(outcome)
    assert compiler.submit("regex", "bad(") is future


def test_result_is_none_while_compiling(stub):
    compiler = GrammarCompiler(stub, timeout_s=5)
    future = compiler.submit("regex", "slow")
    assert compiler.result(future) is None
    stub.release.set()
    future.result(timeout=5)
    assert isinstance(compiler.result(future), Grammar)


def test_timeout_is_not_cached_and_a_late_grammar_fills_the_empty_entry(stub):
    compiler = GrammarCompiler(stub, timeout_s=0.05)
    future = compiler.submit("regex", "slow")
    assert isinstance(future.exception(timeout=5), TimeoutError)
    assert isinstance(compiler.result(future), TimeoutError)
    assert len(compiler) == 0
    stub.release.set()
    deadline = time.monotonic() + 5
    while not len(compiler) and time.monotonic() < deadline:
        time.sleep(0.01)
    late = compiler.submit("regex", "slow")
    assert late is not future and isinstance(compiler.result(late), Grammar)
    assert stub.calls == [("regex", "slow")]


def test_a_timed_out_spec_compiles_again_on_the_next_submit(stub):
    compiler = GrammarCompiler(stub, timeout_s=0.05)
    first = compiler.submit("regex", "slow-again")
    assert isinstance(first.exception(timeout=5), TimeoutError)
    second = compiler.submit("regex", "slow-again")
    assert second is not first
    stub.release.set()
    assert isinstance(second.result(timeout=5), Grammar)
    assert stub.calls.count(("regex", "slow-again")) == 2


def test_oversized_spec_fails_before_compiling(stub):
    compiler = GrammarCompiler(stub)
    future = compiler.submit("regex", "a" * 200_000)
    error = future.exception(timeout=5)
    assert isinstance(error, ValueError) and "200000 characters" in str(error)
    assert stub.calls == []


def test_cache_is_bounded_lru(stub):
    compiler = GrammarCompiler(stub, cache_size=2)
    a = compiler.submit("regex", "a")
    compiler.submit("regex", "b").result(timeout=5)
    compiler.submit("regex", "a")
    compiler.submit("regex", "c").result(timeout=5)
    assert len(compiler) == 2
    assert compiler.submit("regex", "a") is a
    assert stub.calls.count(("regex", "b")) == 1
    compiler.submit("regex", "b").result(timeout=5)
    assert stub.calls.count(("regex", "b")) == 2


def test_real_backend_error_does_not_raise_in_caller(compilers):
    for compiler in compilers.values():
        future = compiler.submit("regex", "(?=x)y")
        assert isinstance(future.exception(timeout=30), ValueError)
        good = compiler.submit("json_schema", '{"type":"integer"}')
        assert compiler.submit("json_schema", '{"type":"integer"}') is good
        assert good.result(timeout=30) is compiler.result(good)
