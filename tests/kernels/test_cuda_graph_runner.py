"""Decode through the CUDA-graph runner gives the eager forward's logits and touches no other KV.

On CPU the runner's static-buffer path runs without capture (capture needs CUDA) and the Triton
kernels run in the interpreter; on CUDA the same checks run on captured graphs. The model is a
random-weight tiny Llama built from a bare config.json (no tokenizer, no conftest fixture), so the
GPU script can run this file with ``--noconftest`` on a machine without the embedded model.
"""

from __future__ import annotations

import json
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: must precede the first triton import

import pytest

from radixlm.kernels.interpret import interpreter_active, run_in_fresh_interpreter
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner, graph_batch_sizes
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.mem_cache.memory_pool import SlotAllocator

ON_CUDA = torch.cuda.is_available()
IN_PROCESS = ON_CUDA or interpreter_active()
in_process = pytest.mark.skipif(not IN_PROCESS, reason="triton was imported without interpreter")
PROMPT_LENS = [3, 9, 1, 14, 6, 11]
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
}  # fmt: skip


@pytest.fixture(scope="module")
def dummy_llama(tmp_path_factory) -> dict:
    """ServerArgs options for a random-weight tiny Llama with no tokenizer."""
    path = tmp_path_factory.mktemp("dummy-llama")
    (path / "config.json").write_text(json.dumps(TINY_LLAMA))
    return dict(model_path=str(path), load_format="dummy", skip_tokenizer_init=True)


def test_graph_batch_sizes():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = graph_batch_sizes(256)
    assert sizes[:6] == [1, 2, 4, 8, 16, 24] and sizes[-1] == 256 and len(sizes) == 35


def test_cuda_graph_max_bs_is_validated():
    with pytest.raises(ValueError, match="cuda_graph_max_bs"):
        ServerArgs(cuda_graph_max_bs=0)


class Requests:
    """Prompts prefilled through the eager path; each decode step feeds back greedy tokens."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.alloc = SlotAllocator(runner.max_total_tokens)
        self.rows = [runner.req_pool.alloc() for _ in PROMPT_LENS]
        self.lens = list(PROMPT_LENS)
        ids = [list(range(100 + 7 * i, 100 + 7 * i + n)) for i, n in enumerate(PROMPT_LENS)]
        slots = self.alloc.alloc(sum(PROMPT_LENS))
        start = 0
        for row, n in zip(self.rows, PROMPT_LENS):
            runner.req_pool.table[row, :n] = slots[start : start + n]
            start += n
        ends = torch.tensor(PROMPT_LENS).cumsum(0) - 1
        batch = ForwardBatch.build(
            input_ids=sum(ids, []), prefix_lens=[0] * len(ids), extend_lens=PROMPT_LENS,
            req_slots=self.rows, out_cache_loc=slots, logits_indices=ends.tolist(),
            req_to_token=runner.req_pool.table,
        )  # fmt: skip
        self.next_ids = runner.forward(batch).argmax(-1).tolist()

    def decode_batch(self, which: list[int], logits_rows: list[int]) -> ForwardBatch:
        slots = self.alloc.alloc(len(which))
        for i, slot in zip(which, slots.tolist()):
            self.runner.req_pool.table[self.rows[i], self.lens[i]] = slot
        batch = ForwardBatch.build(
            input_ids=[self.next_ids[i] for i in which], prefix_lens=[self.lens[i] for i in which],
            extend_lens=[1] * len(which), req_slots=[self.rows[i] for i in which],
            out_cache_loc=slots, logits_indices=logits_rows,
            req_to_token=self.runner.req_pool.table,
        )  # fmt: skip
        for i in which:
            self.lens[i] += 1
        return batch


@in_process
def test_graph_runner_matches_eager_decode(dummy_llama):
    device = "cuda" if ON_CUDA else "cpu"
    args = ServerArgs(
        **dummy_llama, dtype="float32", device=device, max_total_tokens=512,
        max_running_requests=8, attention_backend="triton", disable_cuda_graph=True,
    )  # fmt: skip
    runner = ModelRunner(args)
    graphs = CudaGraphRunner(
        runner.model, runner.backend, runner.req_pool.table, max_bs=8,
        max_seq_len=runner.context_len, use_graphs=ON_CUDA,
    )  # fmt: skip
    reqs = Requests(runner)
    # NOTE: 6 rows (bucket 8) then 3 (bucket 4): rows 3..5 of the buffers still hold the first
    # batch's KV slots when the second runs, and must not be written again.
    steps = [([0, 1, 2, 3, 4, 5], None), ([5, 0, 3], None), ([2], None), ([1, 4, 0, 2], [0, 2])]
    with torch.inference_mode():
        for which, rows in steps:
            batch = reqs.decode_batch(which, rows or list(range(len(which))))
            assert graphs.can_run(batch)
            k_before = [k.clone() for k in runner.kv_pool.k]
            got = graphs.forward(batch).clone()
            written = set(batch.out_cache_loc.tolist()) | {0}
            others = torch.tensor([s for s in range(k_before[0].shape[0]) if s not in written])
            for layer, k in enumerate(runner.kv_pool.k):
                assert torch.equal(k[others], k_before[layer][others]), f"layer {layer}"
            runner.backend.prepare(batch)
            want = runner.model(batch, runner.backend)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            for i, token in zip(which, want.argmax(-1).tolist()):
                reqs.next_ids[i] = token
    prefill = ForwardBatch.build(
        input_ids=[1, 2, 3], prefix_lens=[0, 4], extend_lens=[2, 1], req_slots=[6, 7],
        out_cache_loc=torch.zeros(3, dtype=torch.int64), logits_indices=[1, 2],
        req_to_token=runner.req_pool.table,
    )  # fmt: skip
    assert not graphs.can_run(prefill)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_CUDA, reason="CUDA graphs need CUDA")
def test_model_runner_captures_graphs_on_cuda(dummy_llama):
    base = dict(**dummy_llama, max_total_tokens=512, max_running_requests=16)
    runner = ModelRunner(ServerArgs(**base))
    assert runner.attention_backend_name == "triton"
    assert runner.graph_runner is not None and sorted(runner.graph_runner.graphs) == [
        1, 2, 4, 8, 16
    ]
    assert ModelRunner(ServerArgs(**base, disable_cuda_graph=True)).graph_runner is None


def test_model_runner_has_no_graphs_on_cpu(dummy_llama):
    if ON_CUDA:
        pytest.skip("CPU behaviour")
    runner = ModelRunner(ServerArgs(**dummy_llama, max_total_tokens=256))
    assert runner.graph_runner is None


@pytest.mark.skipif(IN_PROCESS, reason="kernels ran in this process")
def test_graph_runner_in_fresh_interpreter():
    proc = run_in_fresh_interpreter(__file__)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
