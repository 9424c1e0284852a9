"""The tensor-parallel group a scheduler rank talks to, and the device it computes on."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from radixlm.runtime.distributed.placement import RankInfo

# NOTE: rank > 0 waits in a broadcast for as long as the server is idle, so collectives must not
# time out; a rank that dies closes its sockets, which fails the others' collectives at once.
COLLECTIVE_TIMEOUT = datetime.timedelta(days=365)


class TPGroup:
    """The collectives a sharded model needs, over one replica's ranks."""

    def __init__(self, rank: int, world: int, device: torch.device) -> None:
        self.rank, self.world, self.device = rank, world, device

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place."""
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` along the last dimension, in rank order."""
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``x`` on every rank, in place."""
        dist.broadcast(x, src=0)
        return x

    def min_int(self, value: int) -> int:
        """The smallest ``value`` over the ranks."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def resolve_device(name: str, gpu_id: int = 0) -> torch.device:
    """``auto``: a GPU when CUDA is present, else CPU. ``auto``/``cuda`` take GPU ``gpu_id``,
    wrapping around the visible GPUs (data-parallel replicas may share them)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", gpu_id % max(torch.cuda.device_count(), 1))
    return torch.device(name)


def init_tp_group(info: RankInfo, device: torch.device) -> TPGroup:
    """Join the replica's process group (NCCL on CUDA, gloo on CPU); blocks until all ranks do.
    Each rank's CPU threads were set at its start (``runtime.threads``)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=info.init_method,
        rank=info.tp_rank,
        world_size=info.tp_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    return TPGroup(info.tp_rank, info.tp_size, device)
