"""Handing freed memory back to the OS.

glibc keeps what a process frees on its heaps for later allocations and returns little of it
on its own; a loader's temporaries, or a compiler's, would stay resident for the process's life.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc


def trim_heap(collect: bool = False) -> None:
    """Hand the memory freed on glibc's heaps back to the OS (after a garbage collection when
    ``collect``). A no-op where the C library is not glibc."""
    if collect:
        gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
