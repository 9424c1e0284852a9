"""Mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): a router picks each token's
top-k experts; the experts' weights are stacked, ``[E, 2I, H]`` gate/up and ``[E, H, I]`` down.

The grouped path sorts the (token, expert) pairs by expert and runs one gate/up and one down
GEMM per expert that has tokens, then sums each token's k outputs, weighted, with one
``index_add``: a Python loop over the active experts (at most E a layer), never over tokens.
Each token's outputs are added in ascending expert order, as Hugging Face adds them, so float32
results match it bit for bit.

Under tensor parallelism every rank holds every expert's slice of the intermediate dimension
(``distributed/shard.py``); the partial outputs are summed across ranks here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.models.layers import GatedMLP, activation


class Experts(nn.Module):
    def __init__(self, num_experts: int, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.act = activation(act)
        self.tp_group = None  # NOTE: set when sharded: the outputs are partial sums

    @property
    def num_experts(self) -> int:
        return self.gate_up_proj.shape[0]

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(self.act(gate) * up, self.down_proj[e])

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x ``[T, H]``, each token's top-k routing weights (float32) and experts ``[T, k]``."""
        k = ids.shape[1]
        order = ids.reshape(-1).argsort(stable=True)  # NOTE: pairs by expert, then by token
        tokens = order // k
        counts = torch.bincount(ids.reshape(-1), minlength=self.num_experts).tolist()
        rows = x.index_select(0, tokens)
        out = torch.empty_like(rows)
        start = 0
        for e, n in enumerate(counts):
            if n:
                out[start : start + n] = self.expert(e, rows[start : start + n])
                start += n
        out = (out * weights.reshape(-1)[order, None]).to(x.dtype)
        y = torch.zeros_like(x).index_add_(0, tokens, out)
        return y if self.tp_group is None else self.tp_group.all_reduce(y)


class SparseMoE(nn.Module):
    """Router (``gate``), experts, and Qwen2-MoE's shared expert scaled by a sigmoid gate.

    Routing as the models define it: softmax over all experts in float32, the top k, and
    (``norm_topk_prob``: Mixtral always, the others by their config) the k weights renormalised
    to sum to 1."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, experts = config.hidden_size, config.num_experts
        self.top_k, self.renormalize = config.experts_per_tok, config.norm_topk_prob
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = Experts(experts, hidden, config.moe_intermediate_size, config.hidden_act)
        shared = config.shared_expert_intermediate_size
        self.shared_expert = GatedMLP(hidden, shared, config.hidden_act) if shared else None
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False) if shared else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = self.gate(x).float().softmax(dim=-1)
        weights, ids = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, *self.route(x))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


def loop_experts(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """The same layer one (token, expert) pair at a time: the reference the grouped path is
    tested and benchmarked against (``benchmarks/bench_moe.py``)."""
    weights, ids = moe.route(x)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            out[t] += (moe.experts.expert(e, x[t : t + 1])[0] * weights[t, j]).to(x.dtype)
    if moe.shared_expert is not None:
        out = out + torch.sigmoid(moe.shared_expert_gate(x)) * moe.shared_expert(x)
    return out
