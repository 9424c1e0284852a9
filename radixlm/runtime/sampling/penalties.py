"""Logit penalties as pure tensor functions (all shapes ``[B, V]``)."""

from __future__ import annotations

import torch


def token_counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """``[B, V]`` float counts of each token id in each row's list."""
    counts = torch.zeros(len(token_lists), vocab, dtype=torch.float32, device=device)
    for row, ids in enumerate(token_lists):
        if ids:
            idx = torch.tensor(ids, dtype=torch.int64, device=device)
            counts[row].scatter_add_(0, idx, torch.ones_like(idx, dtype=torch.float32))
    return counts


def apply_frequency_presence(
    logits: torch.Tensor,
    output_counts: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
) -> torch.Tensor:
    """OpenAI semantics over the generated tokens: ``- f * count - p * (count > 0)``."""
    return logits - frequency[:, None] * output_counts - presence[:, None] * (output_counts > 0)


def apply_repetition(
    logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """CTRL / Hugging Face semantics over prompt and output tokens: positive logits are divided
    by the penalty, negative ones multiplied."""
    p = penalty[:, None]
    scaled = torch.where(logits > 0, logits / p, logits * p)
    return torch.where(seen, scaled, logits)


def ban_tokens(logits: torch.Tensor, rows: list[int], token_ids: list[list[int]]) -> torch.Tensor:
    """Set the listed token ids of the listed rows to -inf (used for min_new_tokens)."""
    for row, ids in zip(rows, token_ids):
        logits[row, ids] = float("-inf")
    return logits


def add_logit_bias(logits: torch.Tensor, biases: list[dict[int, float]]) -> torch.Tensor:
    """Add each row's ``{token id: bias}`` to its logits, in one indexed add over the batch."""
    rows = [row for row, bias in enumerate(biases) for _ in bias]
    if not rows:
        return logits
    cols = [token for bias in biases for token in bias]
    values = [value for bias in biases for value in bias.values()]
    device = logits.device
    index = (torch.tensor(rows, device=device), torch.tensor(cols, device=device))
    return logits.index_put_(index, torch.tensor(values, dtype=logits.dtype, device=device),
                             accumulate=True)  # fmt: skip
