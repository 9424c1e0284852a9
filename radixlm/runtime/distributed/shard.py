"""Tensor parallelism as a transform: slice a loaded plain model's weights for one rank.

Attention heads are split across ranks (KV heads replicated when there are fewer KV heads than
ranks: each rank keeps the one KV head its query heads read); the fused QKV and gate/up
projections become column-parallel, ``o_proj`` and ``down_proj`` row-parallel; the embedding and
the LM head are split by vocabulary rows. Each rank keeps every expert of a MoE layer, with its
slice of their intermediate dimension (the router is replicated; the experts' partial outputs
are summed across ranks).

Not sharded: a q/k norm over the whole projected q or k (OLMo 2, OLMoE) needs all the heads,
so those models run with ``tp_size=1`` (``placement.check_tp_size``).
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.distributed.layers import (
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from radixlm.runtime.distributed.parallel import TPGroup
from radixlm.runtime.distributed.placement import check_tp_size
from radixlm.runtime.models.layers import Attention, GatedMLP
from radixlm.runtime.models.moe import Experts


def local_heads(config: ModelConfig, world: int) -> tuple[int, int]:
    """(attention heads, KV heads) on each rank; a KV head is replicated when there are fewer
    of them than ranks."""
    return config.num_heads // world, max(config.num_kv_heads // world, 1)


def shard_model(model: nn.Module, group: TPGroup) -> nn.Module:
    """Slice ``model``'s weights in place for ``group.rank`` of ``group.world``; return it."""
    check_tp_size(model.config, group.world)
    for module in list(model.modules()):
        if isinstance(module, Attention):
            _shard_attention(module, group)
        elif isinstance(module, GatedMLP):
            _shard_mlp(module, group)
        elif isinstance(module, Experts):
            _shard_experts(module, group)
    _shard_vocab(model, group)
    return model


def _shard_attention(attn: Attention, group: TPGroup) -> None:
    rank, world, d = group.rank, group.world, attn.head_dim
    heads = attn.num_heads // world
    kv_first, kv_heads = _kv_heads_of(attn, rank, world)
    q_size, kv_size, _ = attn.sizes
    q_rows = _rows(0, rank * heads * d, heads * d)
    k_rows = _rows(q_size, kv_first * d, kv_heads * d)
    v_rows = _rows(q_size + kv_size, kv_first * d, kv_heads * d)
    rows = torch.cat([q_rows, k_rows, v_rows])
    attn.qkv_proj = _take_rows(attn.qkv_proj, rows)
    attn.o_proj = _row_parallel(attn.o_proj, q_rows, group)
    attn.num_heads, attn.num_kv_heads = heads, kv_heads
    attn.sizes = (heads * d, kv_heads * d, kv_heads * d)


def _kv_heads_of(attn: Attention, rank: int, world: int) -> tuple[int, int]:
    """(first KV head, count) that rank ``rank``'s query heads read."""
    if attn.num_kv_heads >= world:
        count = attn.num_kv_heads // world
        return rank * count, count
    group_size = attn.num_heads // attn.num_kv_heads
    return rank * (attn.num_heads // world) // group_size, 1


def _shard_mlp(mlp: GatedMLP, group: TPGroup) -> None:
    inter = mlp.down_proj.in_features
    part = inter // group.world
    start = group.rank * part
    rows = torch.cat([_rows(0, start, part), _rows(inter, start, part)])
    mlp.gate_up_proj = _take_rows(mlp.gate_up_proj, rows)
    mlp.down_proj = _row_parallel(mlp.down_proj, _rows(0, start, part), group)


def _shard_experts(experts: Experts, group: TPGroup) -> None:
    inter = experts.down_proj.shape[2]
    part = inter // group.world
    start = group.rank * part
    rows = torch.cat([_rows(0, start, part), _rows(inter, start, part)])
    rows = rows.to(experts.gate_up_proj.device)
    experts.gate_up_proj = nn.Parameter(experts.gate_up_proj.data[:, rows], requires_grad=False)
    down = experts.down_proj.data[:, :, start : start + part].contiguous()
    experts.down_proj = nn.Parameter(down, requires_grad=False)
    experts.tp_group = group


def _shard_vocab(model: nn.Module, group: TPGroup) -> None:
    vocab = model.config.vocab_size
    shard = -(-vocab // group.world)
    start = group.rank * shard
    tied = model.lm_head.weight is model.embed_tokens.weight
    embed = _vocab_rows(model.embed_tokens.weight, start, shard)
    model.embed_tokens = VocabParallelEmbedding(embed, start, group)
    head = embed if tied else _vocab_rows(model.lm_head.weight, start, shard)
    model.lm_head = ParallelLMHead(head, vocab, group)


def _rows(offset: int, start: int, count: int) -> torch.Tensor:
    return torch.arange(offset + start, offset + start + count)


def _take_rows(linear: nn.Linear, rows: torch.Tensor) -> nn.Linear:
    rows = rows.to(linear.weight.device)
    linear.weight = nn.Parameter(linear.weight.data[rows], requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.data[rows], requires_grad=False)
    linear.out_features = rows.numel()
    return linear


def _row_parallel(linear: nn.Linear, cols: torch.Tensor, group: TPGroup) -> RowParallelLinear:
    weight = linear.weight.data[:, cols.to(linear.weight.device)].contiguous()
    bias = None if linear.bias is None else linear.bias.data
    return RowParallelLinear(weight, bias, group)


def _vocab_rows(weight: torch.Tensor, start: int, shard: int) -> nn.Parameter:
    rows = weight.data[start : start + shard]
    if rows.shape[0] < shard:
        pad = rows.new_zeros(shard - rows.shape[0], rows.shape[1])
        rows = torch.cat([rows, pad])
    return nn.Parameter(rows.clone(), requires_grad=False)
