"""Compiled CPU decode steps (executor/cpu_graph_runner.py) against the eager steps they replace:
the same logits (float32: to rounding; bfloat16: the same greedy tokens) for one request and for
a batch of three with different lengths, and the same greedy text through an Engine."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime import threads
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor.cpu_graph_runner import GRAPHS, decode_inputs, grid
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.model_runner import ModelRunner
from tests.runtime.test_threads import FixedLoad

pytestmark = pytest.mark.timeout(900)
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


def assert_decode_matches_eager(runner: ModelRunner, tol: float) -> None:
    """Decode steps of 1, 3 and 12 requests through ``runner``'s compiled graphs, then the same
    steps eagerly: the same greedy tokens, logits within ``tol``."""
    graphs = runner.cpu_graphs
    for rows in ([0], [0, 1, 2], list(range(12))):
        compiled = decode_logits(runner, rows, steps=6)
        graphs.ready.clear()  # NOTE: the same steps again, eagerly
        eager = decode_logits(runner, rows, steps=6)
        graphs.ready.update(graphs.compile_s)
        for c, e in zip(compiled, eager):
            assert torch.equal(c.argmax(-1), e.argmax(-1))
            torch.testing.assert_close(c, e, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compiled_decode_matches_eager(tiny_llama, dtype):
    runner = ModelRunner(ServerArgs(
        model_path=tiny_llama, dtype=dtype, max_total_tokens=1024, disable_cpu_compile=False,
    ))  # fmt: skip
    graphs = runner.cpu_graphs
    assert graphs is not None and graphs.wait(600), "compiling took over 10 minutes"
    assert runner.cpu_compile_status == "ready", runner.cpu_compile_status
    tol = 1e-4 if dtype == "float32" else 5e-2
    assert_decode_matches_eager(runner, tol)
    # NOTE: speculative verify steps (several tokens of a request, all with logits) of every
    # size up to 8 tokens; each must find its graph, not compile one
    for extends in ([1, 1], [3, 1], [4, 1], [4, 2], [4, 4]):
        verify = verify_step(runner, extends)
        assert graphs.can_run(verify)
        with torch.inference_mode(), torch._dynamo.config.patch(error_on_recompile=True):
            compiled = graphs._run(graphs.compiled, decode_inputs(verify))
        graphs.ready.clear()
        eager = runner.forward(verify_step(runner, extends))
        graphs.ready.update(graphs.compile_s)
        torch.testing.assert_close(compiled, eager, atol=tol, rtol=tol)


def test_a_verify_step_computes_what_decode_steps_compute(tiny_llama):
    """With the int4 / int8 decode copies (bf16), a request's K tokens in one compiled step
    (speculative verify, alone or beside another request's decode) give bitwise the logits of
    K compiled decode steps, so speculation keeps greedy output token-identical. (Plain GEMMs
    do not: one row and several take different kernels.)"""
    runner = ModelRunner(ServerArgs(
        model_path=tiny_llama, dtype="bfloat16", quantization="int4", max_total_tokens=512,
        disable_cpu_compile=False,
    ))  # fmt: skip
    assert runner.model.lm_head.__class__.__name__ == "Int8DecodeHead"
    assert runner.cpu_graphs.wait(600) and runner.cpu_compile_status == "ready"
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
        assert runner.cpu_graphs.can_run(batch) == (len(ids) <= 8)
        return runner.forward(batch)

    with torch.inference_mode():
        step(prompt, [0], [n])
        step(prompt + prompt, [0, 0], [n, n])  # NOTE: request 1 gets the same prompt
        for k in (2, 4, 7):
            decoded = torch.cat([step([tokens[j]], [n + j], [1]) for j in range(k)])
            assert torch.equal(step(tokens[:k], [n], [k]), decoded), k
            mixed = step(tokens[:k] + [tokens[0]], [n, n], [k, 1])
            assert torch.equal(mixed[:k], decoded) and torch.equal(mixed[k], decoded[0]), k


def test_large_decode_batches_run_compiled(tiny_llama, monkeypatch):
    """A decode batch of more than 8 requests (the bf16 weights through oneDNN, as an opaque
    op in the graph) runs its compiled graph with the eager step's tokens; on the big steps'
    pool (2 threads), the graph compiled for 2 threads; one whose requests share
    ``MIN_SHARED_PREFIX`` KV slots or more, the ``shared`` graph (compiled for 2 threads: it
    reads them once, as the eager cascade attention does)."""
    from radixlm.runtime.executor.attention.torch_backend import MIN_SHARED_PREFIX

    monkeypatch.setattr(threads, "BIG_STEP_TOKENS", 12)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    step_threads = threads.StepThreads(1, 2, load=FixedLoad(0.0))
    runner = ModelRunner(ServerArgs(
        model_path=tiny_llama, dtype="bfloat16", quantization="int4", max_total_tokens=2048,
        disable_cpu_compile=False,
    ), step_threads=step_threads)  # fmt: skip
    graphs = runner.cpu_graphs
    try:
        assert graphs.wait(600) and runner.cpu_compile_status == "ready"
        assert set(graphs.ready) == {*GRAPHS, "wide", "shared"}
        rows, steps, run = list(range(12)), [], graphs.forward

        def record(batch: ForwardBatch, n: int | None = None) -> torch.Tensor:
            steps.append((len(batch.input_ids), n, graphs._graph(batch, n)[0]))
            return run(batch, n)

        graphs.forward = record
        header = [(11 * j) % 200 + 3 for j in range(MIN_SHARED_PREFIX + 6)]
        wide = decode_logits(runner, rows, steps=3)
        shared = decode_logits(runner, rows, steps=3, header=header)
        runner.step_threads = None  # NOTE: the same steps on one thread
        torch.set_num_threads(1)
        compiled = decode_logits(runner, rows, steps=3)
        # NOTE: all ran compiled but the shared steps on one thread (no graph for that count)
        assert steps == [(12, 2, "wide")] * 3 + [(12, 2, "shared")] * 3 + [(12, None, "batch")] * 3
        graphs.ready.clear()
        eager = decode_logits(runner, rows, steps=3)
        eager_shared = decode_logits(runner, rows, steps=3, header=header)
        graphs.ready.update(graphs.compile_s)
        for got, want in zip(wide + compiled + shared, eager * 2 + eager_shared):
            assert torch.equal(got.argmax(-1), want.argmax(-1))
            torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)
        step = ForwardBatch.build(
            input_ids=[5] * 12, prefix_lens=[MIN_SHARED_PREFIX + 2] * 12, extend_lens=[1] * 12,
            req_slots=rows, out_cache_loc=torch.zeros(12, dtype=torch.int64),
            logits_indices=rows, req_to_token=runner.req_pool.table,
        )  # fmt: skip
        # NOTE: the graphs were made on the compile thread with the process on one thread;
        # their guards hold on two (a guard on the count would send the wide steps to eager)
        torch.set_num_threads(2)
        with torch.inference_mode(), torch._dynamo.config.patch(error_on_recompile=True):
            graphs._run(graphs.compiled_wide, decode_inputs(step))
            graphs._run(graphs.compiled, decode_inputs(step))
            graphs._run(graphs.compiled_wide, decode_inputs(step, MIN_SHARED_PREFIX))
    finally:
        torch.set_num_threads(before)

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
    assert graphs._graph(decode(shared + 1), 2)[0] == "wide"
    assert graphs.can_run(decode(shared + 1), 1)


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


def test_engine_greedy_text_is_the_same_compiled(tiny_llama):
    from radixlm import Engine

    prompts = ["The robot", "Once upon a time there was", "1, 2, 3,"]
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    with Engine(tiny_llama, dtype="float32", disable_cpu_compile=True) as engine:
        eager = [o["text"] for o in engine.generate(prompts, params)]
    with Engine(tiny_llama, dtype="float32", disable_cpu_compile=False) as engine:
        assert engine.get_server_info()["stats"]["cpu_compile"] in ("compiling", "ready")
        first = [o["text"] for o in engine.generate(prompts, params)]  # NOTE: maybe still eager
        import time

        deadline = time.monotonic() + 600
        while engine.get_server_info()["stats"]["cpu_compile"] == "compiling":
            assert time.monotonic() < deadline, "compiling took over 10 minutes"
            time.sleep(1)
        assert engine.get_server_info()["stats"]["cpu_compile"] == "ready"
        compiled = [o["text"] for o in engine.generate(prompts, params)]
        single = engine.generate(prompts[0], params)["text"]
    assert first == eager and compiled == eager and single == eager[0]
