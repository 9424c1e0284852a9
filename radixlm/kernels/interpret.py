"""When Triton kernels can run here: compiled on CUDA, or in Triton's CPU interpreter.

Triton picks compiled or interpreted mode once, when ``triton`` (and each ``@triton.jit``
function) is imported: ``TRITON_INTERPRET=1`` must be in the environment before the first
``import triton`` in the process. Tests that run kernels on CPU therefore set it at the top of
their module and, when some earlier import already loaded triton in compiled mode, rerun their
module in a fresh interpreter with :func:`run_in_fresh_interpreter`.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch


def interpreter_active() -> bool:
    """True when ``@triton.jit`` functions in this process run in the CPU interpreter."""
    import triton.language as tl

    return type(tl.max).__name__ == "InterpretedFunction"


def check_launchable(t: torch.Tensor) -> None:
    """Raise a clear error when a kernel is launched on CPU tensors without the interpreter."""
    if t.device.type != "cuda" and not interpreter_active():
        raise RuntimeError(
            "Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 set before triton is "
            f"first imported (got a tensor on {t.device})"
        )


def run_in_fresh_interpreter(test_file: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """Run one pytest file in a new Python process with ``TRITON_INTERPRET=1``."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file]
    return subprocess.run(
        cmd, check=False, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def dot_mode(kv: torch.Tensor) -> tuple[str, bool]:
    """``(input_precision, upcast)`` for the ``tl.dot`` calls of attention over ``kv``.

    fp32 caches get exact (``"ieee"``) dots rather than TF32. ``upcast`` asks the kernel to
    convert bf16 operands to fp32 before ``tl.dot`` off CUDA.
    """
    # NOTE: the interpreter's tl.dot multiplies bf16 values as raw uint16 bit patterns.
    precision = "ieee" if kv.dtype == torch.float32 else "tf32"
    return precision, kv.device.type != "cuda" and kv.dtype == torch.bfloat16
