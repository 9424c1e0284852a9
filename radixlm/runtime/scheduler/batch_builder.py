"""Turn a StepPlan into the ForwardBatch the model runner consumes."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.mem_cache.cache_manager import CacheManager
from radixlm.runtime.scheduler.admission import StepPlan
from radixlm.runtime.scheduler.req import Req


@dataclass
class LogitRows:
    """Which logits rows belong to which request: prompt-logprob positions and the sample row."""

    req: Req
    prompt_positions: list[int]  # positions q whose logits score prompt token q + 1
    prompt_rows: list[int]
    sample_row: int | None
    draft_rows: list[int] = field(default_factory=list)  # a drafted decode: every position


def build_batch(plan: StepPlan, cache: CacheManager) -> tuple[ForwardBatch, list[LogitRows]]:
    input_ids: list[int] = []
    logits_indices: list[int] = []
    rows: list[LogitRows] = []
    for chunk in plan.chunks:
        req, n = chunk.req, chunk.num_tokens
        cache.assign(req, chunk.slots)
        start = len(input_ids)
        input_ids.extend(req.tokens(req.kv_len, req.kv_len + n) + chunk.draft)
        positions = _prompt_logprob_positions(req, n)
        info = LogitRows(req, positions, [], None)
        if chunk.draft:
            info.draft_rows = list(range(len(logits_indices), len(logits_indices) + chunk.width))
            logits_indices.extend(range(start, start + chunk.width))
            rows.append(info)
            continue
        for q in positions:
            info.prompt_rows.append(len(logits_indices))
            logits_indices.append(start + q - req.kv_len)
        if req.kv_len + n == req.seq_len:
            info.sample_row = len(logits_indices)
            logits_indices.append(start + n - 1)
        rows.append(info)
    batch = ForwardBatch.build(
        input_ids=input_ids,
        prefix_lens=[c.req.kv_len for c in plan.chunks],
        extend_lens=[c.width for c in plan.chunks],
        req_slots=[c.req.slot for c in plan.chunks],
        out_cache_loc=torch.cat([c.slots for c in plan.chunks]),
        logits_indices=logits_indices,
        req_to_token=cache.req_pool.table,
    )
    return batch, rows


def _prompt_logprob_positions(req: Req, n: int) -> list[int]:
    lp = req.logprob
    if lp is None or lp.start_len < 0 or req.output_ids:
        return []
    lo = max(max(lp.start_len, 1) - 1, req.kv_len)
    hi = min(len(req.input_ids) - 2, req.kv_len + n - 1)
    return list(range(lo, hi + 1))
