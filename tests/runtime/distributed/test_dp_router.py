"""The data-parallel router on its own: prefix affinity, balance, and the simple policies."""

from __future__ import annotations

import random

import pytest

from radixlm.runtime.distributed.data_parallel import merge_stats
from radixlm.runtime.distributed.router import (
    BLOCK_TOKENS,
    PrefixIndex,
    Router,
    block_path,
)


def prompt(prefix: int, suffix: int, length: int = 64) -> list[int]:
    rng = random.Random(prefix)
    head = [rng.randrange(50_000) for _ in range(length)]
    return head + [suffix, suffix + 1, suffix + 2]


def test_block_paths_share_exactly_the_common_whole_blocks():
    a, b = prompt(1, 10), prompt(1, 20)
    assert block_path(a)[: 64 // BLOCK_TOKENS] == block_path(b)[: 64 // BLOCK_TOKENS]
    assert block_path(prompt(2, 10))[0] != block_path(a)[0]
    assert block_path(a[: BLOCK_TOKENS - 1]) == []


def test_prefix_index_evicts_leaves_before_their_prefixes():
    index = PrefixIndex(capacity=6)
    old, new = block_path(prompt(1, 0, 64)), block_path(prompt(2, 0, 64))
    index.insert(old)
    index.insert(new)
    assert len(index) == 6
    assert index.match(new) == len(new)
    assert index.match(old) == 2  # its two deepest nodes went first


def test_cache_aware_keeps_a_prefix_group_on_one_replica():
    router = Router(2, "cache_aware")
    homes = {}
    for i in range(12):
        group = i % 3
        replica = router.route(prompt(group, 100 + i))
        router.done(replica)
        assert homes.setdefault(group, replica) == replica
    assert set(homes.values()) == {0, 1}  # new prefixes spread over the replicas


def test_cache_aware_falls_back_to_the_least_loaded_replica_when_imbalanced():
    router = Router(2, "cache_aware", balance_threshold=3)
    targets = [router.route(prompt(7, i)) for i in range(6)]  # none finishes
    assert targets[:4] == [targets[0]] * 4
    assert targets[4] != targets[0]


def test_round_robin_and_least_load():
    rr = Router(3, "round_robin")
    assert [rr.route(prompt(1, i)) for i in range(6)] == [0, 1, 2, 0, 1, 2]
    ll = Router(2, "least_load")
    first = ll.route(prompt(1, 0))
    assert ll.route(prompt(1, 1)) != first
    ll.done(first)
    assert ll.route(prompt(1, 2)) == first


def simulated_hit_rate(policy: str) -> float:
    """Each replica a perfect prefix cache of what it was sent: hit tokens / prompt tokens."""
    router, caches = Router(2, policy), [PrefixIndex(), PrefixIndex()]
    rng = random.Random(0)
    order = [(g, r) for g in range(8) for r in range(3)]
    rng.shuffle(order)
    hit = total = 0
    for group, r in order:
        ids = prompt(group, 1000 * r, length=128)
        replica = router.route(ids)
        path = block_path(ids)
        hit += caches[replica].match(path) * BLOCK_TOKENS
        total += len(ids)
        caches[replica].insert(path)
        router.done(replica)
    return hit / total


def test_cache_aware_hit_rate_beats_round_robin():
    assert simulated_hit_rate("cache_aware") >= 1.5 * simulated_hit_rate("round_robin")


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="routing policy"):
        Router(2, "fastest")


def test_merged_stats_sum_counters_and_recompute_ratios():
    a = {
        "hit_tokens": 10,
        "queried_tokens": 20,
        "cache_hit_rate": 0.5,
        "kv_invariant_ok": True,
        "max_total_tokens": 100,
        "free_tokens": 90,
        "evictable_tokens": 10,
        "kv_usage": 0.0,
        "finished_by_reason": {"length": 2},
    }
    b = {
        **a,
        "hit_tokens": 0,
        "cache_hit_rate": 0.0,
        "kv_invariant_ok": None,
        "free_tokens": 50,
        "finished_by_reason": {"stop": 1},
    }
    merged = merge_stats([a, b])
    assert merged["cache_hit_rate"] == 0.25
    assert merged["kv_usage"] == 40 / 200
    assert merged["kv_invariant_ok"] is None
    assert merged["finished_by_reason"] == {"length": 2, "stop": 1}


def test_every_configurable_method_is_a_registered_policy():
    from radixlm.runtime.config import LOAD_BALANCE_METHODS
    from radixlm.runtime.distributed.router import ROUTING_POLICIES

    assert set(LOAD_BALANCE_METHODS) == set(ROUTING_POLICIES)
