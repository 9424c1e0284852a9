"""KV blocks in a directory: one file per block of tokens, keyed by the block's prefix hash chain.

A block's hash chains the hash of the block before it with the block's token ids, so a hash
names the whole prefix up to the block's end. The directory is ``root/<model key>``: the model
key covers the weights' identity, dtype, KV shape and block size, so one directory may hold the
blocks of several models without mixing them.

A file is a header (magic, model key, block hash, token count, payload size, CRC-32 of the ids
and payload), the tree key's ids (int64: salted keys exceed 32 bits) and the payload (K and V of
every layer, raw). A file whose header, ids or checksum disagree is never served: it is deleted
and logged (once per process). Writes run on one background thread and land through a
temporary file and a rename, so a crash never leaves half a block; the directory is trimmed to
its byte budget in LRU order (a read refreshes a block; after a restart the file times give
the order).
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import struct
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

MAGIC = b"RLMKV002"
PINS = "pinned"  # hex hashes, one per line: blocks the budget never removes
STALE_TMP_S = 600  # a temporary file this old belongs to no live writer
HEADER = struct.Struct("<8s16sqiqI")  # magic, model key, hash, tokens, payload bytes, crc32
SUFFIX = ".kv"


def block_hashes(ids: list[int], block: int) -> list[int]:
    """One hash per whole block of ``ids``, each chained to the one before it."""
    out, prev = [], b"\0" * 8
    arr = np.asarray(ids, dtype=np.int64)
    for start in range(0, len(ids) - block + 1, block):
        prev = hashlib.blake2b(prev + arr[start : start + block].tobytes(), digest_size=8).digest()
        out.append(int.from_bytes(prev, "little", signed=True))
    return out


def model_key(*parts: object) -> bytes:
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()


def _checksum(ids: bytes, payload) -> int:
    """CRC-32 of the ids and the payload: it catches flipped and missing bytes (the ids
    themselves are compared in full), at several GB/s."""
    return zlib.crc32(payload, zlib.crc32(ids))


@dataclass
class DiskStats:
    blocks_written: int = 0
    bytes_written: int = 0
    blocks_read: int = 0
    bytes_read: int = 0
    read_s: float = 0.0
    rejected: int = 0  # corrupt, truncated or foreign files skipped


class DiskStore:
    """Blocks of one model under ``root``, at most ``budget`` bytes."""

    def __init__(self, root: str, key: bytes, budget: int) -> None:
        self.dir = os.path.join(root, key.hex())
        os.makedirs(self.dir, exist_ok=True)
        self.key = key
        self.budget = budget
        self.stats = DiskStats()
        self._lock = threading.Lock()
        self._index: OrderedDict[int, int] = self._scan()  # hash -> file bytes, LRU first
        self._pinned: set[int] = self._read_pins()
        self._pending: set[int] = set()
        self._queue: queue.Queue = queue.Queue()
        self._warned = False
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk", daemon=True)
        self._writer.start()

    # -- queries -------------------------------------------------------------------------------

    def __contains__(self, h: int) -> bool:
        with self._lock:
            return h in self._index or h in self._pending

    @property
    def bytes_used(self) -> int:
        with self._lock:
            return sum(self._index.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    # -- reading -------------------------------------------------------------------------------

    def get(self, h: int, ids: list[int]) -> memoryview | None:
        """The payload of block ``h`` if its file holds exactly ``ids`` (a writable view, read
        without copies); else None."""
        with self._lock:
            if h not in self._index:
                return None
            self._index.move_to_end(h)
        start = time.perf_counter()
        path = self._path(h)
        try:
            with open(path, "rb") as f:
                data = bytearray(os.fstat(f.fileno()).st_size)
                f.readinto(data)
            os.utime(path)
        except OSError:
            return self._reject(h, "unreadable")
        payload = self._check(data, h, np.asarray(ids, dtype=np.int64).tobytes())
        if payload is None:
            return self._reject(h, "corrupt, truncated or foreign")
        self.stats.blocks_read += 1
        self.stats.bytes_read += len(data)
        self.stats.read_s += time.perf_counter() - start
        return payload

    def _check(self, data: bytearray, h: int, ids: bytes) -> memoryview | None:
        if len(data) < HEADER.size:
            return None
        magic, key, got_h, n, size, checksum = HEADER.unpack_from(data)
        body = memoryview(data)[HEADER.size :]
        if (magic, key, got_h, n * 8 + size) != (MAGIC, self.key, h, len(body)):
            return None
        payload = body[n * 8 :]
        if body[: n * 8] != ids or _checksum(ids, payload) != checksum:
            return None
        return payload

    def _reject(self, h: int, why: str) -> None:
        self.stats.rejected += 1
        if not self._warned:
            logger.warning("KV disk cache: skipping a %s block file (%s)", why, self._path(h))
            self._warned = True
        with self._lock:
            self._index.pop(h, None)
        try:
            os.unlink(self._path(h))
        except OSError:
            pass
        return None

    # -- writing -------------------------------------------------------------------------------

    def put(self, h: int, ids: list[int], payload: bytes) -> None:
        """Write block ``h`` in the background (nothing happens if it is already stored)."""
        with self._lock:
            if h in self._index or h in self._pending:
                return
            self._pending.add(h)
        self._queue.put((h, np.asarray(ids, dtype=np.int64).tobytes(), payload))

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            except OSError as e:
                logger.warning("KV disk cache: a block could not be written: %s", e)
                with self._lock:
                    self._pending.discard(item[0])
            finally:
                self._queue.task_done()

    def _write(self, h: int, ids: bytes, payload: bytes) -> None:
        header = HEADER.pack(MAGIC, self.key, h, len(ids) // 8, len(payload),
                             _checksum(ids, payload))  # fmt: skip
        path = self._path(h)
        tmp = f"{path}.{os.getpid()}.tmp"  # NOTE: one writer thread per process
        with open(tmp, "wb") as f:
            f.write(header + ids + payload)
        os.replace(tmp, path)
        size = len(header) + len(ids) + len(payload)
        with self._lock:
            self._pending.discard(h)
            self._index[h] = size
        self.stats.blocks_written += 1
        self.stats.bytes_written += size
        self._trim()

    def _trim(self) -> None:
        with self._lock:
            excess = sum(self._index.values()) - self.budget
            victims = []
            for h, size in self._index.items():  # NOTE: least recently used first
                if excess <= 0:
                    break
                if h not in self._pinned:
                    victims.append(h)
                    excess -= size
            for h in victims:
                del self._index[h]
        for h in victims:
            try:
                os.unlink(self._path(h))
            except OSError:
                pass

    # -- pins ------------------------------------------------------------------------------------

    def pin(self, hashes: list[int]) -> None:
        """Exempt stored blocks from the budget, across restarts, until ``clear``."""
        with self._lock:
            self._pinned.update(h for h in hashes if h in self._index)
            pins = sorted(self._pinned)
        tmp = os.path.join(self.dir, f"{PINS}.tmp")
        with open(tmp, "w") as f:
            f.writelines(f"{h & 0xFFFFFFFFFFFFFFFF:016x}\n" for h in pins)
        os.replace(tmp, os.path.join(self.dir, PINS))

    def _read_pins(self) -> set[int]:
        try:
            with open(os.path.join(self.dir, PINS)) as f:
                return {_signed(int(line, 16)) for line in f if line.strip()}
        except (OSError, ValueError):
            return set()

    # -- lifecycle -----------------------------------------------------------------------------

    def flush(self) -> None:
        """Wait until every queued block is on disk."""
        self._queue.join()

    def clear(self) -> None:
        """Delete every block of this model."""
        self.flush()
        with self._lock:
            hashes, self._index, self._pinned = list(self._index), OrderedDict(), set()
        for path in [*map(self._path, hashes), os.path.join(self.dir, PINS)]:
            try:
                os.unlink(path)
            except OSError:
                pass

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._writer.join(timeout=5)

    def _path(self, h: int) -> str:
        return os.path.join(self.dir, f"{h & 0xFFFFFFFFFFFFFFFF:016x}{SUFFIX}")

    def _scan(self) -> OrderedDict[int, int]:
        found = []
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".tmp"):
                if time.time() - entry.stat().st_mtime > STALE_TMP_S:
                    os.unlink(entry.path)  # NOTE: a write a stopped process did not finish
            elif entry.name.endswith(SUFFIX):
                stat = entry.stat()
                h = _signed(int(entry.name.removesuffix(SUFFIX), 16))
                found.append((stat.st_mtime, h, stat.st_size))
        return OrderedDict((h, size) for _, h, size in sorted(found))


def _signed(h: int) -> int:
    """A file name's 64-bit hash as the signed value ``block_hashes`` gives."""
    return h - (1 << 64) if h >= 1 << 63 else h
