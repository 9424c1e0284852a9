"""Prompt logprobs kept beside the KV, so that echo requests reuse them with the prefix.

The KV slot of prompt token ``i`` also holds the logprob of token ``i`` given tokens ``0..i-1``
and the top ``top_k`` alternatives at that position. Like the KV in that slot, they depend only
on tokens ``0..i``, so whatever shares the slot (the radix tree, the requests that match it,
``cache_salt``, eviction) shares or drops them with it, and nothing else has to know. A slot
handed out again is marked empty before anything writes it. A request for prompt logprobs
reuses a cached prefix as far as its slots hold them (with at least the top-n it asks for),
and computes the rest. NOTE: the disk tier stores KV only: a prefix restored from disk comes
back without logprobs, which are then computed again.
"""

from __future__ import annotations

import torch

EMPTY = -1  # in ``num_top``: no logprob stored in this slot


class PromptLogprobStore:
    def __init__(self, size: int, top_k: int) -> None:
        self.top_k = top_k
        self.num_top = torch.full((size + 1,), EMPTY, dtype=torch.int8)
        self.value = torch.zeros(size + 1, dtype=torch.float32)
        self.top_values = torch.zeros(size + 1, top_k, dtype=torch.float32)
        self.top_ids = torch.zeros(size + 1, top_k, dtype=torch.int32)
        self.reused_tokens = 0  # prompt logprobs read from here instead of computed
        self.top_n_misses = 0  # tokens computed again because more top-n was asked than kept

    def clear(self, slots: torch.Tensor) -> None:
        """``slots`` were handed out again: what they held belongs to other tokens."""
        self.num_top[slots] = EMPTY

    def covered(self, slots: torch.Tensor, start: int, top_n: int) -> int:
        """The first position ``>= start`` of a prefix held in ``slots`` whose logprob (with
        ``top_n`` alternatives) is not stored here; ``len(slots)`` when every one is."""
        if start >= len(slots):
            return len(slots)
        held = self.num_top[slots[start:]]
        missing = (held < max(top_n, 0)).nonzero()
        if not len(missing):
            return len(slots)
        return start + int(missing[0])

    def count_top_n_miss(self, slots: torch.Tensor, first: int, top_n: int) -> None:
        """Count the tokens from ``first`` on computed again although their logprobs are
        stored, because the request asks for more alternatives than were kept."""
        if first < len(slots) and 0 <= int(self.num_top[slots[first]]) < top_n:
            self.top_n_misses += len(slots) - first

    def put(
        self, slots: torch.Tensor, values: list[float], tops: list[list[tuple[float, int]]] | None
    ) -> None:
        """Store the logprob of the token in each of ``slots`` and its top alternatives (as many
        as were computed, up to ``top_k``; None: none)."""
        if not len(slots):
            return
        self.value[slots] = torch.tensor(values, dtype=torch.float32)
        kept = 0
        if tops is not None and self.top_k:
            kept = min(self.top_k, min(len(t) for t in tops))
            if kept:
                rows = [t[:kept] for t in tops]
                self.top_values[slots, :kept] = torch.tensor(
                    [[v for v, _ in r] for r in rows], dtype=torch.float32
                )
                self.top_ids[slots, :kept] = torch.tensor(
                    [[i for _, i in r] for r in rows], dtype=torch.int32
                )
        self.num_top[slots] = kept

    def get(self, slots: torch.Tensor, top_n: int) -> list[tuple[float, list | None]]:
        """``(logprob, top_n alternatives or None)`` of each of ``slots`` (all stored)."""
        self.reused_tokens += len(slots)
        values = self.value[slots].tolist()
        if not top_n:
            return [(v, None) for v in values]
        top_v = self.top_values[slots, :top_n].tolist()
        top_i = self.top_ids[slots, :top_n].tolist()
        return [(v, list(zip(tv, ti))) for v, tv, ti in zip(values, top_v, top_i)]
