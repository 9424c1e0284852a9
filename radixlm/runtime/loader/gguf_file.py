"""A GGUF file's metadata and tensor table, read in milliseconds.

``gguf.GGUFReader`` builds a numpy view for every part of every field, including the ~100,000
strings of a tokenizer's vocabulary and merges: 2-4 s and ~130 MB for SmolLM2, paid by every
process that only wants the config. Here scalars are read at once, arrays are skipped over and
decoded only when asked for, and tensors are numpy views of a memory map, shaped as
``GGUFReader`` shapes them (so that ``gguf.quants.dequantize`` takes them as they are).
"""

from __future__ import annotations

import contextlib
import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

_MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
_PLAIN = {
    GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}  # fmt: skip


class Field:
    """One metadata value: a scalar or string, or an array decoded on first ``contents()``."""

    def __init__(self, file: GGUFFile, kind: int, offset: int, count: int = 1) -> None:
        self._file, self.kind, self._offset, self.count = file, kind, offset, count
        self._value: Any = None
        self._read = False

    def contents(self) -> Any:
        if not self._read:
            self._value, self._read = self._file._value(self.kind, self._offset)[0], True
        return self._value


@dataclass(frozen=True)
class Tensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # GGUF's order (innermost first)
    n_elements: int
    data: np.ndarray
    offset: int = 0  # of ``data`` in the file


class GGUFFile:
    """``fields`` (key -> Field) and ``tensors`` (in file order) of one GGUF file."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if self._buf[:4] != _MAGIC:
            raise ValueError(f"{path!r} is not a GGUF file")
        version, n_tensors, n_fields = struct.unpack_from("<IQQ", self._buf, 4)
        if version < 2:
            raise ValueError(f"{path!r}: GGUF version {version} is not supported")
        pos = 24
        self.fields: dict[str, Field] = {}
        for _ in range(n_fields):
            key, pos = self._string(pos)
            (kind,) = struct.unpack_from("<I", self._buf, pos)
            start = pos + 4
            count = struct.unpack_from("<Q", self._buf, start + 4)[0] if kind == _ARRAY else 1
            self.fields[key] = Field(self, kind, start, count)
            pos = self._skip(kind, start)
        infos = []
        for _ in range(n_tensors):
            name, pos = self._string(pos)
            (n_dims,) = struct.unpack_from("<I", self._buf, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", self._buf, pos + 4)
            kind, offset = struct.unpack_from("<IQ", self._buf, pos + 4 + 8 * n_dims)
            infos.append((name, dims, GGMLQuantizationType(kind), offset))
            pos += 4 + 8 * n_dims + 12
        alignment = self.fields["general.alignment"].contents() if (
            "general.alignment" in self.fields) else 32  # fmt: skip
        start = pos + (-pos) % alignment
        data = np.frombuffer(self._buf, dtype=np.uint8)
        self.tensors = [self._tensor(data, start, *info) for info in infos]

    def release(self, tensor: Tensor) -> None:
        """Drop ``tensor``'s pages of the file from this process's resident memory (a loader
        reads each tensor once; the OS page cache still holds them)."""
        begin = tensor.offset - tensor.offset % mmap.PAGESIZE
        with contextlib.suppress(AttributeError, OSError):  # NOTE: no madvise here
            self._buf.madvise(mmap.MADV_DONTNEED, begin, tensor.offset + tensor.data.nbytes - begin)

    @staticmethod
    def _tensor(data, start: int, name: str, dims, kind, offset: int) -> Tensor:
        n = int(np.prod(dims))
        shape = tuple(reversed(dims))
        item = _PLAIN.get(kind)
        if item is None:
            block, size = GGML_QUANT_SIZES[kind]
            count, item, shape = n * size // block, np.uint8, quant_shape_to_byte_shape(shape, kind)
        else:
            count = n
        begin = start + offset
        view = data[begin : begin + count * np.dtype(item).itemsize].view(item).reshape(shape)
        return Tensor(name, kind, np.array(dims, dtype=np.uint64), n, view, begin)

    def _string(self, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self._buf, pos)
        return self._buf[pos + 8 : pos + 8 + n].decode("utf-8"), pos + 8 + n

    def _skip(self, kind: int, pos: int) -> int:
        """The offset after a value of ``kind`` at ``pos``, reading no more than lengths."""
        if kind in _SCALARS:
            return pos + struct.calcsize(_SCALARS[kind])
        if kind == _STRING:
            return pos + 8 + struct.unpack_from("<Q", self._buf, pos)[0]
        if kind != _ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        elem, count = struct.unpack_from("<IQ", self._buf, pos)
        pos += 12
        if elem in _SCALARS:
            return pos + count * struct.calcsize(_SCALARS[elem])
        for _ in range(count):
            pos = self._skip(elem, pos)
        return pos

    def _value(self, kind: int, pos: int) -> tuple[Any, int]:
        if kind in _SCALARS:
            return struct.unpack_from(_SCALARS[kind], self._buf, pos)[0], self._skip(kind, pos)
        if kind == _STRING:
            return self._string(pos)
        elem, count = struct.unpack_from("<IQ", self._buf, pos)
        pos += 12
        out = []
        for _ in range(count):
            value, pos = self._value(elem, pos)
            out.append(value)
        return out, pos
