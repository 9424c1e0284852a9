"""Compiled CPU decode steps: AOTInductor packages built by a child process, loaded when ready.

A decode step of a small model runs ~2x faster compiled than eager (``decode_step``). The
graphs are never compiled in the scheduler's process: a child (``aot_compile``, at low
priority, one compile thread) exports the model's ``forward`` over :class:`DecodeInputs` and
AOTInductor compiles it into a package on disk, one graph at a time, each checked against the
eager step before it is published. The scheduler's background thread only waits for the child
and loads each package as it appears (``torch._C._aoti`` alone: no dynamo, no inductor, no
guards at each step); until a step's graph is loaded, the step runs eagerly, at the eager
path's full speed, since the compile shares neither the scheduler's process nor its GIL.

A package holds code, not weights: it is loaded with the scheduler's own tensors (parameters,
buffers, the bf16 weights in oneDNN's layout, the rotary tables) as user-managed constants, so
nothing is copied; the KV pool's layers are inputs of every step (of any size; the step writes
its K and V into them). ``<graph>.json`` beside each package names each constant's source and
the package's SHA-256: a package whose bytes differ (a torn or corrupted file) is deleted and
built again, never loaded.

Graphs (``plan``, named ``<kind>@<threads>``: inductor splits loops for the thread count it
compiles for, and a step takes the graph of its count): one token (``1``: on the big count,
where a lone request's steps run, and the small one for a busy machine); one request's token
and draft (``verify``); decode batches of 2-8 requests (``decode``) and mixes (``mixed``),
where the int4/int8 copies serve; decode batches of more (``batch``, the bf16 weights through
oneDNN, on both counts) and batches whose requests share ``MIN_SHARED_PREFIX`` slots
(``shared``). A ``low_memory`` model's int4-only layers serve every row count, so it has the
``1`` graphs and a ``decode`` of any size.

Packages live under ``$RADIXLM_CACHE/aot/<key>``, the key hashing the model files' names,
sizes and dates, the arguments the code depends on (``KEY_FIELDS``), the plan, torch's
version, the CPU's flags and this package's runtime and kernel sources; a lock file makes
processes with one key compile once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from radixlm.kernels import cpu_ops
from radixlm.runtime import threads
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor.decode_step import (
    MAX_ROWS,
    DecodeAttention,
    DecodeInputs,
    decode_inputs,
    long_shared_prefix,
)
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.loader.text_tokenizer import cache_root
from radixlm.runtime.mem_cache.memory_pool import KVPool

logger = logging.getLogger(__name__)

_PACKAGE_DIR = Path(__file__).resolve().parents[2]  # NOTE: radixlm/: the key's sources
_SOURCES = ("runtime/**/*.py", "kernels/*.py", "kernels/*.cpp", "kernels/*.h")


@dataclass(frozen=True)
class Graph:
    """One compiled step: its example (tokens per request), the range of its request count,
    the thread count it is compiled for, and whether it reads a shared prefix apart."""

    example: tuple[int, ...]
    requests: tuple[int, int]
    threads: int
    shared: bool = False


def plan(low_memory: bool, small: int, big: int | None, max_requests: int) -> dict[str, Graph]:
    """The graphs of a scheduler (module docstring), named ``<kind>@<threads>``, in the order
    they build: the commonest steps' first. A lone request's steps run on the big count where
    there is one (``StepThreads``), with a ``1`` on the small count for a busy machine."""
    one = big or small
    few, many = (2, min(MAX_ROWS, max_requests)), (MAX_ROWS + 1, max_requests)
    graphs = [("1", Graph((1,), (1, 1), one)), ("1", Graph((1,), (1, 1), small))]
    if low_memory:  # NOTE: int4-only layers: one decode graph of any size
        graphs.append(("decode", Graph((1, 1, 1), (2, max_requests), small)))
    else:
        graphs += [
            ("decode", Graph((1, 1, 1), few, small)),
            ("batch", Graph((1,) * 16, many, one)),
            ("batch", Graph((1,) * 16, many, small)),
            ("shared", Graph((1,) * 16, many, one, shared=True)),
            ("verify", Graph((3,), (1, 1), one)),
            ("mixed", Graph((4, 1), few, small)),
        ]
    return {f"{kind}@{g.threads}": g for kind, g in graphs if g.requests[0] <= g.requests[1]}


def available() -> bool:
    return hasattr(torch._C, "_aoti") and hasattr(torch._C._aoti, "AOTIModelPackageLoader")


class AotGraphs:
    """The compiled decode graphs of one scheduler (see module): ``start`` loads them on a
    background thread, building the missing ones in a child process first; ``can_run`` /
    ``forward`` serve the steps whose graph is loaded."""

    def __init__(
        self, args: ServerArgs, model: torch.nn.Module, kv_pool: KVPool, scale: float,
        small: int, big: int | None = None, context_len: int | None = None,
    ) -> None:  # fmt: skip
        """``args``: the model's resolved path; ``scale``: the attention's; ``small`` /
        ``big``: the thread counts of small and big steps; ``context_len``: the rotary
        table's length less one."""
        self.model, self.kv_pool, self.scale = model, kv_pool, scale
        self._eager: DecodeAttention | None = None  # NOTE: set once the C++ kernels loaded
        self.small, self.big = small, big if big != small else None
        self.graphs = plan(args.low_memory, small, self.big, args.max_running_requests)
        self.kinds = {name.partition("@")[0] for name in self.graphs}
        self.compile_args = args.replace(context_length=context_len or args.context_length)
        self.dir = package_dir(self.compile_args, self.graphs)
        self.ready: set[str] = set()
        self.compile_s: dict[str, float] = {}  # NOTE: seconds from start to each graph's load
        self.building: list[str] = []
        self.since: float | None = None  # NOTE: when the child started building (epoch s)
        self.error: str | None = None
        self._loaders: dict[str, object] = {}
        self._choice: tuple | None = None  # NOTE: (batch, threads, graph_of's answer) of a step
        self._thread = threading.Thread(target=self._make, name="aot-graphs", daemon=True)

    def start(self) -> None:
        """Start loading (and, where missing, building) the graphs in the background, once."""
        if self._thread.ident is None:
            self._thread.start()

    def on_disk(self) -> bool:
        """Whether every graph's package is on disk (a restart: loading them takes well under a
        second, so the scheduler does it before it reports ready)."""
        return all((self.dir / f"{n}.pt2").is_file() and (self.dir / f"{n}.json").is_file()
                   for n in self.graphs)  # fmt: skip

    def wait(self, timeout: float | None = None) -> bool:
        """Start if needed and block until every graph is loaded (or failed); False on
        timeout."""
        self.start()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def status(self) -> str:
        if self.error is not None:
            return f"failed: {self.error}"
        return "ready" if len(self.ready) == len(self.graphs) else "compiling"

    def describe(self) -> dict:
        """``get_server_info``'s view: which graphs are loaded, which are building and since
        when, where they live."""
        return {
            "status": self.status, "loaded": sorted(self.ready), "building": self.building,
            "building_since": self.since, "load_s": self.compile_s, "dir": str(self.dir),
        }  # fmt: skip

    def graph_of(self, batch: ForwardBatch, threads: int | None = None) -> tuple[str | None, int]:
        """The graph for ``batch`` on ``threads`` threads (None: the small count), loaded or
        not, and the KV slots its requests share (read apart by ``shared``); None if none.
        Kept for the step: ``can_run`` and then ``forward`` ask for the same batch."""
        last = self._choice
        if last is not None and last[0] is batch and last[1] == threads:
            return last[2]
        choice = self._choose(batch, threads)
        self._choice = (batch, threads, choice)
        return choice

    def _choose(self, batch: ForwardBatch, threads: int | None) -> tuple[str | None, int]:
        tokens, reqs = batch.input_ids.shape[0], len(batch.extend_lens_list)
        if batch.logits_indices.shape[0] != tokens or min(batch.seq_lens_list) < 2:
            return None, 0  # NOTE: the graphs' context length starts at 2
        shared, kind = 0, None
        if tokens == 1:
            kind = "1"
        elif tokens != reqs:  # NOTE: several tokens of a request (verify steps)
            kind = None if tokens > MAX_ROWS else "verify" if reqs == 1 else "mixed"
        elif tokens > MAX_ROWS and (shared := long_shared_prefix(batch)):
            kind = "shared"
        elif tokens <= MAX_ROWS or "batch" not in self.kinds:  # NOTE: low_memory's any size
            kind = "decode"
        else:
            kind = "batch"
        name = f"{kind}@{threads or self.small}"
        return (name, shared) if name in self.graphs else (None, 0)

    def can_run(self, batch: ForwardBatch, threads: int | None = None) -> bool:
        """A step whose tokens all need logits (decode, verify) that one of the graphs takes,
        once it is loaded or, until then, once the C++ kernels are (``forward``)."""
        name, _ = self.graph_of(batch, threads)
        if name is None or (name not in self.ready and self._eager is None):
            return False
        return torch.equal(batch.logits_indices, torch.arange(batch.input_ids.shape[0]))

    def forward(self, batch: ForwardBatch, threads: int | None = None) -> torch.Tensor:
        """Logits ``[T, vocab]`` of the step (which writes its K and V), from its graph; until
        that is loaded, the same step eagerly: the model over ``DecodeInputs`` with the C++
        attention kernel (fewer ops than the attention backend's gathers and matmuls, and the
        graph's attention: the float32 kernel)."""
        name, shared = self.graph_of(batch, threads)
        inputs = decode_inputs(batch, shared)
        if name in self.ready:
            return run_package(self._loaders[name], inputs, self.kv_pool)
        return self.model(inputs, self._eager)

    def _make(self) -> None:
        start = time.perf_counter()
        # NOTE: the packages call the C++ kernels' ops, which must be registered first (and the
        # eager steps use them: prefill's flash attention, RMSNorm, greedy argmax)
        if cpu_ops.load():
            flash = cpu_ops.flash_ready(self.kv_pool.dtype, self.kv_pool.k[0].shape[-1])
            self._eager = DecodeAttention(self.kv_pool, self.scale, kernel=True, flash=flash)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            # NOTE: one build per key at a time: another process (a dp replica, a second
            # server) with the same key waits for it, then loads its packages
            with open(self.dir / "lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                missing = [g for g in self.graphs if not self._load(g, start, fresh=False)]
                if missing:
                    self._build(missing, start)
        except Exception as e:  # noqa: BLE001  (eager steps go on; the reason is reported)
            self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            logger.warning("CPU step graphs unavailable, those steps stay eager: %s", self.error)
            return
        finally:
            self.building = []
        logger.info("CPU step graphs ready in %.1f s (%s)", time.perf_counter() - start, self.dir)

    def _load(self, name: str, start: float, fresh: bool) -> bool:
        """Load graph ``name`` from disk; False if it is not there. A package whose bytes do
        not match its record is deleted (and so built again), unless it was just built."""
        path, record = self.dir / f"{name}.pt2", self.dir / f"{name}.json"
        if not (path.is_file() and record.is_file()):
            return False
        meta = json.loads(record.read_text())
        if file_digest(path) != meta["sha256"]:
            if fresh:
                raise RuntimeError(f"graph {name}: the package changed as it was published")
            logger.warning("CPU step graph %s: corrupt package in %s, building it again",
                           name, self.dir)  # fmt: skip
            path.unlink()
            record.unlink()
            return False
        self._loaders[name] = bind_constants(open_package(path), meta["constants"], self.model)
        self.compile_s[name] = round(time.perf_counter() - start, 1)
        self.ready.add(name)
        return True

    def _build(self, names: list[str], start: float) -> None:
        """Build ``names`` in a child process, loading each as it is published."""
        self.building, self.since = list(names), time.time()
        logger.info("building %d CPU step graphs in the background (%s); their steps run "
                    "eagerly until each is loaded", len(names), ", ".join(names))  # fmt: skip
        for name in compile_packages(self.compile_args, self.graphs, names, self.dir):
            self._load(name, start, fresh=True)
            self.building.remove(name)
            logger.info("CPU step graph %s ready (%d/%d, %.0f s)", name, len(self.ready),
                        len(self.graphs), time.perf_counter() - start)  # fmt: skip


# The server arguments the compiled code depends on (the model, its dtype and quantisation,
# the rotary table's length, the largest batch): the child gets these alone
KEY_FIELDS = ("model_path", "load_format", "quantization", "low_memory", "dtype", "device",
              "context_length", "max_running_requests")  # fmt: skip


def compile_spec(args: ServerArgs) -> dict:
    return {name: getattr(args, name) for name in KEY_FIELDS}


def package_dir(args: ServerArgs, graphs: dict[str, Graph]) -> Path:
    """Where the packages of ``args`` live, keyed by what the compiled code depends on (module
    docstring)."""
    path = os.path.abspath(args.model_path)
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(path, n) for n in os.listdir(path) if n.endswith((".json", ".safetensors"))
    )  # fmt: skip
    digest = hashlib.sha256()
    for f in files:
        stat = os.stat(f)
        digest.update(f"{f}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    digest.update(json.dumps(compile_spec(args), sort_keys=True).encode())
    digest.update(json.dumps({n: asdict(g) for n, g in graphs.items()}).encode())
    digest.update(f"{torch.__version__}\n{cpu_ops.cpu_flags()}".encode())
    for source in sorted(p for pattern in _SOURCES for p in _PACKAGE_DIR.glob(pattern)):
        digest.update(source.read_bytes())
    return Path(cache_root()) / "aot" / digest.hexdigest()[:24]


def compile_packages(args: ServerArgs, graphs: dict[str, Graph], names: list[str], directory:
                     Path):  # fmt: skip
    """Run the compile (``aot_compile``) of ``names`` in a child process; yields each graph's
    name once its package is published, and raises with the last error line of the child's
    log if it fails."""
    spec = directory / "args.json"
    spec.write_text(json.dumps({"args": compile_spec(args), "names": names,
                                "graphs": {n: asdict(g) for n, g in graphs.items()}}))  # fmt: skip
    log = directory / "compile.log"
    command = [sys.executable, "-m", "radixlm.runtime.executor.aot_compile", str(spec),
               str(os.getpid())]  # fmt: skip
    with open(log, "w") as err:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True,
                                 env=threads.child_env(1))  # fmt: skip
        for line in child.stdout:
            if line.startswith("published "):
                yield line.split()[1]
        code = child.wait()
    if code != 0:
        lines = log.read_text().splitlines()
        errors = [line for line in lines if line[:1].isalpha() and "Error" in line.split(":")[0]]
        raise RuntimeError(f"compile failed ({log}): {(errors or lines or [code])[-1]}")


