"""Compiled decode steps on CPU: the counterpart of CUDA graphs.

A decode step of a small model on CPU is a few hundred small ops (norms, rotary, the KV write
and gather, softmax, residual adds) around the weight matmuls, and dispatching them costs about
as much as the matmuls (SmolLM2-135M: ~11 of ~22 ms a token). ``torch.compile`` (inductor's C++
backend) fuses them: the model's own ``forward`` is traced with :class:`DecodeAttention` in place
of the attention backend, over :class:`DecodeInputs` in place of a ``ForwardBatch``.

A graph's rows are tokens, each with its own request's KV slots and a causal key mask, so the
same graphs run decode steps and speculative verify steps (several tokens of a request, each
needing logits). Three graphs, by token count: one token (single-stream decode, the common
case), 2..4 and 5..8 (the int8 head takes at most 4 rows), each over any context length (a
dynamic dimension). Larger steps are compute-bound and stay eager, as do prefill chunks (they
need logits for their last token only).

The graphs compile on a background thread started once the scheduler reported ready (``start``),
so start-up does not share the CPU with it; steps run eagerly until their graph is ready, so no
request waits for a compile. Inductor keeps
its kernels on disk (``TORCHINDUCTOR_CACHE_DIR``), so a restart compiles in a fraction of the
first time. ``--disable-cpu-compile`` (or ``RADIXLM_DISABLE_CPU_COMPILE=1``) turns it off.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import torch

from radixlm.runtime.executor.attention.torch_backend import _gather, grouped_attention
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.mem_cache.memory_pool import KVPool
from radixlm.runtime.models.quant import MAX_INT4_ROWS
from radixlm.runtime.models.quant_head import MAX_INT8_HEAD_ROWS

logger = logging.getLogger(__name__)

MAX_ROWS = MAX_INT4_ROWS  # NOTE: beyond the int4 rows a step is compute-bound: eager is as fast
BUCKETS = ((1, 1), (2, MAX_INT8_HEAD_ROWS), (MAX_INT8_HEAD_ROWS + 1, MAX_ROWS))  # token counts
WARMUP_LEN = 16  # context length of the compile-time example (the dimension is dynamic)


@dataclass
class DecodeInputs:
    """What the model's forward reads of a step whose every token needs logits, as tensors
    only; row ``t`` is the step's token ``t``."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    logits_indices: torch.Tensor  # [T] = arange(T)
    out_cache_loc: torch.Tensor  # [T] the KV slot each new token writes
    kv_index: torch.Tensor  # [T, L] the KV slots of each token's request
    key_mask: torch.Tensor  # [T, L] True for the slots a token attends to (causal)


class DecodeAttention:
    """The torch backend's decode attention, one query row per token (write the new K/V,
    gather each token's request's KV, grouped attention under its causal mask, float32 for a
    single row), without the backend's Python-side planning, so that a step traces into one
    graph."""

    def __init__(self, kv_pool: KVPool, scale: float) -> None:
        self.kv_pool, self.scale = kv_pool, scale

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: DecodeInputs
    ) -> torch.Tensor:
        self.kv_pool.write(layer, batch.out_cache_loc, k, v)
        k_buf, v_buf = self.kv_pool.k[layer], self.kv_pool.v[layer]
        rows = q.shape[0]
        dtype = torch.float32 if rows == 1 else k_buf.dtype  # NOTE: as the eager backend does
        keys, values = _gather(k_buf, batch.kv_index, dtype), _gather(v_buf, batch.kv_index, dtype)
        q4 = q.view(rows, 1, *q.shape[1:]).to(dtype)
        out, _ = grouped_attention(q4, keys, values, batch.key_mask[:, None, :], self.scale)
        return out.to(q.dtype).reshape(rows, *q.shape[1:])


