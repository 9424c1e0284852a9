"""Turning logits into token ids: penalties, logit bias, grammar masks, custom logit
processors, temperature, top-k/p, min-p, seeds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixlm.kernels import cpu_ops
from radixlm.runtime.messages import Sampling
from radixlm.runtime.sampling import penalties
from radixlm.runtime.sampling.custom_logit_processor import apply_processors


@dataclass
class SampleRow:
    """What the sampler needs to know about one row of logits."""

    params: Sampling
    prompt_ids: list[int]
    output_ids: list[int]
    banned_ids: list[int]  # stop tokens not yet allowed (min_new_tokens)
    token_ids: list[int] | None = None  # ids whose logprobs to report (token_ids_logprob)
    req: Any = None  # the scheduler's request: a custom logit processor's "__req__"


@dataclass
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[float, int]]] | None
    id_logprobs: list[list[tuple[float, int]]] | None = None  # per row: the asked ids' logprobs
    errors: dict[int, str] | None = None  # rows whose custom logit processor failed


def sample(
    logits: torch.Tensor,
    rows: list[SampleRow],
    bitmask: torch.Tensor | None = None,
    top_n: int = 0,
    with_logprobs: bool = True,
) -> SampleOutput:
    """Pick one token per row. ``logits`` is ``[B, V]`` float32 and may be modified in place.

    Without ``with_logprobs`` (and ``top_n``) no log-softmax over the vocabulary is computed and
    ``logprobs`` is empty: a decode step that reports none skips a ``[B, V]`` pass.
    """
    logprobs_all = torch.log_softmax(logits, dim=-1) if with_logprobs or top_n else None
    logits = _apply_penalties(logits, rows)
    banned = [(i, r.banned_ids) for i, r in enumerate(rows) if r.banned_ids]
    if banned:
        penalties.ban_tokens(logits, *map(list, zip(*banned)))
    if bitmask is not None:
        from radixlm.runtime.constrained.base import apply_bitmask

        apply_bitmask(logits, bitmask)
    errors = None
    if any(r.params.custom_logit_processor is not None for r in rows):
        logits, errors = apply_processors(logits, rows)
    ids = _choose(logits, rows)
    if logprobs_all is None:
        return SampleOutput(ids.tolist(), [], None, errors=errors)
    chosen = logprobs_all.gather(1, ids[:, None]).squeeze(1)
    top = None
    if top_n > 0:
        values, indices = logprobs_all.topk(top_n, dim=-1)
        top = [list(zip(v, i)) for v, i in zip(values.tolist(), indices.tolist())]
    asked = None
    if any(r.token_ids for r in rows):
        asked = [list(zip(logprobs_all[i, r.token_ids].tolist(), r.token_ids)) if r.token_ids
                 else [] for i, r in enumerate(rows)]  # fmt: skip
    return SampleOutput(ids.tolist(), chosen.tolist(), top, asked, errors)


def _apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    freq = [r.params.frequency_penalty for r in rows]
    pres = [r.params.presence_penalty for r in rows]
    rep = [r.params.repetition_penalty for r in rows]
    vocab, device = logits.shape[1], logits.device
    if any(freq) or any(pres):
        counts = penalties.token_counts([r.output_ids for r in rows], vocab, device)
        logits = penalties.apply_frequency_presence(
            logits, counts, torch.tensor(freq, device=device), torch.tensor(pres, device=device)
        )
    if any(p != 1.0 for p in rep):
        seen = (
            penalties.token_counts([r.prompt_ids + r.output_ids for r in rows], vocab, device) > 0
        )
        logits = penalties.apply_repetition(logits, seen, torch.tensor(rep, device=device))
    if any(r.params.logit_bias for r in rows):
        logits = penalties.add_logit_bias(logits, [r.params.logit_bias for r in rows])
    return logits


def _choose(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    greedy = _argmax(logits)
    sampled_rows = [i for i, r in enumerate(rows) if not r.params.is_greedy]
    if not sampled_rows:
        return greedy
    idx = torch.tensor(sampled_rows, device=logits.device)
    sub = [rows[i].params for i in sampled_rows]
    probs = filtered_probs(logits[idx], sub)
    noise = _exponential_noise(probs.shape, [rows[i] for i in sampled_rows], logits.device)
    greedy[idx] = (probs / noise).argmax(dim=-1)
    return greedy


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax; on CPU through the vectorised kernel once it is loaded (torch's takes
    ~1.5 ms of a batch-32 step: ``kernels/cpu_ops.py``)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and cpu_ops.loaded():
        return cpu_ops.argmax(logits)
    return logits.argmax(dim=-1)


def filtered_probs(logits: torch.Tensor, params: list[Sampling]) -> torch.Tensor:
    """Softmax at each row's temperature, then top-k, top-p and min-p filtering."""
    device = logits.device
    temps = torch.tensor([p.temperature for p in params], device=device)[:, None]
    probs = torch.softmax(logits / temps, dim=-1)
    top_k = [p.top_k for p in params]
    if any(k > 0 for k in top_k):
        probs = top_k_filter(probs, torch.tensor([k if k > 0 else probs.shape[1] for k in top_k]))
    top_p = [p.top_p for p in params]
    if any(p < 1.0 for p in top_p):
        probs = top_p_filter(probs, torch.tensor(top_p, device=device))
    min_p = [p.min_p for p in params]
    if any(p > 0.0 for p in min_p):
        probs = min_p_filter(probs, torch.tensor(min_p, device=device))
    return probs


def top_k_filter(probs: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    sorted_probs = probs.sort(dim=-1, descending=True).values
    kth = sorted_probs.gather(1, (k.to(probs.device) - 1).clamp(max=probs.shape[1] - 1)[:, None])
    return torch.where(probs >= kth, probs, 0.0)


def top_p_filter(probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    total = sorted_probs.sum(dim=-1, keepdim=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep_sorted = before < p[:, None] * total
    keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    return torch.where(keep, probs, 0.0)


def min_p_filter(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    threshold = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
    return torch.where(probs >= threshold, probs, 0.0)


def _exponential_noise(
    shape: torch.Size, rows: list[SampleRow], device: torch.device
) -> torch.Tensor:
    """Exp(1) noise; ``probs / noise`` argmax is a sample. Seeded rows use a generator keyed by
    (seed, step), so their tokens do not depend on the rest of the batch."""
    noise = torch.empty(shape, device=device).exponential_()
    for i, r in enumerate(rows):
        seed = r.params.sampling_seed
        if seed is not None:
            gen = torch.Generator(device=device).manual_seed(
                (seed * 1_000_003 + len(r.output_ids)) % 2**63
            )
            noise[i] = torch.empty(shape[1], device=device).exponential_(generator=gen)
    return noise
