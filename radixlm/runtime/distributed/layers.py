"""Modules that replace a plain model's layers once their weights are sliced across ranks.

Column-parallel layers (fused QKV, gate/up) need no module of their own: they stay ``nn.Linear``
with fewer output rows. The layers here are those whose outputs must be combined across ranks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.distributed.parallel import TPGroup


class RowParallelLinear(nn.Module):
    """``y = sum over ranks (x_r @ W_r^T) + b``: each rank holds a slice of the input columns."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group: TPGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.group.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Each rank holds rows ``[start, start + shard)`` of the table (the last one zero-padded);
    ids outside them embed to zero, and the ranks' results are summed."""

    def __init__(self, weight: nn.Parameter, start: int, group: TPGroup) -> None:
        super().__init__()
        self.weight = weight
        self.start = start
        self.group = group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)
        return self.group.all_reduce(out * inside.unsqueeze(-1).to(out.dtype))


class ParallelLMHead(nn.Module):
    """Each rank scores its vocabulary shard; the shards are gathered and the padding dropped."""

    def __init__(self, weight: nn.Parameter, vocab_size: int, group: TPGroup) -> None:
        super().__init__()
        self.weight = weight
        self.vocab_size = vocab_size
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.group.all_gather(F.linear(x, self.weight))
        return logits[..., : self.vocab_size]
