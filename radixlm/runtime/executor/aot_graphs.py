"""Decode steps compiled ahead of time (AOTInductor) for ``low_memory`` servers on CPU.

``torch.compile`` (cpu_graph_runner) keeps torch's compiler in the scheduler: ~150 MB of
imported modules and ~30 MB per compiled graph, which is why ``low_memory`` ran its steps
eagerly (SmolLM2-135M: ~37 tok/s single stream). Here the decode graphs are exported and
compiled by a child process (``aot_compile``) into packages on disk, and the scheduler loads
each package's shared library with ``torch._C._aoti`` alone: no dynamo, no inductor, no guards
to check at every step (SmolLM2 here, two bench_offline runs: single stream 87.6 and 72.9
tok/s against 70.8 and 53.0 with ``torch.compile``, ~40 eager; the scheduler idles at ~420 MB
either way).

A package holds code, not weights: it is loaded with the scheduler's own tensors (the model's
parameters and buffers, the rotary tables) as user-managed constants, so nothing is copied;
the KV pool's layers are inputs of every step (of any size; the step writes its K and V into
them). Which tensor each of the package's constants is comes from the ``constants.json`` the
compile wrote beside it (the compile checked it: it ran the package against the eager steps
before publishing it). The compile ends with the scheduler that started it.

Two graphs: a single request's decode token (``"1"``) and a decode batch of any size
(``"decode"``); the int4 layers serve every row count in ``low_memory``, so one graph covers
every batch. A batch whose requests share ``MIN_SHARED_PREFIX`` slots runs eagerly (cascade),
as with the compiled graphs. Packages are cached under ``$RADIXLM_CACHE/aot`` keyed by the
model file, the pool and context sizes, torch's version and this package's runtime sources:
the first start compiles in the background (~2.5 min for SmolLM2 here) while steps run eagerly;
later starts load in well under a second.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from radixlm.kernels import cpu_ops
from radixlm.runtime import threads
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor.cpu_graph_runner import (
    MAX_ROWS,
    BackgroundGraphs,
    decode_inputs,
    long_shared_prefix,
)
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.loader.text_tokenizer import cache_root
from radixlm.runtime.mem_cache.memory_pool import KVPool

logger = logging.getLogger(__name__)

GRAPHS = ("1", "decode")
CONSTANTS_FILE = "constants.json"
_RUNTIME_DIR = Path(__file__).resolve().parents[1]  # NOTE: radixlm/runtime: the key's sources


def available() -> bool:
    return hasattr(torch._C, "_aoti") and hasattr(torch._C._aoti, "AOTIModelPackageLoader")


def graph_of(batch: ForwardBatch) -> str | None:
    """The graph of a decode step (every token a request's only one, each needing logits)."""
    tokens = batch.input_ids.shape[0]
    if tokens != len(batch.extend_lens_list) or batch.logits_indices.shape[0] != tokens:
        return None
    if min(batch.seq_lens_list) < 2:  # NOTE: the graphs' context length starts at 2
        return None
    return "1" if tokens == 1 else "decode"


class AotGraphs(BackgroundGraphs):
    """The ahead-of-time compiled decode graphs of one model (see module); ``start`` loads
    them, compiling them first in a child process if they are not on disk."""

    graphs = GRAPHS

    def __init__(self, args: ServerArgs, model: torch.nn.Module, kv_pool: KVPool) -> None:
        """``args``: the model's resolved path, the pool's resolved size."""
        super().__init__("aot-graphs")
        self.model, self.kv_pool, self.compile_args = model, kv_pool, args
        self.dir = package_dir(args)
        self._loaders: dict[str, object] = {}

    def can_run(self, batch: ForwardBatch, threads: int | None = None) -> bool:
        """A decode step whose graph is ready, run on one thread (None: the graphs' own
        count; the packages are compiled for one)."""
        graph = graph_of(batch)
        if graph not in self.ready or threads not in (None, 1):
            return False
        return batch.input_ids.shape[0] <= MAX_ROWS or not long_shared_prefix(batch)

    def forward(self, batch: ForwardBatch, threads: int | None = None) -> torch.Tensor:
        return run_package(self._loaders[graph_of(batch)], batch, self.kv_pool)

    def _make(self) -> None:
        start = time.perf_counter()
        # NOTE: the C++ kernels serve eager steps here (prefill's flash attention, greedy
        # argmax; ~5 MB), not the packages, which cannot call a library op
        cpu_ops.load()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            # NOTE: one compile per key at a time: another process (a dp replica, a test) with
            # the same key waits for it and then loads its packages
            with open(self.dir / "lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not all((self.dir / f"{g}.pt2").is_file() for g in GRAPHS):
                    compile_packages(self.compile_args, self.dir)
            constants = json.loads((self.dir / CONSTANTS_FILE).read_text())
            for graph in GRAPHS:
                package = open_package(self.dir / f"{graph}.pt2")
                self._loaders[graph] = bind_constants(package, constants[graph], self.model)
                self.compile_s[graph] = round(time.perf_counter() - start, 1)
                self.ready.add(graph)
        except Exception as e:  # noqa: BLE001  (eager steps go on; the reason is reported)
            self._failed(e, "ahead-of-time decode graphs unavailable")
            return
        logger.info("ahead-of-time decode graphs ready in %.1f s (%s)",
                    time.perf_counter() - start, self.dir)  # fmt: skip


# The server arguments the compiled code depends on (the model, its dtype and quantisation, the
# KV pool's and rotary table's sizes, the largest batch): the child gets these alone
KEY_FIELDS = ("model_path", "load_format", "quantization", "low_memory", "dtype", "device",
              "context_length", "max_total_tokens", "max_running_requests")  # fmt: skip


def compile_spec(args: ServerArgs) -> dict:
    return {name: getattr(args, name) for name in KEY_FIELDS}


def package_dir(args: ServerArgs) -> Path:
    """Where the packages of ``args`` live, keyed by what the compiled code depends on: the
    model files' names, sizes and dates, ``compile_spec``, torch's version and the runtime's
    sources."""
    path = os.path.abspath(args.model_path)
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(path, n) for n in os.listdir(path) if n.endswith((".json", ".safetensors"))
    )  # fmt: skip
    digest = hashlib.sha256()
    for f in files:
        stat = os.stat(f)
        digest.update(f"{f}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    digest.update(json.dumps(compile_spec(args), sort_keys=True).encode())
    digest.update(torch.__version__.encode())
    for source in sorted(_RUNTIME_DIR.rglob("*.py")):
        digest.update(source.read_bytes())
    return Path(cache_root()) / "aot" / digest.hexdigest()[:24]


def compile_packages(args: ServerArgs, directory: Path) -> None:
    """Run the compile (``aot_compile``) in a child process with one thread; raises with the
    last error line of its log when it fails."""
    spec = directory / "args.json"
    spec.write_text(json.dumps(compile_spec(args)))
    log = directory / "compile.log"
    command = [sys.executable, "-m", "radixlm.runtime.executor.aot_compile", str(spec),
               str(os.getpid())]  # fmt: skip
    with open(log, "w") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT,
                               env=threads.child_env(1))  # fmt: skip
    if code != 0:
        lines = log.read_text().splitlines()
        errors = [line for line in lines if line[:1].isalpha() and "Error" in line.split(":")[0]]
        raise RuntimeError(f"compile failed ({log}): {(errors or lines or [code])[-1]}")


def open_package(path: Path | str) -> object:
    """A package's runner, its constants not yet given (``bind_constants``)."""
    return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)


def bind_constants(package: object, constants: dict[str, str], model: torch.nn.Module) -> object:
    """Give ``package`` the scheduler's own tensors (``constants``: each constant's source, as
    ``aot_compile.constant_sources`` named it); returns it."""
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    values = {name: constant_value(source, tensors, model) for name, source in constants.items()}
    # NOTE: user-managed: the runner reads and writes these tensors, it keeps no copy
    package.load_constants(values, False, True, True)
    return package


def run_package(package: object, batch: ForwardBatch, kv_pool: KVPool) -> torch.Tensor:
    """Logits ``[T, vocab]`` of a decode step, from a loaded package (which writes the step's
    K and V into ``kv_pool``)."""
    return package.run([*decode_inputs(batch).flat(), *kv_pool.k, *kv_pool.v])[0]


def constant_value(source: str, tensors: dict[str, torch.Tensor], model: torch.nn.Module):
    kind, _, what = source.partition(":")
    if kind == "model":
        return tensors[what]
    if kind == "rotary":
        return model.rotary._table[int(what)]
    if kind == "int":
        return torch.tensor(int(what))
    raise ValueError(f"unknown constant source {source!r}")
