"""The lifecycle of the compiled CPU decode graphs (executor/aot_graphs.py), on ``low_memory``
runners (two graphs, the cheapest to build): built once by a child process however many
processes want them, the same greedy tokens and logits (within bf16 rounding) as the eager
steps; loaded from disk by a later process, which never imports torch's compiler; a corrupt
package is built again, never loaded; a build that fails or a cache that cannot be written
leaves the steps eager with the reason in the status, logged once."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor import aot_graphs
from radixlm.runtime.executor.aot_graphs import AotGraphs, file_digest
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.quant import int4_available
from radixlm.runtime.models.quant_head import int8_head_available
from tests.runtime.test_cpu_compile import (
    assert_decode_matches_eager,
    assert_loaded_in_new_process,
    decode_logits,
)

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not (int4_available() and int8_head_available() and aot_graphs.available()),
        reason="torch lacks the int4/int8 kernels or AOTInductor",
    ),
]
GRAPHS = ["1@1", "decode@1"]  # NOTE: a runner without big steps: one thread


def low_memory_runner(model_path: str) -> ModelRunner:
    return ModelRunner(ServerArgs(model_path=model_path, dtype="bfloat16", low_memory=True,
                                  max_total_tokens=1024, disable_cpu_compile=False))  # fmt: skip


@pytest.fixture(scope="module")
def compiled(tiny_llama, aot_cache) -> ModelRunner:
    """A runner whose graphs compiled, started beside a second one with the same key: that one
    waits for the compile and loads its packages instead of compiling them again."""
    calls, compile_packages = [], aot_graphs.compile_packages

    def counted(*args):
        calls.append(args)
        yield from compile_packages(*args)

    runner, twin = low_memory_runner(tiny_llama), low_memory_runner(tiny_llama)
    assert isinstance(runner.cpu_graphs, AotGraphs) and runner.cpu_compile_status == "compiling"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(aot_graphs, "compile_packages", counted)
        runner.cpu_graphs.start()
        twin.cpu_graphs.start()
        assert runner.cpu_graphs.wait(800), "compiling took over 13 minutes"
        assert twin.cpu_graphs.wait(60)
    assert runner.cpu_compile_status == twin.cpu_compile_status == "ready"
    assert len(calls) == 1 and runner.cpu_graphs.dir == twin.cpu_graphs.dir
    for graph in GRAPHS:  # NOTE: each published whole, as its record says
        record = json.loads((runner.cpu_graphs.dir / f"{graph}.json").read_text())
        assert file_digest(runner.cpu_graphs.dir / f"{graph}.pt2") == record["sha256"]
    assert not list(runner.cpu_graphs.dir.glob("*.staged.pt2"))
    return runner


def test_compiled_decode_matches_eager(compiled):
    assert set(compiled.cpu_graphs.compile_s) == set(GRAPHS)
    assert_decode_matches_eager(compiled, tol=5e-2)


def test_steps_the_graphs_do_not_take_run_eagerly(compiled):
    from radixlm.runtime.executor.forward_batch import ForwardBatch

    table = compiled.req_pool.table
    table[0, :4] = torch.arange(300, 304)
    prefill = ForwardBatch.build(
        input_ids=[5, 6, 7], prefix_lens=[0], extend_lens=[3], req_slots=[0],
        out_cache_loc=table[0, :3], logits_indices=[2], req_to_token=table,
    )  # fmt: skip
    verify = ForwardBatch.build(
        input_ids=[7, 8], prefix_lens=[2], extend_lens=[2], req_slots=[0],
        out_cache_loc=table[0, 2:4], logits_indices=[0, 1], req_to_token=table,
    )  # fmt: skip
    assert not compiled.cpu_graphs.can_run(prefill)
    assert not compiled.cpu_graphs.can_run(verify)


def test_a_later_process_loads_the_packages_without_the_compiler(compiled, tiny_llama):
    assert_loaded_in_new_process(compiled, f"model_path={tiny_llama!r}, dtype='bfloat16', "
                                 "low_memory=True, max_total_tokens=1024")  # fmt: skip


def test_a_corrupt_package_is_built_again_not_loaded(compiled, tiny_llama, tmp_path, caplog):
    """A package whose bytes differ from its record (a torn copy, a disk fault) is deleted and
    built again; the intact one is loaded as it is."""
    runner = low_memory_runner(tiny_llama)
    graphs = runner.cpu_graphs
    graphs.dir = tmp_path  # NOTE: a copy of the packages whose "decode" one is truncated
    for graph in GRAPHS:
        data = (compiled.cpu_graphs.dir / f"{graph}.pt2").read_bytes()
        (tmp_path / f"{graph}.pt2").write_bytes(data if graph == "1@1" else data[:1000])
        (tmp_path / f"{graph}.json").write_bytes((compiled.cpu_graphs.dir / f"{graph}.json")
                                                 .read_bytes())  # fmt: skip
    built, compile_packages = [], aot_graphs.compile_packages

    def counted(*args):
        built.append(args[2])
        yield from compile_packages(*args)

    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.WARNING):
        mp.setattr(aot_graphs, "compile_packages", counted)
        assert graphs.wait(300)
    assert graphs.status == "ready" and built == [["decode@1"]]
    assert "corrupt package" in caplog.text
    record = json.loads((tmp_path / "decode@1.json").read_text())
    assert file_digest(tmp_path / "decode@1.pt2") == record["sha256"]
    assert_decode_matches_eager(runner, tol=5e-2)


def _failed_runner(tiny_llama: str, caplog) -> ModelRunner:
    runner = low_memory_runner(tiny_llama)
    with caplog.at_level(logging.WARNING):
        assert runner.cpu_graphs.wait(300)
    status = runner.cpu_compile_status
    assert status.startswith("failed: ") and not runner.cpu_graphs.ready, status
    warnings = [r for r in caplog.records if "CPU step graphs unavailable" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    rows = decode_logits(runner, [0, 1], steps=2)  # NOTE: decode batches run eagerly
    assert all(r.shape[0] == 2 and r.isfinite().all() for r in rows)
    return runner


def test_a_build_that_fails_in_its_child_leaves_the_steps_eager(
    compiled, tiny_llama, tmp_path, caplog
):
    """The child's C++ compiler fails (``CXX=false``): the reason is in the status, logged
    once, and every step runs eagerly. (``compiled``: this process loaded the C++ kernels
    before, from the module's cache.)"""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RADIXLM_CACHE", str(tmp_path))
        mp.setenv("CXX", "false")
        runner = _failed_runner(tiny_llama, caplog)
    assert "compile failed" in runner.cpu_compile_status
    assert not list(runner.cpu_graphs.dir.glob("*.pt2"))


def test_a_cache_that_cannot_be_written_leaves_the_steps_eager(compiled, tiny_llama, caplog):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RADIXLM_CACHE", "/proc/radixlm-cache")  # NOTE: read-only, even for root
        _failed_runner(tiny_llama, caplog)


def test_the_compile_loads_the_model_and_pool_this_process_loaded(aot_cache):
    """No model path (the embedded model) and no pool size (sized from RAM, and with it the
    context): the compile gets the resolved ones."""
    runner = ModelRunner(ServerArgs(dtype="bfloat16", low_memory=True, disable_cpu_compile=False))
    args = runner.cpu_graphs.compile_args
    assert args.model_path == runner.model_path and os.path.isfile(args.model_path)
    assert args.context_length == runner.context_len


def test_a_compile_ends_with_the_process_that_started_it(tiny_llama, tmp_path):
    """A scheduler killed during its first start (the compile running) leaves no compile."""
    script = f"""
import time
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor.model_runner import ModelRunner
r = ModelRunner(ServerArgs(model_path={tiny_llama!r}, dtype="bfloat16", low_memory=True,
                           max_total_tokens=1024, disable_cpu_compile=False))
r.cpu_graphs.start()
time.sleep(600)
"""
    env = {**os.environ, "RADIXLM_CACHE": str(tmp_path)}
    parent = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        child = _wait_for(lambda: _compile_pid(str(tmp_path)), 120)
        assert child is not None, "the compile did not start"
    finally:
        parent.kill()
        parent.wait()
    assert _wait_for(lambda: not os.path.exists(f"/proc/{child}") or None, 30), child


def _compile_pid(cache: str) -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "radixlm.runtime.executor.aot_compile" in args and any(cache in a for a in args):
            return int(pid)
    return None


def _wait_for(probe, timeout: float):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.2)
    return None
