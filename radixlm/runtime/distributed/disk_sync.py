"""The disk tier with tensor parallelism: every rank keeps the blocks of its own KV shard.

Rank 0 decides, as it does for batches: its ``DiskTier`` saves, loads, pins and clears, and
``DiskPeers`` sends each of those down the batch stream (``batch_sync.DiskOp``), so the other
ranks do the same on their shards in step with the batches: a save reads the slots before a
later forward can reuse them, a load writes them before the forward that reads them. Each
rank's blocks live in a directory of their own (the rank is part of the model key). A load is
agreed on: every rank reports how far it got (a rank may lack a block that rank 0 has: evicted
in another order, or corrupt) and all keep the least, so no rank attends over KV the others
lack.
"""

from __future__ import annotations

import torch

from radixlm.runtime.distributed.batch_sync import DiskOp, broadcast_disk_op
from radixlm.runtime.distributed.parallel import TPGroup

SAVE, LOAD, PIN, CLEAR = range(4)


class DiskPeers:
    """Rank 0's side: the other ranks' disk tiers."""

    def __init__(self, group: TPGroup) -> None:
        self.group = group

    def save(self, ids: list[int], slots: torch.Tensor) -> None:
        broadcast_disk_op(self.group, SAVE, _pack([len(ids)], ids, slots))

    def load(self, ids: list[int], matched: int, slots: torch.Tensor, end: int) -> int:
        """The others load ``ids``'s blocks past ``matched`` into ``slots``; returns the
        position every rank reached (``end`` is rank 0's)."""
        broadcast_disk_op(self.group, LOAD, _pack([matched, len(ids)], ids, slots))
        return self.group.min_int(end)

    def pin(self, ids: list[int]) -> None:
        broadcast_disk_op(self.group, PIN, ids)

    def clear(self) -> None:
        broadcast_disk_op(self.group, CLEAR, [])


def apply(tier, op: DiskOp, group: TPGroup) -> None:
    """Another rank's side: do rank 0's operation on this rank's ``DiskTier``."""
    v = op.values
    if op.kind == SAVE:
        n = int(v[0])
        tier.save(v[1 : 1 + n].tolist(), v[1 + n :])
    elif op.kind == LOAD:
        matched, n = int(v[0]), int(v[1])
        group.min_int(tier.load_into(v[2 : 2 + n].tolist(), matched, v[2 + n :]))
    elif op.kind == PIN:
        tier.pin(v.tolist())
    elif op.kind == CLEAR:
        tier.clear()
    else:
        raise ValueError(f"unknown disk operation {op.kind}")


def _pack(head: list[int], ids: list[int], slots: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.tensor(head + list(ids), dtype=torch.int64), slots.cpu().long()])
