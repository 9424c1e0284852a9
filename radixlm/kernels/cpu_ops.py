"""C++ CPU kernels (``cpu_ops.cpp``): the compiled CPU steps' attention, prefill's flash
attention, greedy argmax, and the eager steps' RMSNorm.

**Attention.** Inductor fuses :class:`~radixlm.runtime.executor.decode_step.DecodeAttention`'s
plain torch formulation into one loop nest, but that nest recomputes each score in every pass
of the softmax and reduces each (slot, head) dot product on its own: SmolLM2-135M, 32 requests
at ~95 tokens of context, 16.3 ms of a ~69 ms step on 2 threads, for ~70 MB of KV read. The
kernel does one work item per (token, KV head): the group's query heads in registers, each
key row read once for all of them, a vectorised softmax over the scores, each value row read
once (AVX-512 where the CPU has it, with D of 16, 32, 64 or 128 and up to 8 query heads per KV
head; plain C++ otherwise). It returns each row's log-sum-exp too, for the cascade's merge.
30 layers of that step, microbenchmark: 2.3 ms against inductor's 10.6 (2 threads).

**Flash attention** (``flash_attention.cpp``): prefill's attention, variable-length sequences
over KV pool slots, causal or not, with the log-sum-exp (the eager torch backend's extend
groups and shared parts, and the ``shared`` graph's). Keys packed in 16-key blocks of
dimension pairs, values in key pairs, so AVX-512 BF16's ``vdpbf16ps`` gives 16 scores or adds
to 16 outputs an instruction; online softmax in float32 over 64-key blocks. SmolLM2, a
790-token prompt, 2 threads: 3.1 ms a layer against 8.5 for torch's SDPA. Without AVX-512
BF16 (or for head sizes other than 32, 64, 128) a plain loop serves, and :func:`flash_ready`
tells callers to keep torch's kernels.

**Argmax.** torch's CPU argmax over a ``[32, 49152]`` float32 block is not vectorised: 1.5 ms
of every batch-32 greedy step on 2 threads. The kernel's (first index of the largest value,
a NaN counting as largest, as torch's) takes ~0.1 ms.

The library is compiled for this CPU (``-march=native``) against the installed torch, with
the C++ compiler inductor uses anyway (~20 s), into ``$RADIXLM_CACHE/kernels``, keyed by the
source, torch's version and the CPU's flags; a lock makes processes with one key build once.
:func:`load` builds and loads it (the CPU graph runner calls it on its compile thread);
:func:`loaded` only says whether that happened. Where the build fails (no compiler),
:func:`load` says why and callers keep torch's ops.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import torch

from radixlm.runtime.loader.text_tokenizer import cache_root

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = [HERE / "cpu_ops.cpp", HERE / "flash_attention.cpp", HERE / "gguf_matmul.cpp"]
HEADERS = [HERE / "avx2_math.h", HERE / "avx512_math.h", HERE / "flash_attention.h"]
_lock = threading.Lock()
_loaded: bool | None = None


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _build_command(output: Path) -> list[str]:
    from torch.utils import cpp_extension

    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    includes = [arg for path in cpp_extension.include_paths() for arg in ("-I", path)]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    # NOTE: -fopenmp for at::parallel_for; it links the libgomp torch loaded (one thread pool)
    return [os.environ.get("CXX", "c++"), "-O3", "-march=native", "-std=c++20", "-shared",
            "-fPIC", "-fopenmp", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes, *map(str, SOURCES),
            "-o", str(output), f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}"]  # fmt: skip


def library_path() -> Path:
    """Where this CPU's build of the kernel lives (built or not)."""
    key = hashlib.sha256()
    sources = [path.read_bytes() for path in SOURCES + HEADERS]
    for part in (*sources, torch.__version__.encode(), cpu_flags().encode()):
        key.update(part)
    return Path(cache_root()) / "kernels" / f"cpu_ops-{key.hexdigest()[:16]}.so"


def loaded() -> bool:
    """Whether the library is loaded (never builds it)."""
    return bool(_loaded)


