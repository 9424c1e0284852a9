"""Post-processing of one step: stop checks, logprobs, and the messages for the detokenizer."""

from __future__ import annotations

import functools
import re
import time

import torch

from radixlm.runtime.messages import Finish, OutMeta, TokenOut
from radixlm.runtime.sampling.params import STOP_REGEX_WINDOW
from radixlm.runtime.scheduler.batch_builder import LogitRows
from radixlm.runtime.scheduler.req import Req


class StopChecker:
    """Decides whether a request is finished after it received a token."""

    def __init__(self, tokenizer, eos_ids: tuple[int, ...], context_len: int) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = set(eos_ids)
        self.context_len = context_len

    def check(self, req: Req, token: int) -> Finish | None:
        p = req.params
        n = len(req.output_ids)
        if req.grammar is not None and req.grammar.is_terminated():
            return Finish.stop(token if token in self.eos_ids else None)
        if n < p.min_new_tokens:  # NOTE: as SGLang and vLLM: no stop of any kind before it
            return self._length_limit(req, n)
        if (token in self.eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return Finish.stop(token)
        if p.stop:
            matched = self._stop_string(req)
            if matched is not None:
                return Finish.stop(matched)
        if p.stop_regex:
            hit = self._stop_regex(req)
            if hit is not None:
                return Finish.stop(*hit)
        return self._length_limit(req, n)

    def _length_limit(self, req: Req, n: int) -> Finish | None:
        if n >= req.params.max_new_tokens or req.seq_len >= self.context_len:
            return Finish.length_limit(n)
        return None

    def _stop_string(self, req: Req) -> str | None:
        # NOTE: without a tokenizer (skip_tokenizer_init) stop strings are refused on arrival.
        window = max(len(s) for s in req.params.stop) + 8
        tail = self.tokenizer.decode(req.output_ids[-window:], skip_special_tokens=False)
        hits = [(tail.find(s), s) for s in req.params.stop if s in tail]
        return min(hits)[1] if hits else None

    def _stop_regex(self, req: Req) -> tuple[str, str] | None:
        """(pattern, matched text) of the earliest-matching ``stop_regex`` in the recent output:
        SGLang reports the pattern; the output is cut at the text."""
        tail = self.tokenizer.decode(req.output_ids[-STOP_REGEX_WINDOW:], skip_special_tokens=False)
        hits = [(m, p) for p in req.params.stop_regex if (m := _compiled(p).search(tail))]
        if not hits:
            return None
        m, pattern = min(hits, key=lambda h: h[0].start())
        return pattern, m.group(0)

    def banned_ids(self, req: Req) -> list[int]:
        """Stop tokens are not allowed before ``min_new_tokens``."""
        if len(req.output_ids) >= req.params.min_new_tokens:
            return []
        eos = [] if req.params.ignore_eos else sorted(self.eos_ids)
        return eos + list(req.params.stop_token_ids)


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def record_prompt_logprobs(rows: list[LogitRows], logits: torch.Tensor, keep_top: int = 0) -> None:
    """Store the logprob of each prompt token scored in this step and its top alternatives:
    the request's top-n, or ``keep_top`` if more (what the cache keeps for later requests)."""
    wanted = [(info, i) for info in rows for i in range(len(info.prompt_rows))]
    if not wanted:
        return
    index = torch.tensor([info.prompt_rows[i] for info, i in wanted])
    logprobs = torch.log_softmax(logits[index], dim=-1)
    targets = torch.tensor([info.req.fill_ids[info.prompt_positions[i] + 1] for info, i in wanted])
    chosen = logprobs.gather(1, targets[:, None]).squeeze(1).tolist()
    n = max(keep_top, *(info.req.logprob.top_n for info, _ in wanted))
    top = logprobs.topk(n, dim=-1) if n else None
    values, ids = (top.values.tolist(), top.indices.tolist()) if n else ([], [])
    for k, (info, i) in enumerate(wanted):
        entry = list(zip(values[k], ids[k])) if n else None
        lp, q = info.req.logprob, info.prompt_positions[i]
        lp.prompt[q] = (chosen[k], entry)
        lp.fresh.append(q)


def token_out(req: Req) -> TokenOut:
    """The message carrying what ``req`` produced since its last message.

    NOTE: streaming requests get one per step; the others only one, when they finish, so a
    long generation costs the other processes no wake-up per token.
    """
    new_ids = req.output_ids[req.sent_len :]
    start, req.sent_len = req.sent_len, len(req.output_ids)
    meta = OutMeta(len(req.input_ids), len(req.output_ids), req.cached_len)
    lp = req.logprob
    if lp is not None:
        meta.output_token_logprobs = [[p, t] for p, t in zip(lp.output[start:], new_ids)]
        if lp.top_n:
            meta.output_top_logprobs = [[list(e) for e in row] for row in lp.output_top[start:]]
        if lp.token_ids:
            meta.output_token_ids_logprobs = [[list(e) for e in row]
                                              for row in lp.output_ids[start:]]  # fmt: skip
        if not lp.prompt_sent and lp.start_len >= 0:
            _add_prompt_logprobs(req, meta)
            lp.prompt_sent = True
    if req.finish is not None:
        meta.e2e_latency = time.monotonic() - req.created
        if req.pooled is not None:
            meta.embedding = req.pooled.tolist()
        if req.first_token_time is not None:
            meta.first_token_latency = req.first_token_time - req.created
    p = req.params
    return TokenOut(
        rid=req.rid,
        new_ids=new_ids,
        finish=req.finish,
        meta=meta,
        skip_special_tokens=p.skip_special_tokens,
        stop=p.stop,
        no_stop_trim=p.no_stop_trim,
        stream=req.stream,
    )


def _add_prompt_logprobs(req: Req, meta: OutMeta) -> None:
    lp = req.logprob
    start = lp.start_len
    entries, tops = [], []
    for pos in range(start, len(req.input_ids)):
        if pos == 0:
            entries.append([None, req.input_ids[0]])
            tops.append(None)
            continue
        value, top = lp.prompt.get(pos - 1, (None, None))
        entries.append([value, req.input_ids[pos]])
        tops.append([list(e) for e in top[: lp.top_n]] if top else None)
    meta.input_token_logprobs = entries
    if lp.top_n:
        meta.input_top_logprobs = tops
