"""Bitmask layout and apply_bitmask, including logits wider than the mask."""

from __future__ import annotations

import torch

from radixlm.runtime.constrained.base import allocate_bitmask, apply_bitmask, unpack_bitmask


def test_allocate_allows_everything():
    bitmask = allocate_bitmask(3, 70)
    assert bitmask.shape == (3, 3) and bitmask.dtype == torch.int32
    assert unpack_bitmask(bitmask, 70).all()


def test_bit_j_of_word_i_is_token_32i_plus_j():
    bitmask = torch.zeros(1, 2, dtype=torch.int32)
    bitmask[0, 0] = -(2**31)
    bitmask[0, 1] = 0b101
    assert torch.nonzero(unpack_bitmask(bitmask, 64)[0]).flatten().tolist() == [31, 32, 34]


def test_apply_masks_in_place_and_disallows_tokens_past_the_mask():
    bitmask = allocate_bitmask(2, 64)
    bitmask[1] = 0
    bitmask[1, 1] = 1 << 3
    logits = torch.randn(2, 100)
    original = logits.clone()
    apply_bitmask(logits, bitmask)
    assert torch.equal(logits[0, :64], original[0, :64])
    assert torch.isneginf(logits[:, 64:]).all()
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [35]


def test_apply_on_narrower_logits():
    bitmask = torch.zeros(1, 2, dtype=torch.int32)
    bitmask[0, 0] = 1 << 5
    logits = torch.zeros(1, 40)
    apply_bitmask(logits, bitmask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [5]
