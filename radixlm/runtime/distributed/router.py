"""Choose a data-parallel replica for each request.

Policies (a registry): ``cache_aware`` sends a request to the replica whose record of past
requests shares the longest prefix with it, unless that replica is overloaded compared with the
least-loaded one; ``round_robin``; ``least_load`` (fewest requests in flight).

The record is an approximate radix tree per replica: token ids are cut into blocks, each node is
keyed by the hash of the whole path up to it, and the least recently used nodes are dropped
beyond a fixed capacity. It never sees the replicas' real caches, only what was routed to them.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

ROUTING_POLICIES: dict[str, Callable[[Router, list[int]], int]] = {}

BLOCK_TOKENS = 16
INDEX_CAPACITY = 1 << 16  # nodes per replica: about a million tokens of history
BALANCE_THRESHOLD = 16  # requests in flight beyond the least-loaded replica
MIN_MATCH_RATIO = 0.5  # a shorter match counts as none


def register_policy(name: str) -> Callable:
    def wrap(fn: Callable) -> Callable:
        ROUTING_POLICIES[name] = fn
        return fn

    return wrap


def block_path(ids: list[int], block: int = BLOCK_TOKENS) -> list[int]:
    """One key per whole block of ``ids``: the hash of every token up to the block's end."""
    path, h = [], 0
    for start in range(0, len(ids) - block + 1, block):
        h = hash((h, *ids[start : start + block]))
        path.append(h)
    return path


class PrefixIndex:
    """The set of block paths routed to one replica, LRU-bounded to ``capacity`` nodes."""

    def __init__(self, capacity: int = INDEX_CAPACITY) -> None:
        self.capacity = capacity
        self._nodes: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._nodes)

    def match(self, path: list[int]) -> int:
        """How many leading nodes of ``path`` are present."""
        n = 0
        while n < len(path) and path[n] in self._nodes:
            n += 1
        return n

    def insert(self, path: list[int]) -> None:
        """Record ``path``; its nodes become the most recently used."""
        # NOTE: deepest first, so a node is always newer than its descendants and eviction
        # removes leaves before the prefixes they hang from.
        for key in reversed(path):
            self._nodes[key] = None
            self._nodes.move_to_end(key)
        while len(self._nodes) > self.capacity:
            self._nodes.popitem(last=False)


class Router:
    """Routes token-id prompts over ``num_replicas`` replicas and counts requests in flight."""

    def __init__(
        self,
        num_replicas: int,
        policy: str = "cache_aware",
        balance_threshold: int = BALANCE_THRESHOLD,
        index_capacity: int = INDEX_CAPACITY,
    ) -> None:
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"routing policy must be one of {sorted(ROUTING_POLICIES)}")
        self.policy = policy
        self.balance_threshold = balance_threshold
        self.indexes = [PrefixIndex(index_capacity) for _ in range(num_replicas)]
        self.loads = [0] * num_replicas
        self.routed = [0] * num_replicas
        self.decisions: Counter = Counter()
        self.turn = 0

    @property
    def num_replicas(self) -> int:
        return len(self.loads)

    def route(self, ids: list[int]) -> int:
        """Pick a replica for a prompt and count the request in flight there."""
        path = block_path(ids)
        replica = ROUTING_POLICIES[self.policy](self, path)
        self.indexes[replica].insert(path)
        self.loads[replica] += 1
        self.routed[replica] += 1
        return replica

    def done(self, replica: int) -> None:
        """A request routed to ``replica`` finished (or failed)."""
        self.loads[replica] -= 1

    def least_loaded(self) -> int:
        return min(range(self.num_replicas), key=lambda i: (self.loads[i], self.routed[i]))

    def stats(self, replica: int) -> dict[str, Any]:
        return {
            "routed": self.routed[replica],
            "in_flight": self.loads[replica],
            "index_nodes": len(self.indexes[replica]),
        }


@register_policy("round_robin")
def round_robin(router: Router, path: list[int]) -> int:
    router.turn += 1
    return (router.turn - 1) % router.num_replicas


@register_policy("least_load")
def least_load(router: Router, path: list[int]) -> int:
    return router.least_loaded()


@register_policy("cache_aware")
def cache_aware(router: Router, path: list[int]) -> int:
    n = router.num_replicas
    matches = [index.match(path) for index in router.indexes]
    best = max(range(n), key=lambda i: (matches[i], -router.loads[i]))
    least = router.least_loaded()
    if router.loads[best] - router.loads[least] > router.balance_threshold:
        router.decisions["balance"] += 1
        return least
    if not path or matches[best] < max(1, MIN_MATCH_RATIO * len(path)):
        router.decisions["new_prefix"] += 1
        return min(range(n), key=lambda i: (len(router.indexes[i]), router.loads[i]))
    router.decisions["prefix"] += 1
    return best
