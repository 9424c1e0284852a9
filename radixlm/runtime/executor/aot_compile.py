"""Compile a ``low_memory`` model's decode graphs ahead of time, in a child process of the
scheduler (aot_graphs): ``python -m radixlm.runtime.executor.aot_compile DIR/args.json PID``
(PID: the scheduler's).

The model loads as the scheduler's does; each graph is the model's own ``forward`` over
:class:`DecodeInputs` with :class:`DecodeAttention`, exported with ``torch.export`` (the KV
pool's layers as inputs the step writes) and compiled by AOTInductor into ``DIR/<graph>.pt2``
without its constants. ``DIR/constants.json`` names each constant's source for the loader;
nothing is published before each package ran two decode steps close to the eager ones
(``check``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor.aot_graphs import (
    CONSTANTS_FILE,
    GRAPHS,
    bind_constants,
    open_package,
    run_package,
)
from radixlm.runtime.executor.cpu_graph_runner import (
    DecodeAttention,
    DecodeInputs,
    scratch_inputs,
)
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.mem_cache.memory_pool import KVPool
from radixlm.runtime.models.quant import GROUP

CHECK_REQUESTS = {"1": 1, "decode": 3}  # requests in the check's steps, per graph
PR_SET_PDEATHSIG = 1


class _PoolView(KVPool):
    """A KV pool over a step's pool inputs (one tensor per layer for K and for V)."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], dtype: torch.dtype) -> None:
        self.k, self.v, self.dtype, self.size = k, v, dtype, k[0].shape[0] - 1


class DecodeStep(nn.Module):
    """The exported step: the model's forward over flat tensors (``DecodeInputs``' fields),
    then the KV pool's layers. The pool is an input, not a constant, so the package serves a
    pool of any size, writes the pool it is given, and the compile never copies it."""

    def __init__(self, runner: ModelRunner) -> None:
        super().__init__()
        self.model, self.scale, self.dtype = runner.model, runner.backend.scale, runner.dtype

    def forward(
        self, input_ids, positions, logits_indices, out_cache_loc, token_slot, kv_index, key_mask,
        k_pool: list[torch.Tensor], v_pool: list[torch.Tensor],
    ) -> torch.Tensor:  # fmt: skip
        inputs = DecodeInputs(input_ids, positions, logits_indices, out_cache_loc, token_slot,
                              kv_index, key_mask)  # fmt: skip
        attention = DecodeAttention(_PoolView(k_pool, v_pool, self.dtype), self.scale)
        return self.model(inputs, attention)


def export(step: DecodeStep, graph: str, runner: ModelRunner) -> torch.export.ExportedProgram:
    """``graph`` over any context length and pool size (and, for ``decode``, any number of
    requests)."""
    example = scratch_inputs([1] if graph == "1" else [1, 1, 1])
    ctx = torch.export.Dim("L", min=2, max=runner.context_len + 1)
    slots = torch.export.Dim("S", min=2, max=1 << 40)
    if graph == "1":
        per_token, kv_index, key_mask = None, {1: ctx}, {2: ctx}
    else:
        reqs = torch.export.Dim("R", min=2, max=max(runner.req_pool.table.shape[0], 3))
        per_token, kv_index, key_mask = {0: reqs}, {0: reqs, 1: ctx}, {0: reqs, 2: ctx}
    pool = [{0: slots}] * len(runner.kv_pool.k)
    shapes = ((per_token,) * 5 + (kv_index, key_mask, pool, pool))
    inputs = (*example.flat(), runner.kv_pool.k, runner.kv_pool.v)
    with torch.inference_mode():
        return torch.export.export(step, inputs, dynamic_shapes=shapes, strict=False)


