"""Speculative decoding from lookups: draft tokens, verify them in the step's forward pass.

A decoding request drafts what the radix tree holds after its tokens (the continuation another
request already produced from the same prefix); else, when its last ``n`` tokens (``n`` from
``--spec-ngram-max`` down to ``--spec-ngram-min``) occurred earlier in its own prompt or
output, the tokens that followed that occurrence. The step runs the request's last token and
the draft as one extend chunk with logits at every position; the longest prefix of the draft
that the model's own greedy choices agree with is kept, plus the model's next token, so the
output is exactly what plain greedy decoding gives; a sampling request keeps each draft token
with its probability and resamples the first rejected one (the standard rule), so its tokens
have plain sampling's distribution. Only requests without penalties, banned tokens or
logprobs speculate (their next token depends on the raw logits alone); the others decode as
always in the same step. Each request adapts its draft length to how much of its drafts was
accepted.

A greedy request with a grammar drafts too: its draft is cut where the grammar forbids a
token, and each position's token is the grammar's choice: the model's top token where the
grammar allows it (then it is also the top allowed token), else the top token under the
grammar's mask for that position (filled only for such positions). A draft token is kept
only when exactly it was appended: jump-forward may append the text a grammar forces after a
token, retokenized with it, and that text is not in the draft. Sampling requests with
grammars do not draft (the rejection rule would need every position's mask).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixlm.runtime.constrained.base import allocate_bitmask, apply_bitmask
from radixlm.runtime.messages import Sampling
from radixlm.runtime.sampling.sampler import filtered_probs
from radixlm.runtime.scheduler.req import salted

# NOTE: a drafted step costs more the more tokens it verifies: with compiled CPU steps
# (SmolLM2-135M, 1 thread, 300 tokens of context) 2, 3, 4, 5 and 8 tokens take 1.30, 1.53,
# 1.91, 2.66 and 3.44 times a one-token step (past 4 rows the int8 head reads its codes twice).
# Below perfect acceptance, 4 is where a longer draft stops paying.
MAX_STEP_TOKENS = 4
# NOTE: in a batch a token is cheaper (2 requests: 17.2 ms a step, 8.6 ms a token) while a draft
# token costs about as much as alone (~4 ms). Measured (bench_spec, 4 streams): drafting beside
# other requests, even only while a request kept over 60% of its drafts, was 0.94x, 0.94x and
# 0.89x of not drafting; so only a step with one decoding request drafts (the threshold on
# this CPU: a second request).
MAX_DRAFTING_BATCH = 1


@dataclass
class DraftState:
    """One request's n-gram index and draft length."""

    k: int
    index: list[dict[tuple[int, ...], int]] = field(default_factory=list)  # per n: gram -> end
    indexed: int = 0  # tokens whose n-grams ending there are indexed
    pause: int = 0  # decode steps left without drafting
    misses: int = 0  # drafts in a row of which nothing was accepted

    def update(self, drafted: int, accepted: int, k_max: int) -> None:
        """Grow after a fully kept draft, shrink to what was kept otherwise; after drafts that
        keep nothing, pause for a while (longer each time): a verify step costs more than a
        decode step, so a request whose text is not predictable stops paying for it."""
        self.k = min(k_max, self.k + 1) if accepted == drafted else max(1, accepted + 1)
        self.misses = 0 if accepted else self.misses + 1
        if self.misses >= 2:
            self.pause = min(64, 4 << (self.misses - 2))

    def ready(self) -> bool:
        """Whether to draft this step (counts down a pause)."""
        if self.pause:
            self.pause -= 1
            return False
        return True


