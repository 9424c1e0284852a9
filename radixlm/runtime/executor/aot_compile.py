"""Compile a scheduler's decode graphs ahead of time, in a child process of it (aot_graphs):
``python -m radixlm.runtime.executor.aot_compile DIR/args.json PID`` (PID: the scheduler's).

The model loads as the scheduler's does; each graph is the model's own ``forward`` over
:class:`DecodeInputs` with :class:`DecodeAttention`, exported with ``torch.export`` (the KV
pool's layers as inputs the step writes) and compiled by AOTInductor into ``DIR/<graph>.pt2``
without its constants, for the graph's thread count. ``DIR/<graph>.json`` names each
constant's source and holds the package's SHA-256; a package is published (renamed into place,
then ``published <graph>`` printed) only after it ran two steps of its shape close to the
eager steps (``check``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import traceback
from pathlib import Path

import torch
from torch import nn

from radixlm.kernels import cpu_ops
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor.aot_graphs import (
    Graph,
    bind_constants,
    file_digest,
    open_package,
    run_package,
)
from radixlm.runtime.executor.attention.torch_backend import MIN_SHARED_PREFIX
from radixlm.runtime.executor.decode_step import (
    DecodeAttention,
    DecodeInputs,
    decode_inputs,
    long_shared_prefix,
    scratch_inputs,
)
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.mem_cache.memory_pool import KVPool
from radixlm.runtime.models.quant import GROUP

PR_SET_PDEATHSIG = 1


class _PoolView(KVPool):
    """A KV pool over a step's pool inputs (one tensor per layer for K and for V)."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], dtype: torch.dtype) -> None:
        self.k, self.v, self.dtype, self.size = k, v, dtype, k[0].shape[0] - 1


class DecodeStep(nn.Module):
    """The exported step: the model's forward over ``DecodeInputs``' fields (``flat`` order),
    then the KV pool's layers. The pool is an input, not a constant, so the package serves a
    pool of any size, writes the pool it is given, and the compile never copies it."""

    def __init__(self, runner: ModelRunner, kernel: bool, flash: bool) -> None:
        super().__init__()
        self.model, self.scale, self.dtype = runner.model, runner.backend.scale, runner.dtype
        self.kernel, self.flash = kernel, flash

    def forward(
        self, fields: list[torch.Tensor], k_pool: list[torch.Tensor], v_pool: list[torch.Tensor]
    ) -> torch.Tensor:
        inputs = DecodeInputs(*fields)
        pool = _PoolView(k_pool, v_pool, self.dtype)
        return self.model(inputs, DecodeAttention(pool, self.scale, self.kernel, self.flash))


def export(step: DecodeStep, graph: Graph, runner: ModelRunner) -> torch.export.ExportedProgram:
    """``graph`` over any context length and pool size, and its range of requests (and of
    tokens per request: ``verify`` and ``mixed`` take up to 8 tokens)."""
    shared = MIN_SHARED_PREFIX if graph.shared else 0
    example = scratch_inputs(list(graph.example), shared)
    ctx = torch.export.Dim("L", min=2, max=runner.context_len + 1)
    slots = torch.export.Dim("S", min=2, max=1 << 40)
    lo, hi = graph.requests
    reqs = torch.export.Dim("R", min=lo, max=hi) if hi > 1 else None
    per_req = max(graph.example)
    if per_req == 1:  # NOTE: one token per request: the tokens are the requests
        token = {0: reqs} if reqs else None
        kv_index, key_mask = {0: reqs, 1: ctx} if reqs else {1: ctx}, {2: ctx}
        if reqs:
            key_mask[0] = reqs
    else:
        token = {0: torch.export.Dim("T", min=2, max=8)}
        extend = torch.export.Dim("E", min=2, max=8)
        kv_index = {0: reqs, 1: ctx} if reqs else {1: ctx}
        key_mask = {0: reqs, 1: extend, 2: ctx} if reqs else {1: extend, 2: ctx}
    fields = [token] * 5 + [kv_index, key_mask]
    if shared:
        fields.append({0: torch.export.Dim("P", min=MIN_SHARED_PREFIX, max=runner.context_len)})
    pool = [{0: slots}] * len(runner.kv_pool.k)
    inputs = (list(example.flat()), runner.kv_pool.k, runner.kv_pool.v)
    with torch.inference_mode():
        return torch.export.export(step, inputs, dynamic_shapes=(fields, pool, pool),
                                   strict=False)  # fmt: skip


def constant_sources(
    names: list[str], program: torch.export.ExportedProgram, runner: ModelRunner
) -> dict[str, str]:
    """Each package constant's source (``aot_graphs.constant_value``): a parameter or buffer
    (named as in the model); else the program's constant of that index (inductor names them
    ``_tensor_constant<i>`` in the program's order): a tensor of the model (the bf16 weights in
    oneDNN's layout) or a rotary table (lifted by export); else a scalar inductor made (the
    group size of the int4 matmul's lowering). The check proves the wiring."""
    tables = {t.data_ptr(): i for i, t in enumerate(runner.model.rotary._table)}
    attributes = {}
    for path, module in runner.model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor):
                attributes[id(value)] = f"{path}.{attr}".lstrip(".")
    tensors = list(program.constants.values())
    sources = {}
    for name in names:
        if name.startswith("model."):
            sources[name] = f"model:{name.removeprefix('model.')}"
        elif name.startswith("_tensor_constant"):
            tensor = tensors[int(name.removeprefix("_tensor_constant"))]
            if id(tensor) in attributes:
                sources[name] = f"model:{attributes[id(tensor)]}"
            else:
                sources[name] = f"rotary:{tables[tensor.data_ptr()]}"
        else:
            sources[name] = f"int:{GROUP}"
    return sources


