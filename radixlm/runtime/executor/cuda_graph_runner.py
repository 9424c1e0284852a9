"""Decode steps replayed from CUDA graphs, one captured forward per bucket of batch sizes.

At small batch sizes a decode step is bound by launching a few hundred small kernels, not by
the GPU. The runner captures the model's decode forward once per bucket into a CUDA graph over
static input buffers. A step copies its inputs into the buffers, pads the batch up to its bucket,
replays the graph and reads the logits of its real rows.

Padding rows read one KV slot of request row 0 and write their K/V into slot 0, the pool's
scratch slot (:class:`~radixlm.runtime.mem_cache.memory_pool.SlotAllocator` never hands it out),
so a padded replay touches no request's cache.
"""

from __future__ import annotations

import bisect

import torch

from radixlm.runtime.executor.attention.base import AttentionBackend
from radixlm.runtime.executor.forward_batch import ForwardBatch

SCRATCH_SLOT = 0


def graph_batch_sizes(max_bs: int) -> list[int]:
    """Buckets 1, 2, 4, 8, then every multiple of 8, up to and including ``max_bs``."""
    sizes = {1, 2, 4, 8, *range(16, max_bs + 1, 8), max_bs}
    return sorted(s for s in sizes if s <= max_bs)


class CudaGraphRunner:
    """Runs decode batches of up to ``max_bs`` requests from captured graphs.

    ``use_graphs=False`` runs the same padded static-buffer forward without capturing it: the
    path the CPU tests check (buffers, padding, per-bucket attention metadata), since capture
    itself needs CUDA.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        req_to_token: torch.Tensor,
        max_bs: int,
        max_seq_len: int,
        use_graphs: bool = True,
    ) -> None:
        self.model, self.backend = model, backend
        self.batch_sizes = graph_batch_sizes(max_bs)
        self.max_bs = self.batch_sizes[-1]
        self.use_graphs = use_graphs
        device = req_to_token.device

        def zeros() -> torch.Tensor:
            return torch.zeros(self.max_bs, dtype=torch.int64, device=device)

        self.input_ids, self.positions, self.out_cache_loc, self.req_slots = (
            zeros(), zeros(), zeros(), zeros(),
        )  # fmt: skip
        self.seq_lens = torch.ones_like(self.input_ids)
        self.extend_lens = torch.ones_like(self.input_ids)
        self.rows = torch.arange(self.max_bs, device=device)
        self.logits: torch.Tensor | None = None  # [max_bs, vocab], sized by the first forward
        self.batches = {
            bs: self._static_batch(bs, req_to_token, max_seq_len) for bs in self.batch_sizes
        }
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if use_graphs:
            self._capture_all()

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.is_decode and 0 < batch.batch_size <= self.max_bs

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits ``[len(batch.logits_indices), vocab]`` of one decode batch."""
        bs = batch.batch_size
        bucket = self.batch_sizes[bisect.bisect_left(self.batch_sizes, bs)]
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_cache_loc[:bs].copy_(batch.out_cache_loc)
        self.req_slots[:bs].copy_(batch.req_slots)
        self.seq_lens[:bs].copy_(batch.seq_lens)
        if bucket > bs:
            # NOTE: rows past bs still hold an earlier, larger batch; their KV writes must go to
            # the scratch slot, and their reads are kept to one slot of request row 0.
            self.out_cache_loc[bs:bucket].fill_(SCRATCH_SLOT)
            self.seq_lens[bs:bucket].fill_(1)
            self.req_slots[bs:bucket].zero_()
            self.positions[bs:bucket].zero_()
        if self.use_graphs:
            self.graphs[bucket].replay()
        else:
            self._run(self.batches[bucket])
        return self.logits[batch.logits_indices]

    def _static_batch(self, bs: int, req_to_token: torch.Tensor, max_seq_len: int) -> ForwardBatch:
        # NOTE: the host-side lists stay empty: what varies per step lives only in the buffers,
        # and the attention metadata is fixed per bucket (valid for any length up to max).
        return ForwardBatch(
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            req_slots=self.req_slots[:bs],
            prefix_lens=self.positions[:bs],  # a decode token's position is its prefix length
            extend_lens=self.extend_lens[:bs],
            seq_lens=self.seq_lens[:bs],
            logits_indices=self.rows[:bs],
            req_to_token=req_to_token,
            extend_lens_list=[1] * bs,
            attn_meta=self.backend.graph_meta(bs, max_seq_len),
        )

    def _run(self, batch: ForwardBatch) -> None:
        logits = self.model(batch, self.backend)
        if self.logits is None:
            self.logits = torch.empty(
                self.max_bs, logits.shape[-1], dtype=logits.dtype, device=logits.device
            )
        self.logits[: logits.shape[0]].copy_(logits)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        stream = torch.cuda.Stream(device=self.input_ids.device)
        # NOTE: a pool stream does not wait for the default one, where the buffers' zero-fills
        # (and the KV pool's) may still be queued.
        stream.wait_stream(torch.cuda.current_stream())
        pool = None
        # NOTE: largest first, so the smaller graphs fit in the memory pool the largest made.
        for bs in reversed(self.batch_sizes):
            batch = self.batches[bs]
            with torch.cuda.stream(stream):  # warm-up: Triton compiles outside the capture
                for _ in range(2):
                    self._run(batch)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self._run(batch)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize()
