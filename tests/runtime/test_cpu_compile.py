"""The compiled CPU decode steps of a default scheduler (executor/aot_graphs.py: every graph)
against the eager steps they replace: the same logits (float32: to rounding; bfloat16: the same
greedy tokens) for one request, batches of 3 and 12, verify steps, the big steps' graphs and a
shared prefix; a verify step bitwise the decode steps it replaces (int4); a later process loads
them without torch's compiler; the same greedy text through an Engine."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
import torch

from radixlm.runtime import threads
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor import aot_graphs
from radixlm.runtime.executor.decode_step import grid
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.quant import int4_available
from tests.runtime.test_threads import FixedLoad

pytestmark = pytest.mark.timeout(900)
needs_aot = pytest.mark.skipif(not aot_graphs.available(), reason="torch lacks AOTInductor")
PROMPTS = [[5, 17, 300, 41, 9], [7, 8, 9], [400, 401, 402, 403, 404, 405, 406, 407, 408]]


@pytest.mark.parametrize(
    "extend_lens, positions", [([1, 1, 1], [3, 0, 5]), ([2, 1, 3], [4, 5, 0, 2, 3, 4])]
)
def test_grid_places_tokens_per_request_under_a_causal_mask(extend_lens, positions):
    """A step's tokens in the ``[requests, tokens per request]`` grid (decode steps, one token
    each, take a path of their own): token ``t`` at its request's row, in order; each entry
    attends to the slots up to its position; unused entries to slot 0 alone."""
    length, per_req = 7, max(extend_lens)
    token_slot, mask = grid(torch.tensor(extend_lens), torch.tensor(positions), length)
    expect_slot, expect_mask = [], torch.zeros(len(extend_lens), per_req, length, dtype=torch.bool)
    expect_mask[..., 0] = True
    t = 0
    for r, n in enumerate(extend_lens):
        for j in range(n):
            expect_slot.append(r * per_req + j)
            expect_mask[r, j] = torch.arange(length) <= positions[t]
            t += 1
    assert token_slot.tolist() == expect_slot
    assert torch.equal(mask, expect_mask)


def decode_logits(
    runner: ModelRunner, rows: list[int], steps: int, header: list[int] | None = None
) -> list[torch.Tensor]:
    """Prefill the prompts of ``rows``, then ``steps`` decode steps of them together (each
    feeding its greedy token); the logits of every step. With ``header``, every request's
    prompt starts with it, held once in the KV pool (a cached few-shot header)."""
    prompts = [PROMPTS[r % len(PROMPTS)] for r in rows]
    table, out, h = runner.req_pool.table, [], len(header or [])
    if header:
        table[: len(prompts), :h] = torch.arange(1, h + 1)
        runner.forward(ForwardBatch.build(
            input_ids=header, prefix_lens=[0], extend_lens=[h], req_slots=[0],
            out_cache_loc=table[0, :h], logits_indices=[h - 1], req_to_token=table,
        ))  # fmt: skip
    base = [1 + h + 64 * i for i in range(len(prompts))]  # NOTE: each request's own KV slots
    for i, p in enumerate(prompts):
        table[i, h : h + len(p) + steps] = torch.arange(base[i], base[i] + len(p) + steps)
        runner.forward(ForwardBatch.build(
            input_ids=p, prefix_lens=[h], extend_lens=[len(p)], req_slots=[i],
            out_cache_loc=table[i, h : h + len(p)], logits_indices=[len(p) - 1],
            req_to_token=table,
        ))  # fmt: skip
    tokens, lens = [p[-1] for p in prompts], [h + len(p) for p in prompts]
    for _ in range(steps):
        batch = ForwardBatch.build(
            input_ids=tokens, prefix_lens=lens, extend_lens=[1] * len(prompts),
            req_slots=list(range(len(prompts))),
            out_cache_loc=torch.stack([table[i, n] for i, n in enumerate(lens)]),
            logits_indices=list(range(len(prompts))), req_to_token=table,
        )  # fmt: skip
        logits = runner.forward(batch)
        out.append(logits)
        tokens = logits.argmax(-1).tolist()
        lens = [n + 1 for n in lens]
    return out


@contextlib.contextmanager
def eagerly(runner: ModelRunner):
    """The runner's steps through its attention backend, as with no graphs at all (neither
    loaded graphs nor the eager decode-step path that stands in for them)."""
    graphs = runner.cpu_graphs
    ready, bridge = set(graphs.ready), graphs._eager
    graphs.ready.clear()
    graphs._eager = None
    try:
        yield
    finally:
        graphs.ready.update(ready)
        graphs._eager = bridge


def assert_decode_matches_eager(runner: ModelRunner, tol: float) -> None:
    """Decode steps of 1, 3 and 12 requests through ``runner``'s compiled graphs, then the same
    steps eagerly: the same greedy tokens, logits within ``tol``."""
    for rows in ([0], [0, 1, 2], list(range(12))):
        compiled = decode_logits(runner, rows, steps=6)
        with eagerly(runner):  # NOTE: the same steps again, eagerly
            eager = decode_logits(runner, rows, steps=6)
        for c, e in zip(compiled, eager):
            assert torch.equal(c.argmax(-1), e.argmax(-1))
            torch.testing.assert_close(c, e, atol=tol, rtol=tol)


@pytest.fixture(scope="module")
def fp32_runner(tiny_llama, aot_cache) -> ModelRunner:
    """A float32 runner (plain GEMMs) whose graphs are built and loaded."""
    runner = ModelRunner(ServerArgs(
        model_path=tiny_llama, dtype="float32", max_total_tokens=1024, disable_cpu_compile=False,
    ))  # fmt: skip
    assert runner.cpu_graphs is not None and runner.cpu_graphs.wait(800), "over 13 minutes"
    assert runner.cpu_compile_status == "ready", runner.cpu_compile_status
    return runner


@pytest.fixture(scope="module")
def int4_runner(tiny_llama, aot_cache) -> ModelRunner:
    """A bf16 runner with the int4 / int8 decode copies and a big steps' count of 2 (so
    every graph: a lone request's and big batches' for 2 threads), its graphs built and
    loaded."""
    if not int4_available():
        pytest.skip("torch lacks the int4 kernel")
    step_threads = threads.StepThreads(1, 2, load=FixedLoad(0.0))
    runner = ModelRunner(ServerArgs(
        model_path=tiny_llama, dtype="bfloat16", quantization="int4", max_total_tokens=2048,
        disable_cpu_compile=False,
    ), step_threads=step_threads)  # fmt: skip
    assert runner.cpu_graphs.wait(800), "building took over 13 minutes"
    assert runner.cpu_compile_status == "ready", runner.cpu_compile_status
    assert runner.cpu_graphs.ready == {"1@2", "1@1", "verify@2", "decode@1", "mixed@1",
                                       "batch@1", "batch@2", "shared@2"}  # fmt: skip
    return runner


@needs_aot
@pytest.mark.parametrize("which", ["fp32_runner", "int4_runner"])
def test_compiled_decode_matches_eager(which, request):
    runner = request.getfixturevalue(which)
    graphs, tol = runner.cpu_graphs, 1e-4 if which == "fp32_runner" else 5e-2
    assert_decode_matches_eager(runner, tol)
    # NOTE: speculative verify steps (several tokens of a request, all with logits) of every
    # size up to 8 tokens; each must find its graph
    for extends in ([1, 1], [3, 1], [4, 1], [4, 2], [4, 4]):
        verify = verify_step(runner, extends)
        assert graphs.can_run(verify), extends
        compiled = runner.forward(verify)
        with eagerly(runner):
            eager = runner.forward(verify_step(runner, extends))
        torch.testing.assert_close(compiled, eager, atol=tol, rtol=tol)


@needs_aot
def test_steps_before_their_graph_loads_run_the_decode_step_eagerly(int4_runner, monkeypatch):
    """Until a graph is loaded its steps run the same formulation eagerly (the model over
    ``DecodeInputs``, the C++ attention kernel): the compiled graph's greedy tokens, logits
    close to the attention backend's."""
    runner, graphs = int4_runner, int4_runner.cpu_graphs
    compiled = decode_logits(runner, [0, 1, 2], steps=4)
    monkeypatch.setattr(graphs, "ready", set())
    packages = []
    monkeypatch.setattr(aot_graphs, "run_package", lambda *a: packages.append(a))
    bridged = decode_logits(runner, [0, 1, 2], steps=4)
    with eagerly(runner):
        eager = decode_logits(runner, [0, 1, 2], steps=4)
    assert not packages  # NOTE: no package ran
    for b, c, e in zip(bridged, compiled, eager):
        assert torch.equal(b.argmax(-1), c.argmax(-1))
        torch.testing.assert_close(b, c, atol=5e-2, rtol=5e-2)
        torch.testing.assert_close(b, e, atol=5e-2, rtol=5e-2)


