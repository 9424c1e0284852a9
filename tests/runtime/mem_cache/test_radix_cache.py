"""Tests for the radix-tree KV cache: matching, splitting, insertion, locking and LRU eviction."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from radixlm.runtime.mem_cache.radix_cache import RadixCache, TreeNode


def slots(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def as_list(t: torch.Tensor) -> list[int]:
    return t.tolist()


def test_empty_tree_matches_nothing() -> None:
    cache = RadixCache()
    result = cache.match_prefix([1, 2, 3])
    assert result.node is cache.root
    assert result.slots.dtype == torch.int64 and len(result.slots) == 0
    assert cache.total_size() == 0
    cache.check()


def test_match_returns_longest_cached_prefix() -> None:
    cache = RadixCache()
    assert cache.insert([1, 2, 3, 4], slots(10, 11, 12, 13)) == 0
    assert as_list(cache.match_prefix([1, 2, 3, 4, 5]).slots) == [10, 11, 12, 13]
    assert as_list(cache.match_prefix([1, 2, 9]).slots) == [10, 11]
    assert as_list(cache.match_prefix([7]).slots) == []
    cache.check()


def test_match_inside_a_node_splits_it() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], slots(10, 11, 12, 13))
    result = cache.match_prefix([1, 2, 7])
    assert result.node.key == [1, 2]
    assert as_list(result.node.value) == [10, 11]
    assert result.node.parent is cache.root
    (rest,) = result.node.children.values()
    assert rest.key == [3, 4] and as_list(rest.value) == [12, 13]
    assert cache.total_size() == 4
    cache.check()


def test_insert_returns_already_present_length_and_keeps_first_slots() -> None:
    cache = RadixCache()
    assert cache.insert([1, 2, 3], slots(10, 11, 12)) == 0
    assert cache.insert([1, 2, 3, 4, 5], slots(20, 21, 22, 23, 24)) == 3
    assert cache.insert([1, 2, 9], slots(30, 31, 32)) == 2
    assert cache.insert([1, 2], slots(40, 41)) == 2
    assert as_list(cache.match_prefix([1, 2, 3, 4, 5]).slots) == [10, 11, 12, 23, 24]
    assert as_list(cache.match_prefix([1, 2, 9]).slots) == [10, 11, 32]
    assert cache.total_size() == 6
    cache.check()


def test_insert_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError):
        RadixCache().insert([1, 2, 3], slots(1, 2))


def test_insert_copies_the_callers_slots() -> None:
    cache = RadixCache()
    row = slots(5, 6, 7)
    cache.insert([1, 2, 3], row)
    row[:] = -1
    assert as_list(cache.match_prefix([1, 2, 3]).slots) == [5, 6, 7]


def test_lock_protects_from_eviction() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3], slots(10, 11, 12))
    cache.insert([1, 2, 4], slots(20, 21, 22))
    node = cache.match_prefix([1, 2, 3]).node
    cache.lock(node)
    assert (cache.protected_size, cache.evictable_size) == (3, 1)
    freed = cache.evict(100)
    assert as_list(freed) == [22]
    assert as_list(cache.match_prefix([1, 2, 3]).slots) == [10, 11, 12]
    assert cache.evict(100).numel() == 0
    cache.unlock(node)
    assert (cache.protected_size, cache.evictable_size) == (0, 3)
    assert sorted(as_list(cache.evict(100))) == [10, 11, 12]
    assert cache.total_size() == 0
    cache.check()


def test_lock_is_reference_counted_and_over_unlock_raises() -> None:
    cache = RadixCache()
    cache.insert([1, 2], slots(10, 11))
    node = cache.match_prefix([1, 2]).node
    cache.lock(node)
    cache.lock(node)
    cache.unlock(node)
    assert cache.protected_size == 2
    cache.unlock(node)
    assert cache.evictable_size == 2
    with pytest.raises(RuntimeError):
        cache.unlock(node)
    cache.check()


def test_split_of_a_locked_node_keeps_it_protected() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], slots(10, 11, 12, 13))
    node = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(node)
    cache.insert([1, 2, 9], slots(20, 21, 22))
    assert (cache.protected_size, cache.evictable_size) == (4, 1)
    cache.check()
    cache.unlock(node)
    assert (cache.protected_size, cache.evictable_size) == (0, 5)
    cache.check()


def test_evict_least_recently_used_first() -> None:
    cache = RadixCache()
    cache.insert([1], slots(10))
    cache.insert([2], slots(20))
    cache.insert([3], slots(30))
    cache.match_prefix([1])
    assert as_list(cache.evict(1)) == [20]
    assert as_list(cache.evict(1)) == [30]
    assert as_list(cache.evict(1)) == [10]


def test_evict_parent_becomes_leaf_after_children() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3], slots(10, 11, 12))
    cache.insert([1, 2, 4], slots(20, 21, 22))
    cache.insert([5, 6], slots(30, 31))
    freed = cache.evict(3)
    assert sorted(as_list(freed)) == [10, 11, 12, 22]
    assert as_list(cache.match_prefix([5, 6]).slots) == [30, 31]
    cache.check()


def test_evict_stops_once_enough_is_freed() -> None:
    cache = RadixCache()
    cache.insert([1, 2], slots(10, 11))
    cache.insert([3, 4], slots(20, 21))
    assert len(cache.evict(1)) == 2
    assert cache.total_size() == 2
    assert cache.evict(0).numel() == 0


@pytest.mark.parametrize("page_size", [2, 4])
def test_paged_keys_use_whole_pages(page_size: int) -> None:
    cache = RadixCache(page_size=page_size)
    key = list(range(3 * page_size + 1))
    assert cache.insert(key, torch.arange(100, 100 + len(key))) == 0
    assert cache.total_size() == 3 * page_size
    partial = key[: page_size + 1] + [999]
    result = cache.match_prefix(partial)
    assert as_list(result.slots) == list(range(100, 100 + page_size))
    assert len(result.node.key) == page_size
    other = key[:page_size] + [999] * page_size
    assert cache.insert(other, torch.arange(200, 200 + 2 * page_size)) == page_size
    assert len(cache.root.children) == 1
    (head,) = cache.root.children
    assert head == tuple(key[:page_size])
    cache.check()


def test_reset_and_all_slots() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3], slots(10, 11, 12))
    cache.insert([1, 5], slots(20, 21))
    assert sorted(as_list(cache.all_slots())) == [10, 11, 12, 21]
    assert "lock=0" in cache.pretty()
    cache.reset()
    assert cache.total_size() == 0 and cache.all_slots().numel() == 0
    cache.check()


def test_check_detects_corruption() -> None:
    cache = RadixCache()
    cache.insert([1, 2], slots(10, 11))
    cache.insert([3], slots(10))
    with pytest.raises(RuntimeError, match="more than once"):
        cache.check()


KEYS = st.lists(st.integers(0, 2), max_size=12)


def path_length(node: TreeNode) -> int:
    total = 0
    while node.parent is not None:
        total += len(node.key)
        node = node.parent
    return total


class RadixCacheMachine(RuleBasedStateMachine):
    """Random inserts / matches / locks / unlocks / evictions against a dict of prefixes."""

    @initialize(page_size=st.sampled_from([1, 2, 4]))
    def setup(self, page_size: int) -> None:
        self.page_size = page_size
        self.cache = RadixCache(page_size=page_size)
        self.model: dict[tuple[int, ...], list[int]] = {}
        self.free: list[int] = []
        self.next_slot = 0
        self.locked: list[tuple[TreeNode, tuple[int, ...]]] = []

    def alloc(self, n: int) -> torch.Tensor:
        out = [self.free.pop() for _ in range(min(n, len(self.free)))]
        fresh = n - len(out)
        out += range(self.next_slot, self.next_slot + fresh)
        self.next_slot += fresh
        return torch.tensor(out, dtype=torch.int64)

    def cached_len(self, key: list[int]) -> int:
        n, page = 0, self.page_size
        while n + page <= len(key) and tuple(key[: n + page]) in self.model:
            n += page
        return n

    def model_slots(self, key: list[int], n: int) -> list[int]:
        page = self.page_size
        return [s for end in range(page, n + 1, page) for s in self.model[tuple(key[:end])]]

    def whole_pages(self, key: list[int]) -> list[int]:
        return key[: len(key) - len(key) % self.page_size]

    @rule(key=KEYS)
    def insert(self, key: list[int]) -> None:
        new = self.alloc(len(key))
        full = self.whole_pages(key)
        expected = self.cached_len(full)
        assert self.cache.insert(key, new) == expected
        self.free += new[:expected].tolist() + new[len(full) :].tolist()
        for end in range(expected + self.page_size, len(full) + 1, self.page_size):
            self.model[tuple(full[:end])] = new[end - self.page_size : end].tolist()

    @rule(key=KEYS)
    def match(self, key: list[int]) -> None:
        n = self.cached_len(key)
        result = self.cache.match_prefix(key)
        assert result.slots.tolist() == self.model_slots(key, n)
        assert path_length(result.node) == n

    @rule(key=KEYS)
    def lock(self, key: list[int]) -> None:
        result = self.cache.match_prefix(key)
        if result.node is not self.cache.root:
            self.cache.lock(result.node)
            self.locked.append((result.node, tuple(key[: len(result.slots)])))

    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        if self.locked:
            index = data.draw(st.integers(0, len(self.locked) - 1))
            node, _ = self.locked.pop(index)
            self.cache.unlock(node)

    @rule(num_tokens=st.integers(0, 16))
    def evict(self, num_tokens: int) -> None:
        before = self.cache.evictable_size
        freed = self.cache.evict(num_tokens).tolist()
        assert len(freed) >= min(num_tokens, before)
        assert self.cache.evictable_size == before - len(freed)
        if len(freed) < num_tokens:
            assert self.cache.evictable_size == 0
        assert not set(freed) & set(self.cache.all_slots().tolist())
        gone = set(freed)
        self.model = {k: v for k, v in self.model.items() if not gone.issuperset(v)}
        self.free += freed

    @invariant()
    def consistent(self) -> None:
        self.cache.check()
        total = self.cache.total_size()
        assert self.cache.evictable_size + self.cache.protected_size == total
        held = sorted(s for page in self.model.values() for s in page)
        assert sorted(self.cache.all_slots().tolist()) == held

    @invariant()
    def locked_paths_survive(self) -> None:
        for node, prefix in self.locked:
            assert node.lock_ref > 0
            assert path_length(node) == len(prefix)
            ends = range(self.page_size, len(prefix) + 1, self.page_size)
            assert all(prefix[:end] in self.model for end in ends)


RadixCacheMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None
)
TestRadixCacheMachine = RadixCacheMachine.TestCase
