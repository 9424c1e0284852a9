"""Choose a replica for each request: the ``--dp-size`` replicas of one host and the Ray Serve
replicas of ``radixlm.deploy`` share this code.

Policies (a registry): ``cache_aware`` sends a request to the replica whose record of past
requests shares the longest prefix with it, unless that replica is overloaded compared with the
least-loaded one; ``round_robin``; ``least_load`` (fewest requests in flight).

The record is an approximate radix tree per replica: token ids are cut into blocks, each node is
keyed by the hash of the whole path up to it, and the least recently used nodes are dropped
beyond a fixed capacity. It never sees the replicas' real caches, only what was routed to them.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any

ROUTING_POLICIES: dict[str, Callable] = {}  # name -> policy(router, path, candidates) -> replica

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
    """Routes token-id prompts over a set of replicas and counts requests in flight.

    Replicas are any hashable keys: ``0 .. n-1`` for ``--dp-size``, Ray Serve replica ids for
    the Ray deployment (whose replicas come and go: ``sync`` follows them). ``route`` picks and
    records in one call; a caller that learns later where a request went (Ray's request router)
    calls ``choose`` and ``remember``, then ``started`` once it is sent.
    """

    def __init__(
        self,
        replicas: int | Iterable[Hashable],
        policy: str = "cache_aware",
        balance_threshold: int = BALANCE_THRESHOLD,
        index_capacity: int = INDEX_CAPACITY,
    ) -> None:
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"routing policy must be one of {sorted(ROUTING_POLICIES)}")
        self.policy = policy
        self.balance_threshold = balance_threshold
        self.index_capacity = index_capacity
        self.indexes: dict[Hashable, PrefixIndex] = {}
        self.loads: Counter = Counter()
        self.routed: Counter = Counter()
        self.decisions: Counter = Counter()
        self.turn = 0
        self.sync(range(replicas) if isinstance(replicas, int) else replicas)

    @property
    def replicas(self) -> list[Hashable]:
        return list(self.indexes)

    def sync(self, replicas: Iterable[Hashable]) -> None:
        """Follow the live replica set: new ones start empty, gone ones are forgotten."""
        live = list(replicas)
        for key in live:
            self.indexes.setdefault(key, PrefixIndex(self.index_capacity))
        for key in set(self.indexes) - set(live):
            del self.indexes[key]
            self.loads.pop(key, None)

    def choose(self, ids: list[int], candidates: list[Hashable] | None = None) -> Hashable:
        """The replica the policy picks for a prompt among ``candidates`` (default: all)."""
        candidates = candidates or self.replicas
        for key in candidates:
            self.indexes.setdefault(key, PrefixIndex(self.index_capacity))
        return ROUTING_POLICIES[self.policy](self, block_path(ids), candidates)

    def remember(self, ids: list[int], replica: Hashable) -> None:
        """Record that ``replica`` will hold this prompt's prefix.

        NOTE: at decision time, before the request is sent, so that prompts of a new prefix
        routed close together follow the first one instead of each picking a replica."""
        self.indexes.setdefault(replica, PrefixIndex(self.index_capacity)).insert(block_path(ids))

    def started(self, replica: Hashable) -> None:
        """A request is in flight on ``replica``."""
        self.loads[replica] += 1
        self.routed[replica] += 1

    def route(self, ids: list[int]) -> Hashable:
        """Pick a replica for a prompt and count the request in flight there."""
        replica = self.choose(ids)
        self.remember(ids, replica)
        self.started(replica)
        return replica

    def done(self, replica: Hashable) -> None:
        """A request routed to ``replica`` finished (or failed)."""
        if self.loads[replica] > 0:
            self.loads[replica] -= 1

    def least_loaded(self, candidates: list[Hashable]) -> Hashable:
        return min(candidates, key=lambda k: (self.loads[k], self.routed[k]))

    def stats(self, replica: Hashable) -> dict[str, Any]:
        return {
            "routed": self.routed[replica],
            "in_flight": self.loads[replica],
            "index_nodes": len(self.indexes.get(replica, ())),
        }


@register_policy("round_robin")
def round_robin(router: Router, path: list[int], candidates: list[Hashable]) -> Hashable:
    router.turn += 1
    return candidates[(router.turn - 1) % len(candidates)]


@register_policy("least_load")
def least_load(router: Router, path: list[int], candidates: list[Hashable]) -> Hashable:
    return router.least_loaded(candidates)


@register_policy("cache_aware")
def cache_aware(router: Router, path: list[int], candidates: list[Hashable]) -> Hashable:
    matches = {k: router.indexes[k].match(path) for k in candidates}
    best = max(candidates, key=lambda k: (matches[k], -router.loads[k]))
    least = router.least_loaded(candidates)
    if router.loads[best] - router.loads[least] > router.balance_threshold:
        router.decisions["balance"] += 1
        return least
    if not path or matches[best] < max(1, MIN_MATCH_RATIO * len(path)):
        router.decisions["new_prefix"] += 1
        return min(candidates, key=lambda k: (len(router.indexes[k]), router.loads[k]))
    router.decisions["prefix"] += 1
    return best