@needs_aot
def test_a_verify_step_computes_what_decode_steps_compute(int4_runner):
    """With the int4 / int8 decode copies (bf16), a request's K tokens in one compiled step
    (speculative verify, alone or beside another request's decode) give bitwise the logits of
    K compiled decode steps, so speculation keeps greedy output token-identical, whichever
    thread count each graph was compiled for (a lone request's on 2, a mix on 1). (Plain
    GEMMs do not: one row and several take different kernels.)"""
    runner = int4_runner
    assert runner.model.lm_head.__class__.__name__ == "Int8DecodeHead"
    table, prompt, tokens = runner.req_pool.table, PROMPTS[2], [5, 90, 31, 7, 400, 12, 88, 300]
    table[0, :64], table[1, :64] = torch.arange(1, 65), torch.arange(65, 129)
    n = len(prompt)

    def step(ids, prefix_lens, extend_lens) -> torch.Tensor:
        slots = [table[i, p : p + e] for i, (p, e) in enumerate(zip(prefix_lens, extend_lens))]
        batch = ForwardBatch.build(
            input_ids=ids, prefix_lens=prefix_lens, extend_lens=extend_lens,
            req_slots=list(range(len(extend_lens))), out_cache_loc=torch.cat(slots),
            logits_indices=list(range(len(ids))), req_to_token=table,
        )  # fmt: skip
        count = runner.step_threads.for_step(len(ids), len(extend_lens))
        assert runner.cpu_graphs.can_run(batch, count) == (len(ids) <= 8)
        return runner.forward(batch)

    with torch.inference_mode():
        step(prompt, [0], [n])
        step(prompt + prompt, [0, 0], [n, n])  # NOTE: request 1 gets the same prompt
        for k in (2, 4, 7):
            decoded = torch.cat([step([tokens[j]], [n + j], [1]) for j in range(k)])
            assert torch.equal(step(tokens[:k], [n], [k]), decoded), k
            mixed = step(tokens[:k] + [tokens[0]], [n, n], [k, 1])
            assert torch.equal(mixed[:k], decoded) and torch.equal(mixed[k], decoded[0]), k


