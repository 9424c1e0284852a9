"""Where a process sits in a replica, and the tensor-parallel group it talks to."""

from __future__ import annotations

import datetime
import os
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

# NOTE: rank > 0 waits in a broadcast for as long as the server is idle, so collectives must not
# time out; a rank that dies closes its sockets, which fails the others' collectives at once.
COLLECTIVE_TIMEOUT = datetime.timedelta(days=365)


@dataclass(frozen=True)
class RankInfo:
    """One scheduler process's place: tensor-parallel rank and size, and the GPU it uses."""

    tp_rank: int = 0
    tp_size: int = 1
    gpu_id: int = 0
    init_method: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


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


def check_gpu_count(device: str, tp_size: int) -> None:
    """Raise ValueError when tensor parallelism on CUDA needs more GPUs than are visible."""
    if device not in ("auto", "cuda") or tp_size == 1 or not torch.cuda.is_available():
        return
    count = torch.cuda.device_count()
    if tp_size > count:
        raise ValueError(f"tp_size={tp_size} needs {tp_size} GPUs, but {count} are visible")


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


def file_init_method(private_dir: str) -> str:
    """A ``file://`` rendezvous inside the runtime's private temporary directory."""
    return f"file://{os.path.join(private_dir, 'tp_init')}"
