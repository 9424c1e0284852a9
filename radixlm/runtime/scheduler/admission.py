"""Choosing the next batch: every running decode, then prefill chunks within a token budget.

There is no prefill/decode split in the data: each request is owed ``remaining`` tokens, and a
step hands out tokens. A decode is a request owed one token; chunked prefill and prefix hits
follow from ``kv_len``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixlm.runtime.mem_cache.cache_manager import CacheManager
from radixlm.runtime.mem_cache.radix_cache import RadixCache
from radixlm.runtime.scheduler.req import Req

# NOTE: a waiting request whose uncached prefix shares at least this many tokens with a request
# admitted in the same step waits one step, then hits the cache instead of recomputing.
IN_BATCH_PREFIX_THRESHOLD = 32
# NOTE: lower for prompt-logprob requests (lm-eval's choices of one question): their shared
# tokens also cost LM-head rows, and a step's wait matters little to a batch evaluation
# (40 questions x 4 choices, 5-shot, 2 cores: 11.7 s at 8 tokens vs 13.9 s at 32)
IN_BATCH_PREFIX_THRESHOLD_LOGPROBS = 8


@dataclass
class Chunk:
    req: Req
    num_tokens: int
    slots: torch.Tensor  # one per token of the chunk, then one per draft token
    draft: list[int] = field(default_factory=list)  # speculative tokens after a decode

    @property
    def width(self) -> int:
        return self.num_tokens + len(self.draft)


@dataclass
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)
    admitted: list[Req] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.width for c in self.chunks)


@dataclass
class Budget:
    prefill_tokens: int
    chunk_size: int | None
    max_running: int


def plan_decodes(running: list[Req], cache: CacheManager, plan: StepPlan) -> list[Req]:
    """One token for every request owed exactly one; returns requests that got no memory."""
    decodes = [r for r in running if r.remaining == 1]
    if not decodes:
        return []
    slots = cache.alloc(len(decodes))
    if slots is None:
        return decodes
    plan.chunks.extend(Chunk(r, 1, slots[i : i + 1]) for i, r in enumerate(decodes))
    return []


def plan_prefills(
    running: list[Req],
    ordered_waiting: list[Req],
    cache: CacheManager,
    budget: Budget,
    plan: StepPlan,
) -> None:
    """Continue chunked prefills, then admit waiting requests while the budget lasts."""
    left = budget.prefill_tokens
    for req in running:
        if req.is_prefilling and left > 0:
            left = _add_chunk(req, left, budget, cache, plan)
            if left < 0:
                return
    num_running = len(running)
    batch_tree = RadixCache()
    for req in ordered_waiting:
        if left <= 0 or num_running >= budget.max_running:
            return
        if _shares_new_prefix(req, cache, batch_tree):
            continue
        if not cache.admit(req):
            return
        plan.admitted.append(req)
        num_running += 1
        left = _add_chunk(req, left, budget, cache, plan)
        if left < 0:
            return
        key = req.cache_key(req.seq_len)
        batch_tree.insert(key, torch.zeros(len(key), dtype=torch.int64))


def _add_chunk(req: Req, left: int, budget: Budget, cache: CacheManager, plan: StepPlan) -> int:
    """Plan the next chunk of ``req``; returns the budget left, or -1 when memory ran out."""
    n = min(req.remaining, left, budget.chunk_size or req.remaining)
    slots = cache.alloc(n)
    if slots is None:
        return -1
    plan.chunks.append(Chunk(req, n, slots))
    return left - n


def _shares_new_prefix(req: Req, cache: CacheManager, batch_tree: RadixCache) -> bool:
    if cache.tree is None or batch_tree.total_size() == 0:
        return False
    cached = cache.match_len(req)
    in_batch = len(batch_tree.match_prefix(req.cache_key(req.max_match_len)).slots)
    threshold = (
        IN_BATCH_PREFIX_THRESHOLD_LOGPROBS if req.wants_prompt_logprobs
        else IN_BATCH_PREFIX_THRESHOLD
    )  # fmt: skip
    return in_batch - cached >= threshold
