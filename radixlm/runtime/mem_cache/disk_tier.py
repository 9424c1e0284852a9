"""The disk tier under the radix tree: write-through of whole blocks, restore past a tree match.

Every whole block of a prefix the tree caches is written to the ``DiskStore`` (once; the
write itself runs on the store's thread), so blocks outlive both eviction and the process. When
a prompt's match in the tree ends, the blocks that follow on disk are read into fresh KV slots
and inserted into the tree, and the request reuses them as any cached prefix. Blocks start at
multiples of ``block`` tokens from the prompt's start; a match ending inside a block reuses
that block's tail. A load is skipped when computing the tokens again has been faster
(``Costs``: a GPU's prefill can beat a slow disk; on a CPU loading wins by far). With tensor
parallelism every rank has a tier of its own shard, and rank 0's tier has ``peers``
(``distributed/disk_sync.py``) that repeat its saves, loads, pins and clears on the others.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch

from radixlm.runtime.config import ServerArgs, parse_size
from radixlm.runtime.mem_cache.disk_store import DiskStore, block_hashes, model_key
from radixlm.runtime.mem_cache.memory_pool import KVPool

logger = logging.getLogger(__name__)


@dataclass
class Restored:
    slots: torch.Tensor  # KV slots now holding positions [start, start + len(slots))
    start: int


class DiskTier:
    def __init__(self, store: DiskStore, pool: KVPool, block: int) -> None:
        self.store = store
        self.pool = pool
        self.block = block
        self.hit_tokens = 0
        self.load_s = 0.0
        self.costs = Costs()
        self.peers = None  # rank 0 with tensor parallelism: the other ranks' tiers

    @classmethod
    def open(
        cls, args: ServerArgs, model_path: str, pool: KVPool, tp_rank: int = 0
    ) -> DiskTier:
        """The tier of ``--kv-disk-cache``: blocks keyed by the weights' identity (path, size,
        modification time), the KV dtype and shape, the quantization and the block size, and
        with tensor parallelism the rank (each holds a share of the budget)."""
        stat = os.stat(model_path)
        parts = [
            os.path.realpath(model_path), stat.st_size, stat.st_mtime_ns, str(pool.dtype),
            len(pool.k), tuple(pool.k[0].shape[1:]), args.quantization, args.kv_disk_block_size,
        ]  # fmt: skip
        if args.tp_size > 1:
            parts.append(("tp", tp_rank, args.tp_size))
        budget = parse_size("kv_disk_cache_size", args.kv_disk_cache_size) // args.tp_size
        store = DiskStore(args.kv_disk_cache, model_key(*parts), budget)
        logger.info("KV disk cache: %d blocks (%d bytes) in %s", len(store), store.bytes_used,
                    store.dir)  # fmt: skip
        return cls(store, pool, args.kv_disk_block_size)

    def save(self, ids: list[int], slots: torch.Tensor) -> None:
        """Queue every whole block of ``ids`` (KV at ``slots``) that is not stored yet."""
        b = self.block
        missing = [(i, h) for i, h in enumerate(block_hashes(ids, b)) if h not in self.store]
        if not missing:
            return
        spans = torch.cat([slots[i * b : (i + 1) * b] for i, _ in missing])
        kv = self._gather(spans)  # NOTE: one gather per layer for all new blocks
        for j, (i, h) in enumerate(missing):
            payload = kv[:, :, j * b : (j + 1) * b].contiguous()
            self.store.put(h, ids[i * b : (i + 1) * b], payload.view(torch.uint8).numpy().tobytes())
        if self.peers is not None:
            self.peers.save(ids, slots)

    def pin(self, key: list[int]) -> int:
        """Keep the stored blocks of ``key`` out of the LRU budget (until a flush); returns
        the tokens they cover (the leading run of whole blocks that are stored)."""
        self.store.flush()
        hashes = block_hashes(key, self.block)
        stored = next((i for i, h in enumerate(hashes) if h not in self.store), len(hashes))
        self.store.pin(hashes[:stored])
        if self.peers is not None:
            self.peers.pin(key)
        return stored * self.block

    def clear(self) -> None:
        self.store.clear()
        if self.peers is not None:
            self.peers.clear()

    def restore(self, ids: list[int], matched: int, alloc, free) -> Restored | None:
        """Load the stored blocks of ``ids`` that follow its first ``matched`` tokens into
        slots from ``alloc(n)`` (``free`` takes back what other ranks could not load); None
        when the disk has none (or no slots are free)."""
        first = matched // self.block
        if first >= len(ids) // self.block:
            return None  # NOTE: the match covers every whole block: nothing to hash or read
        start_time = time.perf_counter()
        hashes = block_hashes(ids, self.block)
        stored = next((i for i in range(first, len(hashes)) if hashes[i] not in self.store),
                      len(hashes))  # fmt: skip
        if stored * self.block <= matched or not self.costs.worth_loading(
            stored * self.block - matched
        ):
            return None
        payloads = self._read(ids, hashes, first, stored)
        end = (first + len(payloads)) * self.block
        if end <= matched:
            return None
        slots = alloc(end - matched)
        if slots is None:
            return None
        self._write(payloads, first * self.block, matched, slots)
        if self.peers is not None:
            agreed = self.peers.load(ids[:end], matched, slots, end)
            if agreed < end:
                free(slots[max(agreed - matched, 0) :].cpu())
                slots = slots[: max(agreed - matched, 0)]
                if not len(slots):
                    return None
        self.hit_tokens += len(slots)
        spent = time.perf_counter() - start_time
        self.load_s += spent
        self.costs.loaded(len(slots), spent)
        return Restored(slots, matched)

    def load_into(self, ids: list[int], matched: int, slots: torch.Tensor) -> int:
        """Another rank's half of rank 0's ``restore``: load the blocks of ``ids`` past
        ``matched`` into ``slots``, as far as they are stored; returns the position reached."""
        first = matched // self.block
        hashes = block_hashes(ids, self.block)
        payloads = self._read(ids, hashes, first, (matched + len(slots)) // self.block)
        end = (first + len(payloads)) * self.block
        if end > matched:
            self._write(payloads, first * self.block, matched, slots[: end - matched])
        return max(end, matched)

    def _read(self, ids: list[int], hashes: list[int], first: int, last: int) -> list:
        """The payloads of blocks ``first``.. up to ``last`` (exclusive), stopping at the first
        one the store cannot serve."""
        payloads = []
        for i in range(first, last):
            payload = self.store.get(hashes[i], ids[i * self.block : (i + 1) * self.block])
            if payload is None:
                break
            payloads.append(payload)
        return payloads

    def _write(self, payloads: list, start: int, matched: int, slots: torch.Tensor) -> None:
        """Write the positions ``matched``.. of blocks that start at ``start`` into ``slots``."""
        kv = torch.cat([self._tensor(p) for p in payloads], dim=2)
        kv = kv[:, :, matched - start : matched - start + len(slots)]
        at = slots.to(kv.device)
        for layer in range(len(self.pool.k)):
            self.pool.write(layer, at, kv[0, layer], kv[1, layer])

    def _gather(self, slots: torch.Tensor) -> torch.Tensor:
        """``[2, layers, len(slots), kv_heads, head_dim]`` on the CPU."""
        slots = slots.to(self.pool.k[0].device)
        k = torch.stack([layer[slots] for layer in self.pool.k])
        v = torch.stack([layer[slots] for layer in self.pool.v])
        return torch.stack([k, v]).cpu()

    def _tensor(self, payload: memoryview) -> torch.Tensor:
        """``[2, layers, block, kv_heads, head_dim]`` on the pool's device."""
        layers, (_, heads, dim) = len(self.pool.k), self.pool.k[0].shape
        flat = torch.frombuffer(payload, dtype=torch.uint8).view(self.pool.dtype)
        return flat.view(2, layers, self.block, heads, dim).to(self.pool.k[0].device)

    def stats(self) -> dict[str, float | int]:
        s = self.store.stats
        return {
            "disk_hit_tokens": self.hit_tokens,
            "disk_load_s": self.load_s,
            "disk_blocks": len(self.store),
            "disk_bytes": self.store.bytes_used,
            "disk_bytes_read": s.bytes_read,
            "disk_bytes_written": s.bytes_written,
            "disk_rejected_blocks": s.rejected,
            "disk_skipped_tokens": self.costs.skipped_tokens,
        }


