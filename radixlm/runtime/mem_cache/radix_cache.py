"""A radix tree mapping token-id prefixes to KV slot indices, with locking and LRU eviction.

Pure data structure: it knows nothing about requests. Keys are lists of token ids, values are
1-D int64 tensors of KV slots (one per token). An optional ``observer`` (``kv_events``) hears
which paths were stored, cut back by eviction, or cleared. With ``page_size > 1`` keys are
handled in whole pages: a key is truncated to a multiple of the page size and a match only
counts full pages.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import NamedTuple, Protocol

import torch

_EMPTY = torch.empty(0, dtype=torch.int64)


class TreeNode:
    """One edge of the radix tree: a run of tokens and the KV slots holding them.

    ``children`` is keyed by the child's first token (page_size 1) or first page as a tuple.
    ``lock_ref`` counts running users of this node or of a descendant; locked nodes are never
    evicted. ``last_access`` is a logical clock value, larger means more recently used.
    """

    __slots__ = ("children", "id", "key", "last_access", "lock_ref", "parent", "value")

    def __init__(
        self,
        key: list[int],
        value: torch.Tensor,
        parent: TreeNode | None,
        node_id: int,
        last_access: int = 0,
    ) -> None:
        self.children: dict[int | tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.lock_ref = 0
        self.last_access = last_access
        self.id = node_id

    def __repr__(self) -> str:
        head = self.key[:8]
        more = "..." if len(self.key) > 8 else ""
        return f"TreeNode({head}{more} len={len(self.key)} lock={self.lock_ref})"


class TreeObserver(Protocol):
    def stored(self, path: list[int], present: int) -> None: ...
    def removed(self, path: list[int], kept: int) -> None: ...
    def cleared(self) -> None: ...


class MatchResult(NamedTuple):
    """The longest cached prefix of a key.

    ``slots`` holds its KV slots (length a multiple of the page size); ``node`` is the deepest
    matched node, covering exactly that prefix (the root when nothing matched).
    """

    slots: torch.Tensor
    node: TreeNode


class NodeView(NamedTuple):
    """One node as ``snapshot`` reports it: ``head`` is the start of its key."""

    id: int
    parent: int | None
    tokens: int
    head: list[int]
    lock_ref: int
    last_access: int


class RadixCache:
    """Radix tree over KV slots: match / insert / lock / unlock / evict / sizes / check."""

    def __init__(self, page_size: int = 1, observer: TreeObserver | None = None) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.observer = observer
        self._ids = itertools.count()
        self._clock = 0
        self.reset()

    def reset(self) -> None:
        """Drop every node; the caller frees ``all_slots()`` first."""
        if self.observer is not None:
            self.observer.cleared()
        self.root = TreeNode([], _EMPTY, None, next(self._ids))
        self._leaves: set[TreeNode] = set()
        self._evictable = 0
        self._protected = 0

    @property
    def evictable_size(self) -> int:
        """Tokens held by unlocked nodes."""
        return self._evictable

    @property
    def protected_size(self) -> int:
        """Tokens held by locked nodes."""
        return self._protected

    def total_size(self) -> int:
        """All tokens held by the tree."""
        return self._evictable + self._protected

    def match_prefix(self, key: list[int]) -> MatchResult:
        """Find the longest cached prefix of ``key``, splitting a node the match ends inside."""
        key = self._truncate(key)
        node, _, values = self._walk(key)
        return MatchResult(torch.cat(values) if values else _EMPTY, node)

    def insert(self, key: list[int], slots: torch.Tensor) -> int:
        """Insert ``key`` with its ``slots``; return how many leading tokens were already present.

        The tree keeps its existing slots for that leading range; the caller frees its own
        duplicates ``slots[:returned]``. ``key`` is truncated to a multiple of the page size.
        """
        if len(slots) != len(key):
            raise ValueError(f"insert: {len(key)} tokens but {len(slots)} slots")
        key = self._truncate(key)
        node, pos, _ = self._walk(key)
        if pos < len(key):
            self._add_leaf(node, key[pos:], slots[pos : len(key)])
            if self.observer is not None:
                self.observer.stored(key, pos)
        return pos

    def lock(self, node: TreeNode) -> None:
        """Protect ``node`` and its ancestors from eviction (reference counted)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        """Undo one ``lock(node)``; raises ``RuntimeError`` if ``node`` is not locked."""
        if node is not self.root and node.lock_ref <= 0:
            raise RuntimeError(f"unlock of an unlocked node {node!r}")
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node.key)
                self._evictable += len(node.key)
            node = node.parent

    def evict(self, num_tokens: int) -> torch.Tensor:
        """Free least-recently-used unlocked leaves until ``num_tokens`` are freed or none remain.

        Returns the freed slots; the caller gives them back to its allocator.
        """
        heap = [(n.last_access, n.id, n) for n in self._leaves if n.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[torch.Tensor] = []
        count = 0
        while count < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            if self.observer is not None:
                path = self._path(leaf)
                self.observer.removed(path, len(path) - len(leaf.key))
            freed.append(leaf.value)
            count += len(leaf.key)
            parent = self._remove_leaf(leaf)
            if parent in self._leaves and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return torch.cat(freed) if freed else _EMPTY

    def all_slots(self) -> torch.Tensor:
        """Every KV slot held by the tree."""
        values = [node.value for node in self._nodes()]
        return torch.cat(values) if values else _EMPTY

    def continuation(self, key: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens that follow ``key`` in the tree (along the most recently used
        branch), read without splitting or touching any node; [] if ``key`` leaves the tree."""
        node, pos, page = self.root, 0, self.page_size
        while pos < len(key):
            if len(key) - pos < page:
                return []
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                return []
            n = len(child.key) if key[pos : pos + len(child.key)] == child.key else 0
            if n == 0:
                while n < len(child.key) and pos + n < len(key) and child.key[n] == key[pos + n]:
                    n += 1
                return child.key[n : n + k] if pos + n == len(key) else []
            pos, node = pos + n, child
        out: list[int] = []
        while len(out) < k and node.children:
            node = max(node.children.values(), key=lambda c: c.last_access)
            out.extend(node.key[: k - len(out)])
        return out

    def snapshot(self, max_nodes: int, head_tokens: int = 64) -> tuple[list[NodeView], int]:
        """Up to ``max_nodes`` nodes, breadth first from the root (so the tree's shape is kept
        when it is cut), each with the first ``head_tokens`` of its key; and the logical clock
        (larger ``last_access`` = more recent)."""
        out: list[NodeView] = []
        queue = deque([self.root])
        while queue and len(out) < max_nodes + 1:
            node = queue.popleft()
            parent = node.parent.id if node.parent is not None else None
            out.append(NodeView(node.id, parent, len(node.key), node.key[:head_tokens],
                                node.lock_ref, node.last_access))  # fmt: skip
            queue.extend(sorted(node.children.values(), key=lambda n: -n.last_access))
        return out, self._clock

    def check(self) -> None:
        """Recompute every invariant from scratch; raise ``RuntimeError`` naming a violation."""
        root = self.root
        if root.key or root.lock_ref != 0 or root.parent is not None:
            raise RuntimeError("root must have an empty key, no parent and lock_ref 0")
        for dict_key, child in root.children.items():
            if child.parent is not root or not child.key or dict_key != self._child_key(child.key):
                raise RuntimeError(f"{child!r}: badly attached to the root")
        evictable = protected = 0
        leaves: set[TreeNode] = set()
        for node in self._nodes():
            self._check_node(node)
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            if not node.children:
                leaves.add(node)
        if (evictable, protected) != (self._evictable, self._protected):
            raise RuntimeError(
                f"size counters (evictable={self._evictable}, protected={self._protected}) "
                f"!= recomputed (evictable={evictable}, protected={protected})"
            )
        if leaves != self._leaves:
            raise RuntimeError("leaf set is out of date")
        slots = self.all_slots()
        if len(torch.unique(slots)) != len(slots):
            raise RuntimeError("a KV slot appears more than once in the tree")

    def pretty(self) -> str:
        """A small indented rendering of the tree for debugging."""
        lines = [f"root evictable={self._evictable} protected={self._protected}"]
        stack = [(child, 1) for child in reversed(self.root.children.values())]
        while stack:
            node, depth = stack.pop()
            lines.append(f"{'  ' * depth}{node.key} lock={node.lock_ref} t={node.last_access}")
            stack.extend((child, depth + 1) for child in reversed(node.children.values()))
        return "\n".join(lines)

    def _truncate(self, key: list[int]) -> list[int]:
        extra = len(key) % self.page_size
        return key[: len(key) - extra] if extra else key

    def _child_key(self, key: list[int], pos: int = 0) -> int | tuple[int, ...]:
        if self.page_size == 1:
            return key[pos]
        return tuple(key[pos : pos + self.page_size])

    def _common_len(self, node_key: list[int], key: list[int], pos: int) -> int:
        if key[pos : pos + len(node_key)] == node_key:
            return len(node_key)
        n = min(len(node_key), len(key) - pos)
        i = 0
        while i < n and node_key[i] == key[pos + i]:
            i += 1
        return i - i % self.page_size

    def _walk(self, key: list[int]) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """Descend along ``key``, touching and splitting; return (deepest node, length, values)."""
        self._clock += 1
        node, pos, values = self.root, 0, []
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            n = self._common_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = self._clock
            values.append(child.value)
            pos += n
            node = child
        return node, pos, values

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child`` after ``n`` tokens; return the new upper node holding the first part."""
        parent = child.parent
        mid = TreeNode(child.key[:n], child.value[:n], parent, next(self._ids), child.last_access)
        mid.lock_ref = child.lock_ref
        child.key = child.key[n:]
        child.value = child.value[n:]
        child.parent = mid
        mid.children[self._child_key(child.key)] = child
        parent.children[self._child_key(mid.key)] = mid
        return mid

    def _add_leaf(self, parent: TreeNode, key: list[int], slots: torch.Tensor) -> None:
        value = slots.to(dtype=torch.int64, copy=True)
        leaf = TreeNode(key, value, parent, next(self._ids), self._clock)
        parent.children[self._child_key(key)] = leaf
        self._leaves.discard(parent)
        self._leaves.add(leaf)
        self._evictable += len(key)

    def _remove_leaf(self, leaf: TreeNode) -> TreeNode:
        parent = leaf.parent
        del parent.children[self._child_key(leaf.key)]
        self._leaves.discard(leaf)
        self._evictable -= len(leaf.key)
        if parent is not self.root and not parent.children:
            self._leaves.add(parent)
        return parent

    def _path(self, node: TreeNode) -> list[int]:
        """The tokens from the root to the end of ``node``."""
        keys = []
        while node is not self.root:
            keys.append(node.key)
            node = node.parent
        return [t for key in reversed(keys) for t in key]

    def _nodes(self) -> list[TreeNode]:
        """Every non-root node, parents before children."""
        out: list[TreeNode] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _check_node(self, node: TreeNode) -> None:
        if not node.key or len(node.key) % self.page_size:
            raise RuntimeError(f"{node!r}: key empty or not a whole number of pages")
        if len(node.value) != len(node.key):
            raise RuntimeError(f"{node!r}: {len(node.value)} slots for {len(node.key)} tokens")
        if node.lock_ref < 0:
            raise RuntimeError(f"{node!r}: negative lock_ref")
        for dict_key, child in node.children.items():
            if child.parent is not node:
                raise RuntimeError(f"{child!r}: parent pointer does not match")
            if not child.key or dict_key != self._child_key(child.key):
                raise RuntimeError(f"{child!r}: stored under {dict_key!r}")
            if child.lock_ref > node.lock_ref:
                raise RuntimeError(f"{child!r}: lock_ref exceeds its parent's ({node.lock_ref})")