def load() -> bool:
    """Build (once per key) and load the library into ``torch.ops.radixlm_cpu``; False, with
    the reason logged, where it cannot be built or loaded."""
    global _loaded
    with _lock:
        if _loaded is None:
            try:
                _load()
                _loaded = True
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                logger.warning("CPU kernels unavailable (%s): torch's ops serve instead", e)
                _loaded = False
        return _loaded


def _load() -> None:
    path = library_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                partial = path.with_suffix(f".{os.getpid()}.tmp")
                done = subprocess.run(_build_command(partial), capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"compile failed: {done.stderr.strip().splitlines()[-1:]}")
                os.replace(partial, path)
                logger.info("built the CPU kernels: %s", path)
    torch.ops.load_library(str(path))
    torch.library.register_fake("radixlm_cpu::decode_attention")(_fake_attention)
    torch.library.register_fake("radixlm_cpu::flash_attention")(_fake_attention)
    torch.library.register_fake("radixlm_cpu::gguf_matmul")(_fake_gguf_matmul)
    torch.library.register_fake("radixlm_cpu::gguf_dequantize")(_fake_gguf_dequantize)


def _fake_attention(q, *_):
    return torch.empty_like(q, dtype=torch.float32), q.new_empty(q.shape[:2], dtype=torch.float32)


def _fake_gguf_matmul(x, raw, kind):
    return x.new_empty(x.shape[0], raw.shape[0])


def _fake_gguf_dequantize(raw, kind, cols, dtype):
    return raw.new_empty(raw.shape[0], cols, dtype=dtype)


def decode_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    kv_index: torch.Tensor,
    token_slot: torch.Tensor,
    key_mask: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token ``t`` of ``q [T, H, D]`` attends to its request's slots ``kv_index[r]``
    under ``key_mask[r, e]`` (grid entry ``token_slot[t] = r * E + e``; the mask a prefix, as
    the grid's causal masks are) -> (``[T, H, D]`` and the log-sum-exp ``[T, H]``, in float32)."""
    return torch.ops.radixlm_cpu.decode_attention(
        q, k_buf, v_buf, kv_index, token_slot, key_mask, scale
    )


def flash_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    slots: torch.Tensor,
    q_starts: torch.Tensor | None = None,
    kv_starts: torch.Tensor | None = None,
    causal: bool = False,
    scale: float = 1.0,
    window: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Variable-length attention over KV pool slots: sequence ``b``'s tokens
    ``q[q_starts[b]:q_starts[b + 1]]`` (``q [T, H, D]``) attend to the pool's (``[S, Hkv, D]``)
    slots ``slots[kv_starts[b]:kv_starts[b + 1]]``; without starts, one sequence. ``causal``:
    a sequence's last token sits at its last slot, each earlier token one slot earlier; else
    every token sees every slot of its sequence; ``window`` > 0 (causal): each token only the
    last ``window`` slots it sees, itself included -> (``[T, H, D]`` and the log-sum-exp
    ``[T, H]``, in float32)."""
    return torch.ops.radixlm_cpu.flash_attention(
        q, k_buf, v_buf, slots, q_starts, kv_starts, causal, scale, window
    )


def flash_ready(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether prefill attention should take :func:`flash_attention` over torch's kernels: the
    library loaded and its vector path serves the shape (bf16 on a CPU with AVX-512 BF16,
    head size 32, 64 or 128)."""
    return (
        loaded() and dtype == torch.bfloat16 and torch.ops.radixlm_cpu.flash_vectorized(head_dim)
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``F.rms_norm(x, x.shape[-1:], weight, eps)`` of bf16 or float32 ``x`` in one call
    (float32 inside, rounded once): torch's composite is ~8 ops, ~50 us a row of SmolLM2's (bf16;
    93 in float32 on an AVX2 CPU), 61 a decode step."""
    return torch.ops.radixlm_cpu.rms_norm(x, weight, eps)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` of float32 ``[B, V]`` logits (the same indices, NaN included)."""
    return torch.ops.radixlm_cpu.argmax(logits)


if __name__ == "__main__":  # NOTE: `python -m radixlm.kernels.cpu_ops`: build now
    logging.basicConfig(level=logging.INFO)
    sys.exit(0 if load() else 1)
