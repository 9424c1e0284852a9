"""Compiled decode steps on CPU: the counterpart of CUDA graphs.

A decode step of a small model on CPU is a few hundred small ops (norms, rotary, the KV write
and gather, softmax, residual adds) around the weight matmuls, and dispatching them costs about
as much as the matmuls (SmolLM2-135M: ~11 of ~22 ms a token). ``torch.compile`` (inductor's C++
backend) fuses them: the model's own ``forward`` is traced with :class:`DecodeAttention` in place
of the attention backend, over :class:`DecodeInputs` in place of a ``ForwardBatch``. The
attention itself is a C++ kernel (``kernels/cpu_ops.py``), built for this CPU when the
graphs are made.

A graph's rows are tokens, laid out per request (``[requests, tokens per request]``, padded)
over each request's KV slots once, with a causal key mask, so the same graphs run decode steps
and speculative verify steps (several tokens of a request, each needing logits); gathering the
KV once per request, not once per token, keeps a verify step's attention near a decode
step's. A dynamic size is specialised where it is 1, so there are four graphs of at most 8
tokens (the int4 and int8 copies' limit), each over any context length: one token
(single-stream decode, the common case); one request's token and draft (``[1, E]``); a
decode batch (``[R, 1]``); and a mix (``[R, E]``); and a fifth for decode batches of more
than 8 requests, whose projections take the bf16 weights (SmolLM2, 32 requests at 80 tokens
of context: 96 ms a step against 135 eager). That one reads every request's KV in full, so
a batch whose requests share ``MIN_SHARED_PREFIX`` slots or more (a few-shot header, a system
prompt) takes a graph of its own, ``shared``: each request's own slots as ``batch`` does, the
shared ones once for all of the step's queries through a flash kernel (the C++ one where it
serves, else torch's), merged by log-sum-exp as the eager backend's cascade attention does
(bench_prefix, 128 questions on a 790-token header: 250-270 ms a step against ~300 eager).
Other steps stay eager, as do prefill chunks (they need logits for their last token only).

Graphs are compiled for a thread count (inductor splits its loops for it). Where the
scheduler runs big steps on more threads (``StepThreads``), ``wide`` is the ``batch`` graph
compiled for that count (SmolLM2, 32 requests: 45-64 ms a step against 62-99 eager on 2
threads), and ``shared`` is compiled for that count only (its batches are big steps; one of
fewer requests, on the small count, runs eagerly).

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

from radixlm.kernels import cpu_ops
from radixlm.runtime.executor.attention.torch_backend import (
    MIN_SHARED_PREFIX,
    flash_attention,
    merge_attention,
    shared_prefix_len,
)
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.mem_cache.memory_pool import KVPool
from radixlm.runtime.models.quant import MAX_INT4_ROWS
from radixlm.runtime.models.quant_head import MAX_INT8_HEAD_ROWS

logger = logging.getLogger(__name__)

# The int4 and int8 copies' rows: the small graphs' limit (larger steps take the bf16 weights)
MAX_ROWS = min(MAX_INT4_ROWS, MAX_INT8_HEAD_ROWS)
# The graphs, in the order they compile: name -> the tokens per request of the example step
GRAPHS = {"1": [1], "verify": [3], "decode": [1, 1, 1], "mixed": [4, 1], "batch": [1] * 16}
WARMUP_LEN = 16  # context length of the compile-time example (the dimension is dynamic)


@dataclass
class DecodeInputs:
    """What the model's forward reads of a step whose every token needs logits, as tensors
    only; token ``t`` is the step's token ``t``, at ``token_slot[t]`` of the step's
    ``[R requests, E tokens each]`` grid (a request with fewer than ``E`` tokens leaves slots
    unused)."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    logits_indices: torch.Tensor  # [T] = arange(T)
    out_cache_loc: torch.Tensor  # [T] the KV slot each new token writes
    token_slot: torch.Tensor  # [T] each token's place in the flattened [R, E] grid
    kv_index: torch.Tensor  # [R, L] each request's KV slots (after the shared ones)
    key_mask: torch.Tensor  # [R, E, L] True for the slots a grid entry attends to (causal)
    shared_index: torch.Tensor | None = None  # [P] slots every request starts with (cascade)

    def flat(self) -> tuple[torch.Tensor, ...]:
        """The fields of a step without a shared part, in order (an AOT package's inputs)."""
        return (self.input_ids, self.positions, self.logits_indices, self.out_cache_loc,
                self.token_slot, self.kv_index, self.key_mask)  # fmt: skip


