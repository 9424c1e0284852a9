"""Connects requests to the KV memory: request slots, slot allocation, the radix tree.

NOTE: every KV slot is in exactly one place: the allocator's free list, the radix tree
(evictable or protected), or owned by a running request beyond its ``tree_len``. When no request
runs, ``free + evictable + protected == total``.
"""

from __future__ import annotations

import torch

from radixlm.runtime.mem_cache.disk_tier import DiskTier
from radixlm.runtime.mem_cache.logprob_store import PromptLogprobStore
from radixlm.runtime.mem_cache.memory_pool import ReqToTokenPool, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import RadixCache, TreeNode
from radixlm.runtime.scheduler.req import Req


class CacheManager:
    def __init__(
        self,
        req_pool: ReqToTokenPool,
        allocator: SlotAllocator,
        tree: RadixCache | None,
        disk: DiskTier | None = None,
        logprobs: PromptLogprobStore | None = None,
    ) -> None:
        self.req_pool = req_pool
        self.allocator = allocator
        self.tree = tree  # None: radix cache disabled
        self.disk = disk if tree is not None else None  # the tier below the tree
        self.logprobs = logprobs if tree is not None else None  # prompt logprobs beside the KV
        self.hit_tokens = 0
        self.queried_tokens = 0

    # -- admission -------------------------------------------------------------------------

    def match_len(self, req: Req) -> int:
        """Length of the cached prefix a request would reuse (no locking)."""
        if self.tree is None:
            return 0
        return self.logprob_cap(req, self.tree.match_prefix(req.cache_key(req.max_match_len)).slots)

    def logprob_cap(self, req: Req, slots: torch.Tensor) -> int:
        """How much of the match ``slots`` a request may reuse: all of it, unless it wants
        prompt logprobs. Those need the logits of the position before each token, so the match
        ends one token before the first whose logprob is not stored with its KV."""
        if not req.wants_prompt_logprobs:
            return len(slots)
        first = max(req.logprob.start_len, 1)
        if self.logprobs is not None:
            first = max(first, self.logprobs.covered(slots, first, req.logprob.top_n))
        return min(len(slots), first - 1)

    def admit(self, req: Req) -> bool:
        """Give ``req`` a request slot and its cached prefix. False when no slot is free."""
        slot = self.req_pool.alloc()
        if slot is None:
            return False
        req.slot, req.kv_len, req.tree_len, req.node = slot, 0, 0, None
        if self.tree is not None:
            key = req.cache_key(req.max_match_len)
            slots, node = self.tree.match_prefix(key)
            if self.disk is not None:
                slots, node = self._restore(key, slots, node)
            if req.wants_prompt_logprobs:
                slots, node = self._reuse_logprobs(req, key, slots, node)
            self.tree.lock(node)
            req.node, req.kv_len, req.tree_len = node, len(slots), len(slots)
            self.req_pool.table[slot, : len(slots)] = slots.to(self.req_pool.table.device)
        if req.retractions == 0:
            req.cached_len = req.kv_len
            self.hit_tokens += req.kv_len
            self.queried_tokens += len(req.input_ids)
        return True

    def _reuse_logprobs(
        self, req: Req, key: list[int], slots: torch.Tensor, node: TreeNode
    ) -> tuple[torch.Tensor, TreeNode]:
        """Cut the match ``(slots, node)`` to ``logprob_cap`` and fill ``req``'s prompt
        logprobs from the store as far as it holds them."""
        cap = self.logprob_cap(req, slots)
        lp = req.logprob
        first = max(lp.start_len, 1)
        if self.logprobs is not None and cap + 1 > first:  # NOTE: tokens first..cap are stored
            got = self.logprobs.get(slots[first : cap + 1], lp.top_n)
            for pos, entry in enumerate(got, start=first):
                lp.prompt[pos - 1] = entry
        if cap < len(slots) and self.logprobs is not None:
            self.logprobs.count_top_n_miss(slots, cap + 1, lp.top_n)
        if cap == len(slots):
            return slots, node
        return self.tree.match_prefix(key[:cap])

    def _restore(
        self, key: list[int], slots: torch.Tensor, node: TreeNode
    ) -> tuple[torch.Tensor, TreeNode]:
        """Extend the tree's match ``(slots, node)`` of ``key`` with the blocks the disk tier
        holds; returns the match afterwards."""
        self.tree.lock(node)  # NOTE: the eviction that makes room must not take this prefix
        try:
            got = self.disk.restore(key, len(slots), self.alloc, self.allocator.free)
        finally:
            self.tree.unlock(node)
        if got is None:
            return slots, node
        end = got.start + len(got.slots)
        present = self.tree.insert(key[:end], torch.cat([slots, got.slots]))
        if present > got.start:  # NOTE: cannot happen on one thread; keeps the invariant anyway
            self.allocator.free(got.slots[: present - got.start])
        return self.tree.match_prefix(key)

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` free KV slots, evicting unlocked cache entries if needed; None if impossible."""
        if n > self.allocator.available and self.tree is not None:
            self.allocator.free(self.tree.evict(n - self.allocator.available))
        slots = self.allocator.alloc(n)
        if slots is not None and self.logprobs is not None:
            self.logprobs.clear(slots)
        return slots

    def _keep_prompt_logprobs(self, req: Req) -> None:
        """Store the prompt logprobs ``req`` computed beside their tokens' KV, in the tree's
        slots (``cache_prefix`` has just put them in the request's row: where another request
        inserted the same tokens first, ours were duplicates and are gone)."""
        lp = req.logprob
        if self.logprobs is None or not lp.fresh:
            return
        positions = sorted(q for q in set(lp.fresh) if q + 1 < req.tree_len)
        lp.fresh = [q for q in lp.fresh if q + 1 >= req.tree_len]
        if not positions:
            return
        slots = self.req_pool.table[req.slot, [q + 1 for q in positions]].cpu()
        entries = [lp.prompt[q] for q in positions]
        tops = [top for _, top in entries]
        self.logprobs.put(slots, [v for v, _ in entries], None if None in tops else tops)

    def assign(self, req: Req, slots: torch.Tensor) -> None:
        """Record newly allocated slots for the next ``len(slots)`` positions of ``req``."""
        n = len(slots)
        self.req_pool.table[req.slot, req.kv_len : req.kv_len + n] = slots.to(
            self.req_pool.table.device
        )

    # -- after compute -----------------------------------------------------------------------

    def cache_prefix(self, req: Req) -> None:
        """Move what ``req`` computed into the tree (re-locking), keeping the request running."""
        if self.tree is None or req.kv_len <= req.tree_len:
            return
        row = self.req_pool.table[req.slot]
        key = req.cache_key(req.kv_len)
        present = self.tree.insert(key, row[: req.kv_len].cpu())
        if self.disk is not None:
            self.disk.save(key, row[: req.kv_len])
        if present > req.tree_len:  # another request inserted these first: ours are duplicates
            self.allocator.free(row[req.tree_len : present].cpu())
        slots, node = self.tree.match_prefix(key)
        row[: len(slots)] = slots.to(row.device)
        self.tree.lock(node)
        self.tree.unlock(req.node)
        req.node, req.tree_len = node, len(slots)
        if req.wants_prompt_logprobs:
            self._keep_prompt_logprobs(req)

    def release(self, req: Req) -> None:
        """Finish, abort or retract: cache what was computed, free the rest and the slot."""
        if req.slot is None:
            return
        self.cache_prefix(req)
        row = self.req_pool.table[req.slot]
        self.allocator.free(row[req.tree_len : req.kv_len].cpu())
        if self.tree is not None:
            self.tree.unlock(req.node)
        self.req_pool.free(req.slot)
        req.slot, req.node, req.tree_len = None, None, 0

    # -- accounting ----------------------------------------------------------------------------

    @property
    def evictable(self) -> int:
        return self.tree.evictable_size if self.tree is not None else 0

    @property
    def protected(self) -> int:
        return self.tree.protected_size if self.tree is not None else 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def check_idle(self) -> None:
        """Raise RuntimeError unless every slot is free or held by the tree."""
        if self.tree is not None:
            self.tree.check()
        total = self.allocator.available + self.evictable + self.protected
        if total != self.allocator.size or self.protected != 0:
            raise RuntimeError(
                f"KV leak: free {self.allocator.available} + evictable {self.evictable} + "
                f"protected {self.protected} != total {self.allocator.size}"
            )

    def flush(self) -> None:
        """Drop every cached prefix (only when no request runs)."""
        if self.tree is not None:
            self.allocator.free(self.tree.all_slots())
            self.tree.reset()
