"""The two-GEMM mixed-adapter update equals its row-by-row torch twin."""

from __future__ import annotations

import torch

from radixlm.runtime.lora.adapter import LoraPair, TargetShape
from radixlm.runtime.lora.batched import column_mask, lora_delta, ref_lora_delta
from radixlm.runtime.lora.manager import LoraStack


def test_stacked_update_equals_row_by_row():
    torch.manual_seed(0)
    shape = TargetShape(12, (8, 4, 4))  # a fused q/k/v of 8 + 4 + 4 rows
    stack = LoraStack(shape, slots=3, max_rank=4, dtype=torch.float32, device="cpu")
    adapters = {}
    for slot, rank in ((0, 2), (2, 4)):
        pairs = [
            LoraPair(j, torch.randn(rank, 12), torch.randn(shape.shards[j], rank)) for j in (0, 2)
        ]
        stack.write(slot, pairs)
        a = torch.cat([p.a for p in pairs])
        b = torch.zeros(16, 2 * rank)
        b[:8, :rank], b[12:, rank:] = pairs[0].b, pairs[1].b
        adapters[slot] = (a, b)
    row_slots = torch.tensor([0, -1, 2, 2, 0, 1, -1])
    x = torch.randn(len(row_slots), 12)
    got = lora_delta(x, stack.a, stack.b, column_mask(row_slots, 3, stack.width, x.dtype))
    want = ref_lora_delta(x, [adapters.get(int(s)) for s in row_slots])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got[1].abs().max() == 0 and got[5].abs().max() == 0  # base rows, an empty slot
    assert got[0].abs().max() > 0


def test_writing_a_slot_again_replaces_it():
    shape = TargetShape(6, (6,))
    stack = LoraStack(shape, slots=2, max_rank=4, dtype=torch.float32, device="cpu")
    stack.write(1, [LoraPair(-1, torch.ones(4, 6), torch.ones(6, 4))])
    stack.write(1, [LoraPair(-1, torch.ones(2, 6), torch.ones(6, 2))])
    x = torch.ones(1, 6)
    got = lora_delta(x, stack.a, stack.b, column_mask(torch.tensor([1]), 2, stack.width, x.dtype))
    torch.testing.assert_close(got, torch.full((1, 6), 12.0))
