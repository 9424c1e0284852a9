"""The plain data object the scheduler hands to the model runner for one forward pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ForwardBatch:
    """One ragged batch: every request contributes ``extend_len`` new tokens on top of its
    ``prefix_len`` already-computed ones (a decode step is an extend of length 1).

    Token-level tensors have length ``T = sum(extend_lens)``; request-level ones length ``B``.
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64 KV slots the new tokens write
    req_slots: torch.Tensor  # [B] int64 rows of req_to_token
    prefix_lens: torch.Tensor  # [B] int64
    extend_lens: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64 = prefix + extend
    logits_indices: torch.Tensor  # [N] rows of the hidden states that need logits
    req_to_token: torch.Tensor  # [max_requests, context_len] the pool's table
    extend_lens_list: list[int] = field(default_factory=list)
    seq_lens_list: list[int] = field(default_factory=list)
    attn_meta: Any = None  # filled by the attention backend's prepare()
    lora_slots: list[int] | None = None  # [B] each request's LoRA slot (-1: base); None: none
    # NOTE: a step with embedding requests keeps every token's final-normed hidden state in
    # ``hidden`` ([T, hidden_size] float32)
    keep_hidden: bool = False
    hidden: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.req_slots.shape[0]

    @property
    def is_decode(self) -> bool:
        return all(n == 1 for n in self.extend_lens_list)

    @classmethod
    def build(
        cls,
        input_ids: list[int],
        prefix_lens: list[int],
        extend_lens: list[int],
        req_slots: list[int],
        out_cache_loc: torch.Tensor,
        logits_indices: list[int],
        req_to_token: torch.Tensor,
    ) -> ForwardBatch:
        """Build from Python lists; positions run from each prefix length."""
        device = req_to_token.device
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
        positions = torch.cat(
            [torch.arange(p, s, dtype=torch.int64) for p, s in zip(prefix_lens, seq_lens)]
        )

        def t(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int64, device=device)

        return cls(
            input_ids=t(input_ids),
            positions=positions.to(device),
            out_cache_loc=out_cache_loc.to(device),
            req_slots=t(req_slots),
            prefix_lens=t(prefix_lens),
            extend_lens=t(extend_lens),
            seq_lens=t(seq_lens),
            logits_indices=t(logits_indices),
            req_to_token=req_to_token,
            extend_lens_list=list(extend_lens),
            seq_lens_list=seq_lens,
        )
