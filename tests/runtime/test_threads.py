"""Torch threads per process: the chooser, and what a running engine reports."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from radixlm import Engine
from radixlm.runtime import threads
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.model_runner import ModelRunner


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


def test_big_steps_take_every_core_unless_the_user_chose():
    cores = min(threads.available_cores(), threads.MAX_DEFAULT_THREADS)
    assert threads.big_step_threads(None, environ={}) == cores
    assert threads.big_step_threads(None, processes=cores + 1, environ={}) == 1
    assert threads.big_step_threads(3, environ={}) == 3
    assert threads.big_step_threads(None, environ={"RADIXLM_NUM_THREADS": "5"}) == 5
    assert threads.big_step_threads(None, environ={"OMP_NUM_THREADS": "2"}) == 2
    with pytest.raises(ValueError, match="OMP_NUM_THREADS must be an integer >= 1"):
        threads.big_step_threads(None, environ={"OMP_NUM_THREADS": "0"})


class FixedLoad:
    """Other processes' load as a test sets it (``OtherLoad`` reads the machine's)."""

    capacity = 2

    def __init__(self, other: float) -> None:
        self.other = other

    def sample(self) -> float:
        return self.other


def test_big_steps_take_the_cores_other_processes_leave_free(monkeypatch):
    monkeypatch.setattr(threads, "LOAD_WINDOW_S", 0.0)  # NOTE: re-measure at every step
    load = FixedLoad(0.0)
    steps = threads.StepThreads(1, 2, load=load)
    before = torch.get_num_threads()
    try:
        assert steps.for_step(threads.BIG_STEP_TOKENS) == 2 == torch.get_num_threads()
        assert steps.for_step(threads.BIG_STEP_TOKENS - 1) == 1 == torch.get_num_threads()
        load.other = 0.67  # NOTE: a busy process sharing our 2 threads' cores gets ~2/3 of one
        assert steps.for_step(threads.BIG_STEP_TOKENS) == 1 == torch.get_num_threads()
        load.other = 0.1  # NOTE: it stopped; the server's bits of work leave both cores
        assert steps.for_step(threads.BIG_STEP_TOKENS) == 2 == torch.get_num_threads()
        # NOTE: a lone request's steps (single-stream decode, its verify steps) take them too,
        # several requests' small steps do not
        assert steps.for_step(1, 1) == 2 and steps.for_step(4, 1) == 2
        assert steps.for_step(3, 3) == 1 == torch.get_num_threads()
        load.other = 0.67
        assert steps.for_step(1, 1) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_other_load_counts_another_process():
    load = threads.OtherLoad()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        load.sample()
        time.sleep(0.5)
        other = load.sample()
    finally:
        spinner.kill()
        spinner.wait()
    assert other is not None and other > 0.5  # NOTE: the spinner's core (CI may add more)


def test_model_runner_sizes_the_pool_per_step(tiny_llama):
    """A step of BIG_STEP_TOKENS tokens runs on the big count (eagerly), and so does a lone
    request's decode step; a step of several requests' few tokens on the small one; the
    outputs do not depend on it."""
    before = torch.get_num_threads()
    runner = ModelRunner(
        ServerArgs(model_path=tiny_llama, dtype="float32", max_total_tokens=1024),
        step_threads=threads.StepThreads(1, 2, load=FixedLoad(0.0)),
    )
    n = threads.BIG_STEP_TOKENS
    ids = [(7 * i) % 200 + 1 for i in range(n + 1)]
    table = runner.req_pool.table
    table[0, : n + 1] = torch.arange(1, n + 2)

    def step(lo: int, hi: int) -> torch.Tensor:
        batch = ForwardBatch.build(
            input_ids=ids[lo:hi], prefix_lens=[lo], extend_lens=[hi - lo], req_slots=[0],
            out_cache_loc=table[0, lo:hi].clone(), logits_indices=[hi - lo - 1],
            req_to_token=table,
        )  # fmt: skip
        return runner.forward(batch)

    try:
        torch.set_num_threads(1)
        step(0, n)
        assert torch.get_num_threads() == 2
        last = step(n, n + 1)
        assert torch.get_num_threads() == 2
        runner.step_threads.for_step(2, 2)
        assert torch.get_num_threads() == 1
        runner.step_threads = None  # NOTE: the same prompt again, all on one thread
        step(0, n)
        torch.testing.assert_close(step(n, n + 1), last, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_bad_environment_value_names_the_variable(value):
    with pytest.raises(ValueError, match="RADIXLM_NUM_THREADS must be an integer >= 1"):
        threads.compute_threads(None, environ={"RADIXLM_NUM_THREADS": value})


def test_bad_num_threads_option_names_the_field():
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        ServerArgs(num_threads=0)


def test_child_environment_spins_briefly_unless_the_user_chose():
    env = threads.child_env(3, environ={"PATH": "/bin"})
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("3", "3")
    assert env["GOMP_SPINCOUNT"] == threads.SPIN_WAIT["GOMP_SPINCOUNT"] and env["PATH"] == "/bin"
    assert "OMP_WAIT_POLICY" not in env
    assert threads.child_env(1, environ={"GOMP_SPINCOUNT": "1000"})["GOMP_SPINCOUNT"] == "1000"
    assert "GOMP_SPINCOUNT" not in threads.child_env(1, environ={"OMP_WAIT_POLICY": "PASSIVE"})
    active = threads.child_env(1, environ={"OMP_WAIT_POLICY": "ACTIVE"})
    assert active["OMP_WAIT_POLICY"] == "ACTIVE"


def test_child_environment_caps_glibc_heaps_and_onednn_caches_unless_the_user_chose():
    assert threads.child_env(1, environ={})["MALLOC_ARENA_MAX"] == "2"
    assert threads.child_env(1, environ={"MALLOC_ARENA_MAX": "8"})["MALLOC_ARENA_MAX"] == "8"
    env = threads.child_env(1, environ={"LRU_CACHE_CAPACITY": "1024"})
    assert env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "64" and env["LRU_CACHE_CAPACITY"] == "1024"


def test_engine_with_one_thread_reports_it(tiny_llama):
    engine = Engine(tiny_llama, dtype="float32", max_total_tokens=1024, num_threads=1)
    try:
        counts = engine.get_server_info()["threads"]
        assert (counts["scheduler"], counts["detokenizer"]) == (1, 0)  # NOTE: 0: no torch
        assert counts["scheduler_big_steps"] == 1  # NOTE: the user's count holds for every step
        assert engine.generate("Hello", {"max_new_tokens": 2})["meta_info"]["completion_tokens"]
    finally:
        engine.shutdown()


def test_default_engine_gives_only_the_scheduler_a_pool(tiny_engine):
    counts = tiny_engine.get_server_info()["threads"]
    assert counts["scheduler"] == threads.compute_threads(None)
    assert counts["scheduler_big_steps"] == threads.big_step_threads(None)
    assert counts["detokenizer"] == 0 and counts["server"] >= 1
    scheduler = tiny_engine.runtime.backend.procs["scheduler"]
    if os.path.exists(f"/proc/{scheduler.pid}/environ"):
        with open(f"/proc/{scheduler.pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        assert b"OMP_WAIT_POLICY" in env or b"GOMP_SPINCOUNT" in env