def check(graph: Graph, package: object, step: DecodeStep, runner: ModelRunner) -> None:
    """Two steps of the graph's example shape (the second reading the KV the first wrote),
    each request after a context of its own (and, for ``shared``, a shared prefix), through
    the package and then on other slots through the same step run eagerly (the model over
    ``DecodeInputs`` with ``step``'s attention): finite logits whose mean difference is within
    a quarter of their spread. Most rows agree exactly; inductor's fusions round a few bf16
    values differently (the eager RMSNorm is the C++ kernel's), which 30 layers can grow to
    ~6% of the spread (SmolLM2, 16 requests); a constant given the wrong tensor is off by
    about the spread itself."""
    lens, shared = list(graph.example), MIN_SHARED_PREFIX if graph.shared else 0
    reqs, own, vocab = len(lens), 1 + 2 * max(lens), runner.config.vocab_size
    table = runner.req_pool.table

    def steps(base: int, run) -> list[torch.Tensor]:
        for r in range(reqs):
            table[r, :shared] = torch.arange(1, shared + 1)
            start = base + r * own
            table[r, shared : shared + own] = torch.arange(start, start + own)
        if shared:
            runner.forward(_batch([3 + i % 50 for i in range(shared)], [0], [shared], table))
        runner.forward(_batch([5 + r for r in range(reqs)], [shared] * reqs, [1] * reqs, table))
        out, pos = [], [shared + 1] * reqs
        for step in range(2):
            ids = [(7 + 11 * r + 3 * step + j) % vocab for r in range(reqs) for j in range(lens[r])]
            out.append(run(_batch(ids, pos, lens, table)))
            pos = [p + n for p, n in zip(pos, lens)]
        return out

    def inputs(batch: ForwardBatch) -> DecodeInputs:
        return decode_inputs(batch, long_shared_prefix(batch) if shared else 0)

    attention = DecodeAttention(runner.kv_pool, step.scale, step.kernel, step.flash)
    with torch.inference_mode():
        got = steps(1 + shared, lambda b: run_package(package, inputs(b), runner.kv_pool))
        want = steps(1 + shared + reqs * own, lambda b: runner.model(inputs(b), attention))
    for logits, eager in zip(got, want):
        off = (logits - eager).abs().mean(-1)
        if not logits.isfinite().all() or (off > 0.25 * eager.std(-1)).any():
            raise RuntimeError(f"logits off the eager step's by {off.tolist()}")


def _batch(ids: list[int], prefix_lens: list[int], extend_lens: list[int], table) -> ForwardBatch:
    """A step of ``extend_lens[r]`` tokens of request (row) ``r`` after ``prefix_lens[r]``, every
    token with logits (a prefill where there is one request of many tokens: its last)."""
    slots = [table[r, p : p + n] for r, (p, n) in enumerate(zip(prefix_lens, extend_lens))]
    rows = list(range(len(ids))) if len(ids) <= 8 or len(extend_lens) > 1 else [len(ids) - 1]
    return ForwardBatch.build(
        input_ids=ids, prefix_lens=prefix_lens, extend_lens=extend_lens,
        req_slots=list(range(len(extend_lens))), out_cache_loc=torch.cat(slots),
        logits_indices=rows, req_to_token=table,
    )  # fmt: skip


def _end_with_parent(parent: int) -> None:
    """Have the kernel end this process when the scheduler that started it (``parent``) ends
    (Linux's ``PR_SET_PDEATHSIG``): a server stopped during its first start leaves no compile
    behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # NOTE: it ended before the call took effect
        sys.exit(1)


def build(directory: Path, name: str, graph: Graph, step: DecodeStep, runner: ModelRunner):
    """Compile, check and publish one graph."""
    import torch._inductor.config as inductor

    inductor.compile_threads = 1  # NOTE: one core, no pool of compile processes
    program = export(step, graph, runner)
    staged = directory / f"{name}.staged.pt2"
    options = {"aot_inductor.package_constants_in_so": False, "emulate_precision_casts": True,
               "cpp.threads": graph.threads}  # fmt: skip
    torch._inductor.aoti_compile_and_package(program, package_path=str(staged),
                                             inductor_configs=options)  # fmt: skip
    package = open_package(staged)
    constants = constant_sources(package.get_constant_fqns(), program, runner)
    check(graph, bind_constants(package, constants, runner.model), step, runner)
    record = {"constants": constants, "sha256": file_digest(staged)}
    (directory / f"{name}.json").write_text(json.dumps(record))
    os.replace(staged, directory / f"{name}.pt2")
    print(f"published {name}", flush=True)


def main(spec_path: str, parent: int) -> None:
    _end_with_parent(parent)
    os.nice(10)  # NOTE: the server goes on serving beside it
    directory, spec = Path(spec_path).parent, json.loads(Path(spec_path).read_text())
    args = ServerArgs(**spec["args"], disable_cpu_compile=True)
    # NOTE: a pool as long as the context (the packages take a pool of any size)
    runner = ModelRunner(args.replace(max_total_tokens=args.context_length))
    torch.set_num_threads(1)
    kernel = cpu_ops.load()
    flash = kernel and cpu_ops.flash_ready(runner.dtype, runner.config.head_dim)
    step = DecodeStep(runner, kernel, flash).eval()
    failed = []
    for name in spec["names"]:
        g = spec["graphs"][name]
        graph = Graph(tuple(g["example"]), tuple(g["requests"]), g["threads"], g["shared"])
        try:
            build(directory, name, graph, step, runner)
        except Exception:  # noqa: BLE001  (the other graphs still build; the log says why)
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"RuntimeError: graphs {', '.join(failed)} failed (see above)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