@needs_aot
def test_large_decode_batches_run_compiled(int4_runner, monkeypatch):
    """A decode batch of more than 8 requests (the bf16 weights through oneDNN, as an opaque
    op in the graph) runs its compiled graph with the eager step's tokens; on the big steps'
    pool (2 threads), the graph compiled for 2 threads; one whose requests share
    ``MIN_SHARED_PREFIX`` KV slots or more, the ``shared`` graph (compiled for 2 threads: it
    reads them once, as the eager cascade attention does)."""
    from radixlm.runtime.executor.attention.torch_backend import MIN_SHARED_PREFIX

    runner, graphs = int4_runner, int4_runner.cpu_graphs
    monkeypatch.setattr(threads, "BIG_STEP_TOKENS", 12)
    step_threads, before = runner.step_threads, torch.get_num_threads()
    rows, steps, run = list(range(12)), [], graphs.forward

    def record(batch: ForwardBatch, n: int | None = None) -> torch.Tensor:
        steps.append((len(batch.input_ids), n, graphs.graph_of(batch, n)[0]))
        return run(batch, n)

    monkeypatch.setattr(graphs, "forward", record)
    header = [(11 * j) % 200 + 3 for j in range(MIN_SHARED_PREFIX + 6)]
    try:
        wide = decode_logits(runner, rows, steps=3)
        shared = decode_logits(runner, rows, steps=3, header=header)
        runner.step_threads = None  # NOTE: the same steps on one thread
        torch.set_num_threads(1)
        compiled = decode_logits(runner, rows, steps=3)
        shared_small = decode_logits(runner, rows, steps=3, header=header)
        # NOTE: all ran compiled but the shared steps on one thread (no graph for that count)
        assert steps == ([(12, 2, "batch@2")] * 3 + [(12, 2, "shared@2")] * 3
                         + [(12, None, "batch@1")] * 3)  # fmt: skip
        with eagerly(runner):
            eager = decode_logits(runner, rows, steps=3)
            eager_shared = decode_logits(runner, rows, steps=3, header=header)
    finally:
        runner.step_threads = step_threads
        torch.set_num_threads(before)
    for got, want in zip(wide + compiled + shared + shared_small,
                         eager * 2 + eager_shared * 2):  # fmt: skip
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)

    table, shared = runner.req_pool.table, MIN_SHARED_PREFIX
    table[:12, :shared] = torch.arange(1, shared + 1)
    for i in rows:
        table[i, shared : shared + 2] = torch.arange(shared + 1 + 2 * i, shared + 3 + 2 * i)

    def decode(prefix: int) -> ForwardBatch:
        return ForwardBatch.build(
            input_ids=[5] * 12, prefix_lens=[prefix] * 12, extend_lens=[1] * 12, req_slots=rows,
            out_cache_loc=table[:12, prefix], logits_indices=rows, req_to_token=table,
        )  # fmt: skip

    assert graphs.can_run(decode(shared + 1), 2) and not graphs.can_run(decode(shared + 1), 1)
    table[0, shared - 1] = 2000  # NOTE: now they share one slot less: the plain batch graphs
    assert graphs.graph_of(decode(shared + 1), 2)[0] == "batch@2"
    assert graphs.can_run(decode(shared + 1), 1)


