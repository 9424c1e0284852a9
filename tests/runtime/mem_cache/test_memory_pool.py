"""The KV slot allocator's order, and pools whose pages take memory only once written."""

from __future__ import annotations

import torch

from radixlm.runtime.mem_cache.memory_pool import KVPool, SlotAllocator, zeros


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_freed_slots_are_handed_out_before_unused_ones():
    alloc = SlotAllocator(100)
    first = alloc.alloc(10)
    assert first.tolist() == list(range(1, 11))
    alloc.free(first[2:5])
    assert alloc.available == 93
    assert alloc.alloc(4).tolist() == [3, 4, 5, 11]
    assert alloc.alloc(200) is None and alloc.available == 89


def test_cpu_pools_take_memory_as_they_are_written():
    before = rss_bytes()
    table = zeros((1024, 32768), torch.int64, torch.device("cpu"))  # 256 MiB
    assert rss_bytes() - before < 32 << 20
    assert table.shape == (1024, 32768) and not table[::97, ::89].any()
    table[3, :4] = torch.tensor([4, 5, 6, 7])
    assert table[3, :5].tolist() == [4, 5, 6, 7, 0]
    pool = KVPool(1 << 16, 16, 4, 64, torch.bfloat16, torch.device("cpu"))  # 1 GiB
    assert rss_bytes() - before < 64 << 20
    pool.write(15, torch.tensor([9]), torch.ones(1, 4, 64), torch.full((1, 4, 64), 2.0))
    assert pool.k[15][9].eq(1).all() and pool.v[15][9].eq(2).all() and not pool.k[0][9].any()