class Costs:
    """Whether loading a prefix from disk beats computing it again, from measured speeds: the
    seconds per token of past loads and of past prefill steps (moving averages). Until both
    are known, load. Every ``PROBE_EVERY``-th skipped load is made anyway, so the load
    speed stays current."""

    SMOOTHING = 0.2
    MIN_PREFILL_TOKENS = 64  # NOTE: smaller steps measure the step's overhead, not prefill
    PROBE_EVERY = 16

    def __init__(self) -> None:
        self.load_s_per_token: float | None = None
        self.prefill_s_per_token: float | None = None
        self.skipped_tokens = 0
        self._skips = 0

    def loaded(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self.load_s_per_token = self._average(self.load_s_per_token, seconds / tokens)

    def prefilled(self, tokens: int, seconds: float) -> None:
        if tokens >= self.MIN_PREFILL_TOKENS:
            self.prefill_s_per_token = self._average(self.prefill_s_per_token, seconds / tokens)

    def worth_loading(self, tokens: int) -> bool:
        load, prefill = self.load_s_per_token, self.prefill_s_per_token
        if load is None or prefill is None or load < prefill:
            return True
        self._skips += 1
        if self._skips % self.PROBE_EVERY == 0:
            return True
        self.skipped_tokens += tokens
        return False

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.SMOOTHING * (new - old)
