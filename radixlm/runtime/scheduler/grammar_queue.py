"""Constrained requests: compile off the loop, wait without blocking others, mask, advance."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.constrained.jump_forward import advance_with_jump_forward
from radixlm.runtime.messages import ErrorCode, Finish
from radixlm.runtime.scheduler.output import token_out
from radixlm.runtime.scheduler.req import Req


class GrammarQueue:
    def __init__(self, args: ServerArgs, runner: Any) -> None:
        self.args = args
        self.runner = runner
        self.pending: list[Req] = []
        self._compiler = None
        self._mask_pool: ThreadPoolExecutor | None = None

    @property
    def compiler(self):
        # NOTE: without a tokenizer (skip_tokenizer_init) grammars are refused on arrival.
        if self._compiler is None:
            from radixlm.runtime.constrained.base import create_grammar_backend
            from radixlm.runtime.constrained.compiler import GrammarCompiler
            from radixlm.runtime.constrained.index_cache import grammar_cache_dir

            c = self.runner.config
            backend = create_grammar_backend(
                self.args.grammar_backend,
                self.runner.tokenizer,
                c.vocab_size,
                c.eos_token_ids,
                self.args.constrained_json_whitespace_pattern,
            )
            # NOTE: slow outlines indexes (json_object's) outlive restarts (index_cache.py)
            self._compiler = GrammarCompiler(backend, disk_cache=grammar_cache_dir())
        return self._compiler

    @staticmethod
    def needs(req: Req) -> bool:
        return req.params.constraint is not None

    def add(self, req: Req) -> None:
        kind, spec = req.params.constraint
        req.grammar = self.compiler.submit(kind, spec)
        self.pending.append(req)

    def ready(self, outbox: list) -> list[Req]:
        """Requests whose grammar compiled; failures finish with an error in ``outbox``."""
        done = [r for r in self.pending if r.grammar.done()]
        for req in done:
            self.pending.remove(req)
            error = req.grammar.exception()
            if error is not None:
                message = f"{req.params.constraint[0]}: {error}"
                req.finish = Finish.abort(ErrorCode.INVALID_REQUEST, message)
                outbox.append(token_out(req))
            else:
                req.grammar = req.grammar.result().matcher()
        return [r for r in done if r.finish is None]

    def start_bitmask(self, reqs: list[Req], vocab_size: int) -> Future | None:
        """Fill the masks of ``reqs`` on a worker thread; None when none is constrained."""
        if all(r.grammar is None for r in reqs):
            return None
        if self._mask_pool is None:
            self._mask_pool = ThreadPoolExecutor(1, thread_name_prefix="radixlm-mask")
        return self._mask_pool.submit(self.bitmask, reqs, vocab_size)

    def bitmask(self, reqs: list[Req], vocab_size: int) -> torch.Tensor:
        """One all-allowed row per request, narrowed by each request's grammar."""
        from radixlm.runtime.constrained.base import allocate_bitmask

        mask = allocate_bitmask(len(reqs), vocab_size)
        for row, req in enumerate(reqs):
            if req.grammar is not None:
                req.grammar.fill_bitmask(mask, row)
        return mask

    def advance(self, req: Req, token: int) -> list[int]:
        """Advance the grammar over the sampled ``token`` and return the tokens to append: the
        token itself, or, with jump-forward, the token and the text the grammar forces after it
        (``constrained/jump_forward.py``)."""
        grammar = req.grammar
        if grammar is None or grammar.is_terminated():
            return [token]
        if self.args.disable_jump_forward:
            grammar.advance(token)
            return [token]
        room = min(
            req.params.max_new_tokens - len(req.output_ids),
            self.runner.context_len - req.seq_len - 1,
        )
        return advance_with_jump_forward(grammar, token, self.runner.tokenizer, room)
