"""The segmented mixed-adapter update equals its row-by-row torch twin."""

from __future__ import annotations

import torch

from radixlm.runtime.lora.adapter import LoraPair, TargetShape
from radixlm.runtime.lora.batched import add_lora, add_lora_masked, ref_lora_delta, segments
from radixlm.runtime.lora.manager import LoraStack


def _stack_of_two():
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
    return stack, adapters


def test_segmented_update_equals_row_by_row():
    stack, adapters = _stack_of_two()
    # NOTE: requests of 2, 1, 3, 1, 2 rows: slot 0 twice (not adjacent), the base twice
    slots, lengths = [0, -1, 2, 0, -1], [2, 1, 3, 1, 2]
    row_slots = [s for s, n in zip(slots, lengths) for _ in range(n)]
    x = torch.randn(len(row_slots), 12)
    base = torch.randn(len(row_slots), 16)
    groups = segments(slots, lengths, x.device)
    assert sorted(g.slot for g in groups) == [0, 2]
    got = add_lora(base.clone(), x, stack.a, stack.b, stack.width, groups)
    want = base + ref_lora_delta(x, [adapters.get(s) for s in row_slots], 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[2], base[2]) and torch.equal(got[7:], base[7:])  # base rows
    assert not torch.allclose(got[0], base[0])


def test_writing_a_slot_again_replaces_it():
    shape = TargetShape(6, (6,))
    stack = LoraStack(shape, slots=2, max_rank=4, dtype=torch.float32, device="cpu")
    stack.write(1, [LoraPair(-1, torch.ones(4, 6), torch.ones(6, 4))])
    stack.write(1, [LoraPair(-1, torch.ones(2, 6), torch.ones(6, 2))])
    x = torch.ones(1, 6)
    got = add_lora(torch.zeros(1, 6), x, stack.a, stack.b, stack.width, segments([1], [1], "cpu"))
    torch.testing.assert_close(got, torch.full((1, 6), 12.0))


def test_masked_form_over_the_present_slots_equals_row_by_row():
    from radixlm.runtime.lora.manager import LoraRows

    stack, adapters = _stack_of_two()
    slots, lengths = [2, -1, 2, 0], [1, 1, 1, 1]
    x, base = torch.randn(4, 12), torch.randn(4, 16)
    rows = LoraRows(slots, lengths, "cpu")
    cols = slice(rows.lo * stack.width, (rows.hi + 1) * stack.width)
    mask = rows.mask(stack.width, x.dtype)
    got = add_lora_masked(base.clone(), x, stack.a[cols], stack.b[:, cols], mask)
    want = base + ref_lora_delta(x, [adapters.get(s) for s in slots], 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