class DecodeAttention:
    """Attention for a step of few tokens: write the new K/V, then each token attends to its
    request's slots under the grid's causal mask, through the C++ kernel where it loaded
    (``kernel``: ``kernels/cpu_ops.py``) or else written so that inductor fuses it:
    scores and outputs as elementwise products summed in float32, reading each request's KV
    through its index inside the reductions (no gathered copy). Every query row is computed
    the same way whatever the step's shape, so a verify step's rows equal the decode steps'
    (module docstring)."""

    def __init__(self, kv_pool: KVPool, scale: float, kernel: bool = False) -> None:
        self.kv_pool, self.scale, self.kernel = kv_pool, scale, kernel
        self.flash = False  # NOTE: the shared part through the C++ flash kernel (``_make``)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: DecodeInputs
    ) -> torch.Tensor:
        self.kv_pool.write(layer, batch.out_cache_loc, k, v)
        k_buf, v_buf = self.kv_pool.k[layer], self.kv_pool.v[layer]
        if self.kernel:
            own, own_lse = cpu_ops.decode_attention(
                q, k_buf, v_buf, batch.kv_index, batch.token_slot, batch.key_mask, self.scale
            )
        else:
            own, own_lse = self._fused(q, k_buf, v_buf, batch)
        if batch.shared_index is None:
            return own.to(q.dtype)
        # NOTE: cascade (decode batches only, one token per request): each request's own slots
        # as above, the shared ones once for all queries through a flash kernel, merged
        # by log-sum-exp as the eager backend does
        shared = batch.shared_index
        if self.flash:
            common, common_lse = cpu_ops.flash_attention(q, k_buf, v_buf, shared, scale=self.scale)
        else:
            common, common_lse = flash_attention(
                q[None], k_buf[shared][None], v_buf[shared][None], self.scale
            )
            common, common_lse = common[0], common_lse[0]
        return merge_attention(own, own_lse, common, common_lse).to(q.dtype)

    def _fused(
        self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, batch: DecodeInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The torch formulation: float32 outputs ``[T, H, D]`` and, for a cascade, their
        log-sum-exp."""
        reqs, per_req, _ = batch.key_mask.shape
        heads, dim = q.shape[1:]
        kv_heads = k_buf.shape[1]
        grid = q.new_zeros(reqs * per_req, heads, dim).index_copy_(0, batch.token_slot, q)
        q6 = grid.float().view(reqs, per_req, 1, kv_heads, heads // kv_heads, dim)
        keys = k_buf[batch.kv_index].float()[:, None, :, :, None, :]  # [R, 1, L, Hkv, 1, D]
        scores = (q6 * keys).sum(-1) * self.scale  # [R, E, L, Hkv, G]
        scores = scores.masked_fill(~batch.key_mask[..., None, None], float("-inf"))
        values = v_buf[batch.kv_index].float()[:, None, :, :, None, :]
        if batch.shared_index is None:
            out = (scores.softmax(dim=2)[..., None] * values).sum(2)  # [R, E, Hkv, G, D]
            return out.reshape(reqs * per_req, heads, dim)[batch.token_slot], None
        # NOTE: the cascade's grid is the tokens' order (one token per request)
        top = scores.amax(dim=2, keepdim=True)
        probs = (scores - top).exp()
        total = probs.sum(dim=2, keepdim=True)
        own = (probs[..., None] * values).sum(2) / total.squeeze(2)[..., None]
        return own.view(-1, heads, dim), (total.log() + top).view(-1, heads)


class BackgroundGraphs:
    """Graphs made on a background thread (``_make``) while steps run eagerly; ``ready`` holds
    the names of those made, ``status`` says ``compiling``, ``ready`` or why it failed."""

    graphs: tuple[str, ...] | dict[str, list[int]]

    def __init__(self, thread_name: str) -> None:
        self.ready: set[str] = set()
        self.compile_s: dict[str, float] = {}
        self.error: str | None = None
        self._thread = threading.Thread(target=self._make, name=thread_name, daemon=True)

    def start(self) -> None:
        """Start making the graphs in the background (once); steps run eagerly until then."""
        if self._thread.ident is None:
            self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Start if needed and block until every graph is made (or failed); False on timeout."""
        self.start()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def status(self) -> str:
        if self.error is not None:
            return f"failed: {self.error}"
        return "ready" if len(self.ready) == len(self.graphs) else "compiling"

    def _make(self) -> None:
        raise NotImplementedError

    def _failed(self, e: Exception, what: str) -> None:
        """Record why (eager steps go on)."""
        self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        logger.warning("%s, steps stay eager: %s", what, self.error)


def long_shared_prefix(batch: ForwardBatch) -> int:
    """How many KV slots a batch's requests all start with, where that is
    ``MIN_SHARED_PREFIX`` or more (else 0): a prefix to read once for all of them (cascade)."""
    kv_index = batch.req_to_token[batch.req_slots, : min(batch.seq_lens_list)]
    shared = shared_prefix_len(kv_index)
    return shared if shared >= MIN_SHARED_PREFIX else 0


class CpuGraphRunner(BackgroundGraphs):
    """The compiled decode graphs of one model (see module), compiled for ``threads`` threads
    (and with ``wide_threads``, the ``wide`` graph for that many); ``forward`` for batches
    that ``can_run``."""

    def __init__(
        self,
        model: torch.nn.Module,
        attention: DecodeAttention,
        threads: int,
        wide_threads: int | None = None,
    ) -> None:
        super().__init__("cpu-compile")
        self.model, self.attention = model, attention
        if wide_threads == threads:
            wide_threads = None
        self.threads, self.wide_threads = threads, wide_threads
        # NOTE: graph -> its thread count; big batches run on the big count where there is one
        self.counts = {name: threads for name in GRAPHS}
        if wide_threads:
            self.counts["wide"] = wide_threads
        self.counts["shared"] = wide_threads or threads
        self.graphs = {name: GRAPHS.get(name, GRAPHS["batch"]) for name in self.counts}
        self.compiled = self._lookup = None  # NOTE: made on the thread: dynamo imports slowly
        self.compiled_wide = self._lookup_wide = None

    def can_run(self, batch: ForwardBatch, threads: int | None = None) -> bool:
        """A step whose tokens all need logits (decode, verify) and whose graph is compiled
        for ``threads`` threads (None: the graphs' own count)."""
        tokens = batch.input_ids.shape[0]
        graph, _ = self._graph(batch, threads)
        if graph not in self.ready or batch.logits_indices.shape[0] != tokens:
            return False
        return torch.equal(batch.logits_indices, torch.arange(tokens))

    def forward(self, batch: ForwardBatch, threads: int | None = None) -> torch.Tensor:
        """Logits ``[T, vocab]`` of the step, from its compiled graph. The call only looks
        graphs up (``torch._dynamo.run``): a step that no graph fits (a guard the start-up
        compile did not foresee) runs the same code eagerly instead of compiling in the
        serving path, and this thread never changes dynamo's global settings while the compile
        thread works."""
        graph, shared = self._graph(batch, threads)
        lookup = self._lookup_wide if self._on_wide(graph) else self._lookup
        return self._run(lookup, decode_inputs(batch, shared))

    def _graph(self, batch: ForwardBatch, threads: int | None) -> tuple[str | None, int]:
        """The graph for ``batch`` on ``threads`` threads (None if there is none), and how
        many KV slots its requests share (read once: the ``shared`` graph)."""
        graph, shared = _graph(batch.input_ids.shape[0], batch.extend_lens_list), 0
        if graph == "batch":
            if shared := long_shared_prefix(batch):
                graph = "shared"
            elif threads is not None and threads == self.wide_threads:
                graph = "wide"
        if graph is None or self.counts[graph] != (threads or self.threads):
            return None, 0
        return graph, shared

    def _on_wide(self, graph: str | None) -> bool:
        """Whether ``graph`` is traced through the wide step (compiled for its count)."""
        return self.wide_threads is not None and self.counts.get(graph) == self.wide_threads

    def _run(self, fn, inputs: DecodeInputs) -> torch.Tensor:
        torch._dynamo.maybe_mark_dynamic(inputs.kv_index, 1)
        torch._dynamo.maybe_mark_dynamic(inputs.key_mask, 2)
        if inputs.input_ids.shape[0] > 1:
            for t in (inputs.input_ids, inputs.positions, inputs.logits_indices,
                      inputs.out_cache_loc, inputs.token_slot):  # fmt: skip
                torch._dynamo.maybe_mark_dynamic(t, 0)
            torch._dynamo.maybe_mark_dynamic(inputs.kv_index, 0)
            torch._dynamo.maybe_mark_dynamic(inputs.key_mask, 0)
            torch._dynamo.maybe_mark_dynamic(inputs.key_mask, 1)
        if inputs.shared_index is not None:
            torch._dynamo.maybe_mark_dynamic(inputs.shared_index, 0)
        return fn(inputs, self.attention)

    @torch.inference_mode()
    def _make(self) -> None:
        import torch._inductor.config as inductor

        inductor.compile_threads = 1  # NOTE: no pool of compile processes beside the scheduler
        inductor.emulate_precision_casts = True  # NOTE: bf16 rounding where eager rounds
        # NOTE: compiled code hangs on the model class's ``forward``, and without module guards
        # another model of the class in this process (tests make several) would reuse graphs
        # traced through its layers; a scheduler holds one model, so forget the others'.
        torch._dynamo.reset()
        self.attention.kernel = cpu_ops.load()
        pool = self.attention.kv_pool
        self.attention.flash = self.attention.kernel and cpu_ops.flash_ready(
            pool.dtype, pool.k[0].shape[-1]
        )
        self.compiled = _compile(self.model.forward, self.threads)
        self._lookup = torch._dynamo.run(self.model.forward)  # NOTE: the graphs, never a compile
        if self.wide_threads:
            wide_step = _wide_step(self.model)  # NOTE: a code object of its own: its own graphs
            self.compiled_wide = _compile(wide_step, self.wide_threads)
            self._lookup_wide = torch._dynamo.run(wide_step)
        for graph, extend_lens in self.graphs.items():
            start = time.perf_counter()
            try:
                fn = self.compiled_wide if self._on_wide(graph) else self.compiled
                shared = MIN_SHARED_PREFIX if graph == "shared" else 0
                self._run(fn, scratch_inputs(extend_lens, shared))
            except Exception as e:  # noqa: BLE001  (eager steps go on; the reason is reported)
                self._failed(e, "CPU decode compile failed")
                return
            self.compile_s[graph] = round(time.perf_counter() - start, 1)
            self.ready.add(graph)
            logger.info("compiled CPU steps (%s) in %.1f s", graph, self.compile_s[graph])


def _compile(fn, threads: int):
    """``torch.compile`` of a step for ``threads`` threads: inductor's C++ kernels split their
    loops for that many."""
    # NOTE: no guards on the model's modules: their weights are never replaced, and checking
    # ~300 parameters cost ~1 ms of a ~14 ms step. None on global state either: it holds
    # torch's thread count, which is one for the whole process and changes with each big step
    # (``StepThreads``), so a graph made on the compile thread would be guarded on whatever
    # count a step had set meanwhile, and the wide graph on the small count (its steps would
    # all run eagerly). ``can_run`` picks the graph made for the step's count; the rest of
    # that state (grad mode) is the same for every step: inference mode.
    def keep(entries):
        return [not e.orig_guard.source.is_unspecialized_nn_module()
                and e.guard_type != "GLOBAL_STATE" for e in entries]  # fmt: skip

    options = {"guard_filter_fn": keep, "cpp.threads": threads}
    return torch.compile(fn, dynamic=None, options=options)


def _wide_step(model: torch.nn.Module):
    """The model's step as a function of its own: dynamo keeps compiled graphs per code
    object, so the wide graph (other kernels, the same guards) does not shadow ``batch``."""

    def wide_step(inputs: DecodeInputs, attention: DecodeAttention) -> torch.Tensor:
        return model.forward(inputs, attention)

    return wide_step


def decode_inputs(batch: ForwardBatch, shared: int = 0) -> DecodeInputs:
    """The graphs' inputs for ``batch``: one row per token; with ``shared``, the KV slots the
    requests all start with apart from each request's own."""
    token_slot, key_mask = grid(batch.extend_lens, batch.positions, max(batch.seq_lens_list))
    kv_index = batch.req_to_token[batch.req_slots, : key_mask.shape[2]]
    shared_index = None
    if shared:
        shared_index = kv_index[0, :shared].clone()
        kv_index, key_mask = kv_index[:, shared:].contiguous(), key_mask[:, :, shared:].contiguous()
    # NOTE: copies made here, in inference mode as the compile's were: a tensor made outside
    # it fails the graphs' guards (the step would run eagerly)
    return DecodeInputs(
        batch.input_ids.clone(), batch.positions.clone(), batch.logits_indices.clone(),
        batch.out_cache_loc.clone(), token_slot, kv_index, key_mask, shared_index,
    )  # fmt: skip


def _graph(tokens: int, extend_lens: list[int]) -> str | None:
    """The graph for a step of ``tokens`` tokens, ``extend_lens`` per request (see module)."""
    if tokens > MAX_ROWS:
        return "batch" if tokens == len(extend_lens) else None
    if tokens == 1:
        return "1"
    if len(extend_lens) == 1:
        return "verify"
    return "decode" if tokens == len(extend_lens) else "mixed"


def grid(
    extend_lens: torch.Tensor, positions: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's place in the step's ``[R, E]`` grid, and the grid's causal key mask over
    ``length`` slots (unused entries attend to slot 0 only: a row of -inf would be NaN)."""
    reqs, per_req = extend_lens.shape[0], int(extend_lens.max())
    if per_req == 1:  # NOTE: a decode step, the common case: the tokens are the grid
        return torch.arange(reqs), torch.arange(length) <= positions.view(reqs, 1, 1)
    owner = torch.repeat_interleave(torch.arange(reqs), extend_lens)
    starts = torch.cumsum(extend_lens, 0) - extend_lens
    token_slot = owner * per_req + torch.arange(owner.shape[0]) - starts[owner]
    grid_pos = torch.zeros(reqs * per_req, dtype=torch.int64)
    grid_pos[token_slot] = positions
    return token_slot, torch.arange(length) <= grid_pos.view(reqs, per_req, 1)


def scratch_inputs(extend_lens: list[int], shared: int = 0) -> DecodeInputs:
    """A step that writes and reads only slot 0, the pool's scratch slot (with ``shared``
    slots all requests start with)."""
    zeros = torch.zeros(sum(extend_lens), dtype=torch.int64)
    token_slot, key_mask = grid(torch.tensor(extend_lens), zeros + WARMUP_LEN - 1, WARMUP_LEN)
    return DecodeInputs(
        input_ids=zeros, positions=zeros.clone(), logits_indices=torch.arange(zeros.shape[0]),
        out_cache_loc=zeros.clone(), token_slot=token_slot,
        kv_index=torch.zeros(len(extend_lens), WARMUP_LEN, dtype=torch.int64), key_mask=key_mask,
        shared_index=torch.zeros(shared, dtype=torch.int64) if shared else None,
    )  # fmt: skip