class NgramDrafter:
    def __init__(self, num_draft_tokens: int, n_max: int, n_min: int) -> None:
        self.k_max = num_draft_tokens
        self.n_max = n_max
        self.n_min = n_min

    @staticmethod
    def eligible(params: Sampling, banned: list[int], has_grammar: bool, logprobs: bool) -> bool:
        """The next token depends on the raw logits only (no penalties or banned tokens;
        grammars only for greedy requests): the verification sees the same distribution as a
        plain step."""
        return (
            params.speculative
            and params.custom_logit_processor is None
            and params.repetition_penalty == 1.0
            and params.frequency_penalty == 0.0
            and params.presence_penalty == 0.0
            and not params.logit_bias
            and not banned
            and (not has_grammar or params.is_greedy)
            and not logprobs
        )

    def propose(self, state: DraftState | None, ids: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest suffix
        of ``ids`` (``n_max`` .. ``n_min`` tokens) in ``ids``."""
        self._index(state, ids)
        for n in range(self.n_max, self.n_min - 1, -1):
            if len(ids) <= n:
                continue
            end = state.index[n - self.n_min].get(tuple(ids[-n:]))
            if end is not None:
                return ids[end : end + k]
        return []

    def _index(self, state: DraftState, ids: list[int]) -> None:
        """Index the n-grams ending before the last token (the suffix must not find itself)."""
        if not state.index:
            state.index = [{} for _ in range(self.n_min, self.n_max + 1)]
        for end in range(max(state.indexed, 1), len(ids)):
            for n in range(self.n_min, self.n_max + 1):
                if end >= n:
                    state.index[n - self.n_min][tuple(ids[end - n : end])] = end
        state.indexed = len(ids)


@dataclass
class SpecStats:
    steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accept_lengths: dict[int, int] = field(default_factory=dict)  # accepted per draft -> count

    def record(self, drafted: int, accepted: int) -> None:
        self.steps += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        self.accept_lengths[accepted] = self.accept_lengths.get(accepted, 0) + 1

    def as_dict(self) -> dict:
        return {
            "spec_steps": self.steps,
            "spec_draft_tokens": self.draft_tokens,
            "spec_accepted_tokens": self.accepted_tokens,
            "spec_accept_lengths": {str(k): v for k, v in sorted(self.accept_lengths.items())},
        }


class Speculator:
    """Adds drafts to a step's decode chunks and verifies them after the forward pass."""

    def __init__(self, num_draft_tokens: int, n_max: int, n_min: int) -> None:
        self.drafter = NgramDrafter(num_draft_tokens, n_max, n_min)
        self.stats = SpecStats()

    def draft(self, chunks: list, cache, stop, context_len: int) -> None:
        """Give eligible decode chunks a draft and its KV slots, within ``MAX_STEP_TOKENS``,
        in steps of at most ``MAX_DRAFTING_BATCH`` decoding requests."""
        if len(chunks) > MAX_DRAFTING_BATCH:
            return
        budget = MAX_STEP_TOKENS - len(chunks)
        for chunk in chunks:
            req = chunk.req
            if budget <= 0:
                return
            banned = stop.banned_ids(req)
            if not self.drafter.eligible(req.params, banned, req.grammar is not None,
                                         req.logprob is not None):  # fmt: skip
                continue
            req.spec = req.spec or DraftState(self.drafter.k_max)
            if not req.spec.ready():
                continue
            room = min(req.params.max_new_tokens - len(req.output_ids),
                       context_len - req.seq_len) - 1  # fmt: skip
            k = min(req.spec.k, budget, room)
            draft = self._propose(req, k, cache.tree) if k > 0 else []
            if req.grammar is not None:
                draft = _allowed_prefix(req.grammar, draft)
            slots = cache.alloc(len(draft)) if draft else None
            if slots is None:
                continue
            chunk.draft, chunk.slots = draft, torch.cat([chunk.slots, slots])
            budget -= len(draft)

    def _propose(self, req, k: int, tree) -> list[int]:
        """What the radix tree holds after this request's tokens (another request's output for
        the same prefix), else an n-gram draft from its own tokens."""
        ids = req.fill_ids  # NOTE: built once per step; the tree key is these ids salted
        if tree is not None:
            draft = tree.continuation(salted(ids, req.salt), k)
            if draft:
                return [t - req.salt for t in draft]
        return self.drafter.propose(req.spec, ids, k)

    @staticmethod
    def _sampled(req, logits: torch.Tensor, draft: list[int]) -> list[int]:
        """Speculative sampling with a deterministic draft: draft token ``d`` is kept with
        probability ``p(d)``; at the first rejection the token comes from ``p`` without ``d``
        (renormalised); after a fully kept draft one more comes from ``p``. The tokens are then
        distributed exactly as plain sampling's. A seeded request draws from a generator keyed
        by (seed, output length), so its output is reproducible."""
        probs = filtered_probs(logits.float(), [req.params] * len(logits))
        probs = probs / probs.sum(dim=-1, keepdim=True)  # NOTE: the filters only zero entries
        gen = None
        if req.params.sampling_seed is not None:
            gen = torch.Generator(device=probs.device)
            gen.manual_seed(hash((req.params.sampling_seed, len(req.output_ids))) & (2**63 - 1))
        out: list[int] = []
        for j, d in enumerate(draft):
            p = probs[j]
            if torch.rand((), generator=gen, device=p.device) < p[d]:
                out.append(d)
                continue
            p = p.clone()
            p[d] = 0.0
            out.append(int(torch.multinomial(p / p.sum(), 1, generator=gen)))
            return out
        out.append(int(torch.multinomial(probs[len(draft)], 1, generator=gen)))
        return out

    def verify(self, chunk, logits: torch.Tensor, stop, advance, cache) -> None:
        """Append the model's greedy tokens while they agree with the draft (and one more);
        free the KV slots of the draft positions that were not kept."""
        req, draft = chunk.req, chunk.draft
        last = req.kv_len - 1  # NOTE: kv_len already counts the request's last token
        kept = 0
        tokens = logits.argmax(dim=-1).tolist() if req.params.is_greedy else self._sampled(
            req, logits, draft
        )
        for j, token in enumerate(tokens):
            if req.grammar is not None and not _allowed_prefix(req.grammar, [token]):
                token = _masked_greedy(req.grammar, logits[j])
            new_ids = advance(req, token)
            req.output_ids.extend(new_ids)
            req.finish = stop.check(req, new_ids[-1])
            # NOTE: jump-forward may append other ids than the token (forced text after it,
            # retokenized): the draft's KV holds only when exactly its token was appended
            if req.finish is not None or j == len(draft) or new_ids != [draft[j]]:
                break
            kept += 1
        req.kv_len += kept
        unused = cache.req_pool.table[req.slot, req.kv_len : last + 1 + len(draft)]
        cache.allocator.free(unused.cpu())
        self.stats.record(len(draft), kept)
        req.spec.update(len(draft), kept, self.drafter.k_max)


def _allowed_prefix(grammar, draft: list[int]) -> list[int]:
    """The longest prefix of ``draft`` that ``grammar`` accepts (its state is left as it was)."""
    accepted = 0
    for token in draft:
        if grammar.is_terminated():
            break
        try:
            grammar.advance(token)
        except ValueError:
            break
        accepted += 1
    if accepted:
        grammar.rollback(accepted)
    return draft[:accepted]


def _masked_greedy(grammar, logits: torch.Tensor) -> int:
    """The top token among those ``grammar`` allows next."""
    mask = allocate_bitmask(1, logits.shape[-1])
    grammar.fill_bitmask(mask, 0)
    row = logits[None].clone()
    apply_bitmask(row, mask)
    return int(row.argmax(dim=-1))
