"""Torch threads per process: the chooser, and what a running engine reports."""

from __future__ import annotations

import os

import pytest

from radixlm import Engine
from radixlm.runtime import threads
from radixlm.runtime.config import ServerArgs


def test_explicit_count_beats_the_environment():
    env = {"RADIXLM_NUM_THREADS": "5", "OMP_NUM_THREADS": "7"}
    assert threads.compute_threads(3, environ=env) == 3
    assert threads.compute_threads(None, environ=env) == 5
    assert threads.compute_threads(None, environ={"OMP_NUM_THREADS": "7"}) == 7


def test_default_leaves_a_core_and_shares_the_rest_up_to_eight():
    spare = max(1, threads.available_cores() - 1)
    default = min(spare, threads.MAX_DEFAULT_THREADS)
    assert threads.compute_threads(None, environ={}) == default
    assert threads.compute_threads(None, environ={"RADIXLM_NUM_THREADS": ""}) == default
    assert threads.compute_threads(None, processes=spare + 1, environ={}) == 1
    assert threads.compute_threads(None, environ={"OMP_NUM_THREADS": "3,2"}) == 3


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_bad_environment_value_names_the_variable(value):
    with pytest.raises(ValueError, match="RADIXLM_NUM_THREADS must be an integer >= 1"):
        threads.compute_threads(None, environ={"RADIXLM_NUM_THREADS": value})


def test_bad_num_threads_option_names_the_field():
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        ServerArgs(num_threads=0)


def test_child_environment_waits_passively_unless_the_user_chose():
    env = threads.child_env(3, environ={"PATH": "/bin"})
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("3", "3")
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["PATH"] == "/bin"
    assert "OMP_WAIT_POLICY" not in threads.child_env(1, environ={"GOMP_SPINCOUNT": "1000"})
    active = threads.child_env(1, environ={"OMP_WAIT_POLICY": "ACTIVE"})
    assert active["OMP_WAIT_POLICY"] == "ACTIVE"


def test_engine_with_one_thread_reports_it(tiny_llama):
    engine = Engine(tiny_llama, dtype="float32", max_total_tokens=1024, num_threads=1)
    try:
        counts = engine.get_server_info()["threads"]
        assert (counts["scheduler"], counts["detokenizer"]) == (1, 0)  # NOTE: 0: no torch
        assert engine.generate("Hello", {"max_new_tokens": 2})["meta_info"]["completion_tokens"]
    finally:
        engine.shutdown()


def test_default_engine_gives_only_the_scheduler_a_pool(tiny_engine):
    counts = tiny_engine.get_server_info()["threads"]
    assert counts["scheduler"] == threads.compute_threads(None)
    assert counts["detokenizer"] == 0 and counts["server"] >= 1
    scheduler = tiny_engine.runtime.backend.procs["scheduler"]
    if os.path.exists(f"/proc/{scheduler.pid}/environ"):
        with open(f"/proc/{scheduler.pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        assert b"OMP_WAIT_POLICY" in env or b"GOMP_SPINCOUNT" in env