def file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def open_package(path: Path | str) -> object:
    """A package's runner, its constants not yet given (``bind_constants``)."""
    return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)


def bind_constants(package: object, constants: dict[str, str], model: torch.nn.Module) -> object:
    """Give ``package`` the scheduler's own tensors (``constants``: each constant's source, as
    ``aot_compile.constant_sources`` named it); returns it."""
    values = {name: constant_value(source, model) for name, source in constants.items()}
    # NOTE: user-managed: the runner reads and writes these tensors, it keeps no copy
    package.load_constants(values, False, True, True)
    return package


def run_package(package: object, inputs: DecodeInputs, kv_pool: KVPool) -> torch.Tensor:
    """Logits ``[T, vocab]`` of a decode step from a loaded package, which writes the step's K
    and V into ``kv_pool``."""
    return package.run([*inputs.flat(), *kv_pool.k, *kv_pool.v])[0]


def constant_value(source: str, model: torch.nn.Module) -> torch.Tensor:
    """``model:<attribute path>`` (a parameter, buffer or other tensor of the model),
    ``rotary:<i>`` (a rotary table) or ``int:<n>`` (a scalar inductor made)."""
    kind, _, what = source.partition(":")
    if kind == "model":
        value = model
        for part in what.split("."):
            value = getattr(value, part)
        return value
    if kind == "rotary":
        return model.rotary._table[int(what)]
    if kind == "int":
        return torch.tensor(int(what))
    raise ValueError(f"unknown constant source {source!r}")
