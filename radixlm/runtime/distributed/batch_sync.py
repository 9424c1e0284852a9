"""Rank 0 hands each step's ForwardBatch to the other ranks of its replica.

Two broadcasts per step: a fixed header ``[op, T, B, N, L]`` and one packed int64 tensor with the
batch's token- and request-level tensors plus the batch's rows of the request-to-token table
(``[B, L]``, L = the longest sequence), which the receiver writes into its own table. Only rank 0
schedules, so every other rank's KV pool mirrors rank 0's slot layout. The same stream carries
rank 0's disk-tier operations (``DiskOp``: a header ``[op, kind, n, 0, 0]`` and ``n`` int64
values), so that each rank saves and loads its own shard in step with the batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.runtime.distributed.parallel import TPGroup
from radixlm.runtime.executor.forward_batch import ForwardBatch

OP_STOP, OP_FORWARD, OP_DISK = 0, 1, 2
HEADER_LEN = 5


@dataclass
class DiskOp:
    """A disk-tier operation for the other ranks (``distributed/disk_sync.py``)."""

    kind: int
    values: torch.Tensor  # int64, on the CPU


def broadcast_batch(group: TPGroup, batch: ForwardBatch) -> None:
    """Send ``batch`` from rank 0 to the other ranks."""
    width = max(batch.seq_lens_list, default=0)
    rows = batch.req_to_token[batch.req_slots, :width]
    parts = [
        batch.input_ids,
        batch.positions,
        batch.out_cache_loc,
        batch.req_slots,
        batch.prefix_lens,
        batch.extend_lens,
        batch.logits_indices,
        rows.reshape(-1),
    ]
    sizes = [batch.input_ids.numel(), batch.batch_size, batch.logits_indices.numel(), width]
    _send_header(group, OP_FORWARD, sizes)
    group.broadcast(torch.cat([p.to(group.device, torch.int64) for p in parts]))


def broadcast_stop(group: TPGroup) -> None:
    """Tell the other ranks to leave their loops."""
    _send_header(group, OP_STOP, [0, 0, 0, 0])


def broadcast_disk_op(group: TPGroup, kind: int, values: list[int] | torch.Tensor) -> None:
    """Send a disk-tier operation from rank 0 to the other ranks."""
    values = torch.as_tensor(values, dtype=torch.int64)
    _send_header(group, OP_DISK, [kind, values.numel(), 0, 0])
    if values.numel():
        group.broadcast(values.to(group.device))


def receive_batch(group: TPGroup, req_to_token: torch.Tensor) -> ForwardBatch | DiskOp | None:
    """Wait for rank 0's next batch or disk operation (None: stop); a batch's table rows land
    in ``req_to_token``."""
    header = group.broadcast(torch.zeros(HEADER_LEN, dtype=torch.int64, device=group.device))
    op, t, b, n, width = header.tolist()
    if op == OP_STOP:
        return None
    if op == OP_DISK:
        values = torch.empty(b, dtype=torch.int64, device=group.device)
        if b:
            group.broadcast(values)
        return DiskOp(t, values.cpu())
    packed = torch.empty(3 * t + 3 * b + n + b * width, dtype=torch.int64, device=group.device)
    group.broadcast(packed)
    ids, pos, loc, slots, prefix, extend, logits, rows = packed.split(
        [t, t, t, b, b, b, n, b * width]
    )
    req_to_token[slots, :width] = rows.view(b, width).to(req_to_token.device)
    seq_lens = prefix + extend
    return ForwardBatch(
        input_ids=ids,
        positions=pos,
        out_cache_loc=loc,
        req_slots=slots,
        prefix_lens=prefix,
        extend_lens=extend,
        seq_lens=seq_lens,
        logits_indices=logits,
        req_to_token=req_to_token,
        extend_lens_list=extend.tolist(),
        seq_lens_list=seq_lens.tolist(),
    )


def _send_header(group: TPGroup, op: int, sizes: list[int]) -> None:
    group.broadcast(torch.tensor([op, *sizes], dtype=torch.int64, device=group.device))
