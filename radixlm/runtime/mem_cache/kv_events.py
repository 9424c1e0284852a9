"""KV-cache events in vLLM's format, so that KV-aware routers (llm-d's prefix scorer, ...) can
follow what the radix tree holds.

The tree reports paths, not blocks; here a path is cut into blocks of ``block_size`` tokens
from its start, and only whole blocks are reported. A block's hash chains its parent's:
``blake2b(parent hash as 8 bytes big-endian, or nothing at the root; then each token id as 4
bytes little-endian)``, the first 8 bytes as a signed big-endian int64. A block is stored when
an insert makes the path reach its end, removed when an eviction cuts the path before its end,
and every block is cleared by a flush; a new tree (a scheduler that starts) begins with a clear,
so that routers forget what an earlier process held.

Wire format (vLLM's ``ZmqEventPublisher``): a ZMQ PUB socket sends multipart messages
``[topic, sequence number as 8 bytes big-endian, payload]``; the payload is a msgpack
``KVEventBatch`` ``[ts, [event, ...]]`` of tagged arrays: ``["BlockStored", block_hashes,
parent_block_hash, token_ids, block_size, lora_id, medium]``, ``["BlockRemoved", block_hashes,
medium]``, ``["AllBlocksCleared"]``.
"""

from __future__ import annotations

import hashlib
import struct
import time
from typing import Union

import msgspec
import zmq

TOPIC = b"kv-events"


class BlockStored(msgspec.Struct, array_like=True, tag=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


class BlockRemoved(msgspec.Struct, array_like=True, tag=True):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, array_like=True, tag=True):
    pass


KVEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]  # noqa: UP007


class KVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[KVEvent]


def block_hash(parent: int | None, tokens: list[int]) -> int:
    h = hashlib.blake2b(digest_size=8)
    if parent is not None:
        h.update(struct.pack(">q", parent))
    h.update(struct.pack(f"<{len(tokens)}i", *tokens))
    return struct.unpack(">q", h.digest())[0]


def block_hashes(path: list[int], block_size: int) -> list[int]:
    """The chained hashes of the whole blocks of ``path``."""
    out: list[int] = []
    for start in range(0, len(path) - block_size + 1, block_size):
        out.append(block_hash(out[-1] if out else None, path[start : start + block_size]))
    return out


class KVEventPublisher:
    """Collects the radix tree's changes as events and publishes them once per step."""

    def __init__(self, endpoint: str, block_size: int) -> None:
        self.block_size = block_size
        self.pending: list[KVEvent] = []
        self._seq = 0
        self._ctx = zmq.Context.instance()
        self._socket = self._ctx.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint)
        self._encoder = msgspec.msgpack.Encoder()

    # -- what the radix tree reports -------------------------------------------------------------

    def stored(self, path: list[int], present: int) -> None:
        """The tree now holds ``path``; its first ``present`` tokens were there before."""
        b = self.block_size
        hashes = block_hashes(path, b)
        first = present // b  # NOTE: the block ``present`` falls inside was not whole before
        if first < len(hashes):
            self.pending.append(BlockStored(
                hashes[first:], hashes[first - 1] if first else None,
                path[first * b : len(hashes) * b], b,
            ))  # fmt: skip

    def removed(self, path: list[int], kept: int) -> None:
        """The tree cut ``path`` back to its first ``kept`` tokens."""
        hashes = block_hashes(path, self.block_size)
        gone = hashes[kept // self.block_size :]
        if gone:
            self.pending.append(BlockRemoved(gone))

    def cleared(self) -> None:
        self.pending.append(AllBlocksCleared())

    # -- publishing ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Send what changed since the last flush as one batch (nothing when nothing did)."""
        if not self.pending:
            return
        payload = self._encoder.encode(KVEventBatch(time.time(), self.pending))
        self.pending = []
        self._socket.send_multipart([TOPIC, self._seq.to_bytes(8, "big"), payload])
        self._seq += 1

    def close(self) -> None:
        self._socket.close(0)
