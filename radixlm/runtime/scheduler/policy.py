"""Orderings of the waiting queue. Each policy returns the queue in admission order."""

from __future__ import annotations

import random
from collections.abc import Callable

from radixlm.runtime.mem_cache.cache_manager import CacheManager
from radixlm.runtime.scheduler.req import Req

Policy = Callable[[list[Req], CacheManager], list[Req]]
POLICIES: dict[str, Policy] = {}

# NOTE: matching every waiting request against the tree costs O(queue x prompt); beyond this
# length lpm and dfs-weight fall back to first-come first-served.
LPM_QUEUE_LIMIT = 128


def register_policy(name: str) -> Callable[[Policy], Policy]:
    def wrap(fn: Policy) -> Policy:
        POLICIES[name] = fn
        return fn

    return wrap


def get_policy(name: str) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"schedule_policy must be one of {sorted(POLICIES)}, got {name!r}")
    return POLICIES[name]


@register_policy("fcfs")
def fcfs(queue: list[Req], cache: CacheManager) -> list[Req]:
    return sorted(queue, key=lambda r: r.created)


@register_policy("priority")
def by_priority(queue: list[Req], cache: CacheManager) -> list[Req]:
    """vLLM's: the lowest ``priority`` first, then the earliest (``Scheduler`` also retracts a
    running request for a waiting one of a lower value)."""
    return sorted(queue, key=lambda r: (r.priority, r.created))


@register_policy("lof")
def longest_output_first(queue: list[Req], cache: CacheManager) -> list[Req]:
    return sorted(queue, key=lambda r: -r.params.max_new_tokens)


@register_policy("random")
def random_order(queue: list[Req], cache: CacheManager) -> list[Req]:
    out = list(queue)
    random.shuffle(out)
    return out


@register_policy("lpm")
def longest_prefix_match(queue: list[Req], cache: CacheManager) -> list[Req]:
    if cache.tree is None or len(queue) > LPM_QUEUE_LIMIT:
        return fcfs(queue, cache)
    hits = {id(r): cache.match_len(r) for r in queue}
    return sorted(queue, key=lambda r: (-hits[id(r)], r.created))


@register_policy("dfs-weight")
def dfs_weight(queue: list[Req], cache: CacheManager) -> list[Req]:
    """Depth-first over the radix tree, visiting the subtrees with the most waiting requests first,
    so requests that share a prefix run next to each other."""
    if cache.tree is None or len(queue) > LPM_QUEUE_LIMIT:
        return fcfs(queue, cache)
    by_node: dict[int, list[Req]] = {}
    nodes = {}
    for r in queue:
        node = cache.tree.match_prefix(r.cache_key(r.max_match_len)).node
        by_node.setdefault(id(node), []).append(r)
        nodes[id(node)] = node
    weight: dict[int, int] = {}
    for key, reqs in by_node.items():
        node = nodes[key]
        while node is not None:
            weight[id(node)] = weight.get(id(node), 0) + len(reqs)
            node = node.parent
    out: list[Req] = []
    stack = [cache.tree.root]
    while stack:
        node = stack.pop()
        out.extend(sorted(by_node.get(id(node), []), key=lambda r: r.created))
        children = [c for c in node.children.values() if id(c) in weight]
        stack.extend(sorted(children, key=lambda c: weight[id(c)]))
    return out