class CpuGraphRunner:
    """The compiled decode graphs of one model (see module); ``forward`` for batches that
    ``can_run``."""

    def __init__(self, model: torch.nn.Module, attention: DecodeAttention) -> None:
        self.model, self.attention = model, attention
        self.compiled = self._lookup = None  # NOTE: made on the thread: dynamo imports slowly
        self.ready: set[str] = set()
        self.compile_s: dict[str, float] = {}
        self.error: str | None = None
        self._thread = threading.Thread(target=self._compile_all, name="cpu-compile", daemon=True)

    def start(self) -> None:
        """Start compiling in the background (once); steps run eagerly until then."""
        if self._thread.ident is None:
            self._thread.start()

    @property
    def status(self) -> str:
        if self.error is not None:
            return f"failed: {self.error}"
        return "ready" if len(self.ready) == len(BUCKETS) else "compiling"

    def can_run(self, batch: ForwardBatch) -> bool:
        """A step of at most ``MAX_ROWS`` tokens that all need logits (decode, verify), whose
        graph is compiled."""
        tokens = batch.input_ids.shape[0]
        if _bucket(tokens) not in self.ready or batch.logits_indices.shape[0] != tokens:
            return False
        return bool(torch.equal(batch.logits_indices, torch.arange(tokens)))

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits ``[T, vocab]`` of the step, from its compiled graph. The call only looks
        graphs up (``torch._dynamo.run``): a step that no graph fits (a guard the start-up
        compile did not foresee) runs the same code eagerly instead of compiling in the
        serving path, and this thread never changes dynamo's global settings while the compile
        thread works."""
        return self._run(self._lookup, self.inputs(batch))

    def inputs(self, batch: ForwardBatch) -> DecodeInputs:
        """The graphs' inputs for ``batch``: one row per token."""
        length = max(batch.seq_lens_list)
        owner = torch.repeat_interleave(batch.req_slots, batch.extend_lens)
        kv_index = batch.req_to_token[owner, :length]
        key_mask = torch.arange(length)[None, :] <= batch.positions[:, None]
        # NOTE: copies made here, in inference mode as the compile's were: a tensor made outside
        # it fails the graphs' guards (the step would run eagerly)
        return DecodeInputs(
            batch.input_ids.clone(), batch.positions.clone(), batch.logits_indices.clone(),
            batch.out_cache_loc.clone(), kv_index, key_mask,
        )  # fmt: skip

    def wait(self, timeout: float | None = None) -> bool:
        """Start compiling if needed and block until every graph compiled (or failed); False
        on timeout."""
        self.start()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self, fn, inputs: DecodeInputs) -> torch.Tensor:
        for t in (inputs.kv_index, inputs.key_mask):
            torch._dynamo.maybe_mark_dynamic(t, 1)
        if inputs.input_ids.shape[0] > 1:
            for t in (inputs.input_ids, inputs.positions, inputs.logits_indices,
                      inputs.out_cache_loc, inputs.kv_index, inputs.key_mask):  # fmt: skip
                torch._dynamo.maybe_mark_dynamic(t, 0)
        return fn(inputs, self.attention)

    @torch.inference_mode()
    def _compile_all(self) -> None:
        import torch._inductor.config as inductor

        inductor.compile_threads = 1  # NOTE: no pool of compile processes beside the scheduler
        inductor.emulate_precision_casts = True  # NOTE: bf16 rounding where eager rounds
        self.compiled = torch.compile(self.model.forward, dynamic=None)
        self._lookup = torch._dynamo.run(self.model.forward)  # NOTE: the graphs, never a compile
        for rows, _ in BUCKETS:
            start = time.perf_counter()
            try:
                self._run(self.compiled, _scratch_inputs(rows))
            except Exception as e:  # noqa: BLE001  (eager steps go on; the reason is reported)
                self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                logger.warning("CPU decode compile failed, decode stays eager: %s", self.error)
                return
            bucket = _bucket(rows)
            self.compile_s[bucket] = round(time.perf_counter() - start, 1)
            self.ready.add(bucket)
            logger.info("compiled CPU steps of %s token(s) in %.1f s",
                        bucket, self.compile_s[bucket])  # fmt: skip


def _bucket(tokens: int) -> str | None:
    for low, high in BUCKETS:
        if low <= tokens <= high:
            return str(low) if low == high else f"{low}-{high}"
    return None


def _scratch_inputs(rows: int) -> DecodeInputs:
    """A step that writes and reads only slot 0, the pool's scratch slot."""
    zeros = torch.zeros(rows, dtype=torch.int64)
    return DecodeInputs(
        input_ids=zeros, positions=zeros.clone(), logits_indices=torch.arange(rows),
        out_cache_loc=zeros.clone(), kv_index=torch.zeros(rows, WARMUP_LEN, dtype=torch.int64),
        key_mask=torch.ones(rows, WARMUP_LEN, dtype=torch.bool),
    )  # fmt: skip