def constant_sources(
    names: list[str], program: torch.export.ExportedProgram, runner: ModelRunner
) -> dict[str, str]:
    """Each package constant's source (``aot_graphs.constant_value``): a model tensor, a
    rotary table (lifted by export), else a constant inductor made (the group size of the int4
    matmul's lowering; the check proves it)."""
    tables = {t.data_ptr(): i for i, t in enumerate(runner.model.rotary._table)}
    # NOTE: export names the tensors it lifts "...lifted_tensor_<i>", inductor "_tensor_constant<i>"
    lifted = {name.rpartition("lifted_tensor_")[2]: t
              for name, t in program.constants.items() if "lifted_tensor_" in name}  # fmt: skip
    sources = {}
    for name in names:
        if name.startswith("model."):
            sources[name] = f"model:{name.removeprefix('model.')}"
        elif name.startswith("_tensor_constant"):
            index = name.removeprefix("_tensor_constant")
            sources[name] = f"rotary:{tables[lifted[index].data_ptr()]}"
        else:
            sources[name] = f"int:{GROUP}"
    return sources


def check(graph: str, package: object, runner: ModelRunner) -> None:
    """Two decode steps of ``CHECK_REQUESTS[graph]`` requests (the second reading the KV the
    first wrote) through the package, against each request's steps run eagerly alone (the
    float32 attention the graphs compute; an eager batch attends in bf16): finite logits whose
    mean difference is within 5% of their spread. A constant given the wrong tensor is off by
    about the spread itself."""
    reqs, table = CHECK_REQUESTS[graph], runner.req_pool.table

    def steps(requests: list[int], base: int, run) -> list[torch.Tensor]:
        for i, r in enumerate(requests):
            table[i, :3] = torch.tensor([0, base + 2 * r, base + 2 * r + 1])
        out = []
        for pos in (1, 2):
            batch = ForwardBatch.build(
                input_ids=[7 + 11 * r + pos for r in requests], prefix_lens=[pos] * len(requests),
                extend_lens=[1] * len(requests), req_slots=list(range(len(requests))),
                out_cache_loc=table[: len(requests), pos].clone(),
                logits_indices=list(range(len(requests))), req_to_token=table,
            )  # fmt: skip
            out.append(run(batch))
        return out

    with torch.inference_mode():
        alone = [steps([r], 1, runner.forward) for r in range(reqs)]
        compiled = steps(list(range(reqs)), 1 + 2 * reqs,
                         lambda batch: run_package(package, batch, runner.kv_pool))  # fmt: skip
    for step, logits in enumerate(compiled):
        eager = torch.cat([a[step] for a in alone])
        off = (logits - eager).abs().mean(-1)
        if not logits.isfinite().all() or (off > 0.05 * eager.std(-1)).any():
            raise RuntimeError(f"graph {graph}: logits off the eager step's by {off.tolist()}")


def _end_with_parent(parent: int) -> None:
    """Have the kernel end this process when the scheduler that started it (``parent``) ends
    (Linux's ``PR_SET_PDEATHSIG``): a server stopped during its first start leaves no compile
    behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # NOTE: it ended before the call took effect
        sys.exit(1)


def main(spec_path: str, parent: int) -> None:
    _end_with_parent(parent)
    os.nice(10)  # NOTE: the server goes on serving beside it
    directory = Path(spec_path).parent
    args = ServerArgs(**json.loads(Path(spec_path).read_text()), disable_cpu_compile=True)
    runner = ModelRunner(args)
    step = DecodeStep(runner).eval()
    import torch._inductor.config as inductor

    inductor.compile_threads = 1  # NOTE: one core, no pool of compile processes
    options = {"aot_inductor.package_constants_in_so": False, "emulate_precision_casts": True}
    constants = {}
    for graph in GRAPHS:
        program = export(step, graph, runner)
        staged = str(directory / f"{graph}.staged.pt2")
        torch._inductor.aoti_compile_and_package(program, package_path=staged,
                                                 inductor_configs=options)  # fmt: skip
        package = open_package(staged)
        constants[graph] = constant_sources(package.get_constant_fqns(), program, runner)
        check(graph, bind_constants(package, constants[graph], runner.model), runner)
        print(f"compiled and checked graph {graph}", flush=True)
    (directory / CONSTANTS_FILE).write_text(json.dumps(constants))
    for graph in GRAPHS:
        os.replace(directory / f"{graph}.staged.pt2", directory / f"{graph}.pt2")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