def assert_loaded_in_new_process(runner: ModelRunner, server_args: str) -> None:
    """A new process with ``ServerArgs(server_args)`` (and one torch thread, as here: the graphs'
    thread count is part of their key) finds ``runner``'s graphs on disk and loads them, with
    no build and no import of torch's compiler (dynamo, inductor)."""
    directory = runner.cpu_graphs.dir
    log_time = (directory / "compile.log").stat().st_mtime_ns
    script = f"""
import sys, torch
torch.set_num_threads(1)
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor.model_runner import ModelRunner
r = ModelRunner(ServerArgs({server_args}, disable_cpu_compile=False))
assert r.cpu_graphs.on_disk() and r.cpu_graphs.wait(120), "loading took over 2 minutes"
print(r.cpu_compile_status, str(r.cpu_graphs.dir),
      any(m.startswith(("torch._dynamo", "torch._inductor")) for m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()  # fmt: skip
    assert out == ["ready", str(directory), "False"], out
    assert (directory / "compile.log").stat().st_mtime_ns == log_time  # NOTE: no build


@needs_aot
def test_a_later_process_loads_them_without_the_compiler(fp32_runner, tiny_llama):
    assert_loaded_in_new_process(
        fp32_runner, f"model_path={tiny_llama!r}, dtype='float32', max_total_tokens=1024"
    )


def verify_step(runner: ModelRunner, extends: list[int]) -> ForwardBatch:
    """After the prompts 0 and 1 (prefilled by decode_logits), ``extends[i]`` new tokens of
    request i, every one needing logits."""
    table, lens = runner.req_pool.table, [len(PROMPTS[0]), len(PROMPTS[1])]
    ids = [t for i, e in enumerate(extends) for t in PROMPTS[2][i : i + e]]
    slots = [table[i, n : n + e] for i, (n, e) in enumerate(zip(lens, extends))]
    return ForwardBatch.build(
        input_ids=ids, prefix_lens=lens, extend_lens=extends, req_slots=[0, 1],
        out_cache_loc=torch.cat(slots),
        logits_indices=list(range(len(ids))), req_to_token=table,
    )  # fmt: skip


@needs_aot
def test_engine_greedy_text_is_the_same_compiled(tiny_llama, aot_cache):
    import time

    from radixlm import Engine

    prompts = ["The robot", "Once upon a time there was", "1, 2, 3,"]
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    kw = {"dtype": "float32", "max_total_tokens": 1024}
    with Engine(tiny_llama, disable_cpu_compile=True, **kw) as engine:
        eager = [o["text"] for o in engine.generate(prompts, params)]
    with Engine(tiny_llama, disable_cpu_compile=False, **kw) as engine:
        assert engine.get_server_info()["stats"]["cpu_compile"] in ("compiling", "ready")
        first = [o["text"] for o in engine.generate(prompts, params)]  # NOTE: maybe still eager
        deadline = time.monotonic() + 600
        while engine.get_server_info()["stats"]["cpu_compile"] == "compiling":
            assert time.monotonic() < deadline, "compiling took over 10 minutes"
            time.sleep(1)
        info = engine.get_server_info()["stats"]
        assert info["cpu_compile"] == "ready" and info["cpu_graphs"]["building"] == []
        assert any(name.startswith("1@") for name in info["cpu_graphs"]["loaded"])
        compiled = [o["text"] for o in engine.generate(prompts, params)]
        single = engine.generate(prompts[0], params)["text"]
    assert first == eager and compiled == eager and single == eager[0]
    with Engine(tiny_llama, disable_cpu_compile=False, **kw) as engine:
        # NOTE: a restart loads the graphs from disk before it reports ready
        assert engine.get_server_info()["stats"]["cpu_compile"] == "ready"
        assert [o["text"] for o in engine.generate(prompts, params)] == eager
