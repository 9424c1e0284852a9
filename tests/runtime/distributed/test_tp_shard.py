"""The sharding transform on its own: every rank of a simulated group (threads standing in for
processes) computes its shard, and together they reproduce the plain model's logits."""

from __future__ import annotations

import threading

import pytest
import torch

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.distributed.placement import check_tp_size
from radixlm.runtime.distributed.shard import local_heads, shard_model
from radixlm.runtime.executor.attention.base import create_attention_backend
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.mem_cache.memory_pool import KVPool
from radixlm.runtime.models.llama import LlamaForCausalLM

PROMPT = [5, 17, 3, 99, 42, 7, 64, 1, 88, 23]


class ThreadGroup:
    """The TPGroup collectives over threads of one process."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=60)
        self.slots: list[torch.Tensor | None] = [None] * world

    def rank_view(self, rank: int) -> _RankView:
        return _RankView(self, rank)

    def exchange(self, rank: int, x: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = x.clone()
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class _RankView:
    def __init__(self, shared: ThreadGroup, rank: int) -> None:
        self.shared, self.rank, self.world = shared, rank, shared.world
        self.device = torch.device("cpu")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        x.copy_(sum(self.shared.exchange(self.rank, x)))
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(self.shared.exchange(self.rank, x), dim=-1)


def tiny_config(**kw) -> ModelConfig:
    base = dict(
        architecture="LlamaForCausalLM",
        hidden_size=48,
        intermediate_size=96,
        num_layers=2,
        num_heads=6,
        num_kv_heads=2,
        head_dim=8,
        vocab_size=101,
    )
    return ModelConfig(**{**base, **kw})


def random_model(config: ModelConfig) -> LlamaForCausalLM:
    gen = torch.Generator().manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5 if p.dim() == 1 else 0.2, generator=gen)
    return model


def logits_of(model: LlamaForCausalLM, heads: int, kv_heads: int) -> torch.Tensor:
    c = model.config
    pool = KVPool(64, c.num_layers, kv_heads, c.head_dim, torch.float32, torch.device("cpu"))
    backend = create_attention_backend(
        "torch", kv_pool=pool, num_heads=heads, num_kv_heads=kv_heads, head_dim=c.head_dim
    )
    table = torch.zeros(1, 64, dtype=torch.int64)
    table[0, : len(PROMPT)] = torch.arange(1, len(PROMPT) + 1)
    batch = ForwardBatch.build(
        PROMPT, [0], [len(PROMPT)], [0], table[0, : len(PROMPT)], list(range(len(PROMPT))), table
    )
    with torch.inference_mode():
        backend.prepare(batch)
        return model(batch, backend)


def sharded_logits(config: ModelConfig, world: int) -> list[torch.Tensor]:
    group, out = ThreadGroup(world), [None] * world
    heads, kv_heads = local_heads(config, world)

    def run(rank: int) -> None:
        model = shard_model(random_model(config), group.rank_view(rank))
        out[rank] = logits_of(model, heads, kv_heads)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize(
    "world, overrides",
    [
        (2, {}),  # KV heads split
        (3, {"num_kv_heads": 1}),  # fewer KV heads than ranks: replicated; vocab padded
        (6, {}),  # one query head per rank, each KV head on three ranks
        (2, {"tie_word_embeddings": True}),
        (3, {"num_kv_heads": 3, "attention_bias": True, "qk_norm": True}),
    ],
)
def test_sharded_ranks_reproduce_the_plain_model(world, overrides):
    config = tiny_config(**overrides)
    expected = logits_of(random_model(config), config.num_heads, config.num_kv_heads)
    for logits in sharded_logits(config, world):
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_tied_embedding_stays_one_tensor():
    group = ThreadGroup(1).rank_view(0)
    model = shard_model(random_model(tiny_config(tie_word_embeddings=True)), group)
    assert model.lm_head.weight is model.embed_tokens.weight


@pytest.mark.parametrize(
    "tp_size, overrides",
    [(4, {}), (5, {"num_heads": 5, "num_kv_heads": 5}), (2, {"intermediate_size": 97})],
)
def test_tp_size_that_does_not_divide_the_model_is_refused(tp_size, overrides):
    with pytest.raises(ValueError, match=f"tp_size={tp_size}"):
        check_tp_size(tiny_config(**overrides), tp_size)
