"""The outlines-core grammar backend (default): a token-level DFA index per regex.

Each grammar caches, per DFA state, its packed bitmask row, so filling a mask is one tensor copy
after a state's first visit. Forced continuations are read off the same index, byte by byte: a
non-final state whose allowed tokens all start with the same byte ``b`` forces ``b`` (every
continuation the vocabulary can spell starts with it), and the walk follows the single-byte
token for ``b``. The walk stops at a final state, a choice, or ``MAX_FORCED_BYTES``.

NOTE: outlines-core 0.2 drops a token from a matching DFA state whenever the token's bytes
before its last one still match (regex-automata reports matches one byte late), e.g. ``,`` after
``12`` in ``[0-9]+(,[0-9]+)*``. Every regex is therefore compiled as ``(?:R)`` + ``END_MARK``, so
no state of ``R`` is a match state. A state accepts when the fake ``END_MARK`` token (id
``vocab_size``, outside every mask) leads to a final state. Real tokens with ``END_MARK``'s lead
byte (0xF4: code points U+100000 and up, private use) are left out of the vocabulary.
"""

from __future__ import annotations

import codecs
import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from outlines_core import Index

from radixlm.runtime.constrained.base import (
    Grammar,
    GrammarBackend,
    Matcher,
    register_grammar_backend,
)
from radixlm.runtime.constrained.limits import check_regex_size
from radixlm.runtime.constrained.schema_regex import json_schema_regex
from radixlm.runtime.constrained.specs import describe_regex_error
from radixlm.runtime.constrained.vocabulary import outlines_vocabulary, token_bytes_table

MAX_FORCED_BYTES = 4096
TERMINATED = -1
END_MARK = "\U0010ffff"


@dataclass(frozen=True)
class VocabInfo:
    """Per-tokenizer tables shared by every grammar of one backend."""

    words: int
    eos_ids: np.ndarray
    first_byte: np.ndarray
    byte_token: dict[int, int]

    @property
    def end_mark_id(self) -> int:
        return len(self.first_byte)

    @classmethod
    def from_table(cls, table: Sequence[bytes | None], eos_ids: Sequence[int]) -> VocabInfo:
        first = np.array([data[0] if data else -1 for data in table], dtype=np.int16)
        singles = {
            data[0]: i for i, data in reversed(list(enumerate(table))) if data and len(data) == 1
        }
        return cls((len(table) + 31) // 32, np.array(eos_ids, dtype=np.int64), first, singles)


class OutlinesGrammar(Grammar):
    """An outlines-core ``Index`` plus per-state caches of mask rows and forced bytes."""

    def __init__(self, index: Index, info: VocabInfo) -> None:
        self.index = index
        self.info = info
        self._rows: dict[int, torch.Tensor] = {}
        self._final: dict[int, bool] = {TERMINATED: True}
        self._continues: dict[int, bool] = {}
        self._forced: dict[int, tuple[int, int] | None] = {}
        self.initial_state = index.get_initial_state()
        self.mask_row(self.initial_state)

    def matcher(self) -> OutlinesMatcher:
        return OutlinesMatcher(self)

    def mask_row(self, state: int) -> torch.Tensor:
        """The packed int32 bitmask row of ``state`` (cached)."""
        row = self._rows.get(state)
        if row is None:
            row = self._rows[state] = self._build_row(state)
        return row

    def has_continuation(self, state: int) -> bool:
        """Whether a token other than EOS may follow ``state``."""
        if state not in self._continues:
            self.mask_row(state)
        return self._continues[state]

    def is_final(self, state: int) -> bool:
        """Whether the output so far is a complete match (EOS allowed)."""
        final = self._final.get(state)
        if final is None:
            nxt = self.index.get_next_state(state, self.info.end_mark_id)
            final = self._final[state] = nxt is not None and self.index.is_final_state(nxt)
        return final

    def forced_text(self, state: int) -> str | None:
        """The longest string every continuation from ``state`` starts with (whole characters)."""
        data = bytearray()
        while len(data) < MAX_FORCED_BYTES:
            step = self._forced_step(state)
            if step is None:
                break
            data.append(step[0])
            state = step[1]
        try:
            text = codecs.getincrementaldecoder("utf-8")().decode(bytes(data))
        except UnicodeDecodeError:
            return None
        return text or None

    def _tokens(self, state: int) -> np.ndarray:
        if state == TERMINATED:
            return np.zeros(0, dtype=np.int64)
        return np.asarray(self.index.get_allowed_tokens(state), dtype=np.int64)

    def _build_row(self, state: int) -> torch.Tensor:
        tokens = self._tokens(state)
        tokens = tokens[tokens < len(self.info.first_byte)]
        bits = np.zeros(self.info.words * 32, dtype=bool)
        bits[tokens] = True
        if self.is_final(state):
            bits[self.info.eos_ids] = True
        self._continues[state] = bool((self.info.first_byte[tokens] >= 0).any())
        words = np.packbits(bits, bitorder="little").view("<i4").astype(np.int32, copy=False)
        return torch.from_numpy(words)

    def _forced_step(self, state: int) -> tuple[int, int] | None:
        if state not in self._forced:
            self._forced[state] = self._find_forced_step(state)
        return self._forced[state]

    def _find_forced_step(self, state: int) -> tuple[int, int] | None:
        if self.is_final(state):
            return None
        tokens = self._tokens(state)
        firsts = np.unique(self.info.first_byte[tokens[tokens < len(self.info.first_byte)]])
        firsts = firsts[firsts >= 0]
        if len(firsts) != 1 or int(firsts[0]) not in self.info.byte_token:
            return None
        byte = int(firsts[0])
        nxt = self.index.get_next_state(state, self.info.byte_token[byte])
        return None if nxt is None else (byte, nxt)


class OutlinesMatcher(Matcher):
    """A stack of DFA states; EOS pushes ``TERMINATED``."""

    def __init__(self, grammar: OutlinesGrammar) -> None:
        self._grammar = grammar
        self._eos = {int(i) for i in grammar.info.eos_ids}
        self._states = [grammar.initial_state]

    @property
    def state(self) -> int:
        return self._states[-1]

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        src = self._grammar.mask_row(self.state)
        width = min(bitmask.shape[1], src.shape[0])
        bitmask[row, :width] = src[:width]
        bitmask[row, width:] = 0

    def advance(self, token_id: int) -> None:
        state = self.state
        if state == TERMINATED:
            raise ValueError(f"token {token_id} after the grammar terminated")
        if token_id in self._eos:
            nxt = TERMINATED if self._grammar.is_final(state) else None
        else:
            nxt = self._next_state(state, token_id)
        if nxt is None:
            raise ValueError(f"token {token_id} is not allowed by the grammar here")
        self._states.append(nxt)

    def rollback(self, k: int) -> None:
        if not 0 <= k < len(self._states):
            raise ValueError(f"cannot roll back {k} tokens; {len(self._states) - 1} were advanced")
        if k:
            del self._states[-k:]

    def is_terminated(self) -> bool:
        state = self.state
        return state == TERMINATED or (
            self._grammar.is_final(state) and not self._grammar.has_continuation(state)
        )

    def is_accepting(self) -> bool:
        return self._grammar.is_final(self.state)

    def forced_continuation(self) -> str | None:
        return self._grammar.forced_text(self.state)

    def _next_state(self, state: int, token_id: int) -> int | None:
        if not 0 <= token_id < len(self._grammar.info.first_byte):
            return None
        return self._grammar.index.get_next_state(state, token_id)


@register_grammar_backend("outlines")
class OutlinesBackend(GrammarBackend):
    """outlines-core ``Index`` over a vocabulary built locally from the tokenizer.

    The ``Index`` is built in this process unless ``using`` hands the build elsewhere (the
    GrammarCompiler's worker processes); the rest of a compile is cheap and runs here.
    """

    build_index: Callable[[str], Index] | None = None

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        whitespace_pattern: str | None = None,
    ) -> None:
        super().__init__(tokenizer, vocab_size, eos_token_ids, whitespace_pattern)
        mark = END_MARK.encode()
        table = token_bytes_table(tokenizer, vocab_size, self.eos_token_ids)
        table = [None if data and mark[0] in data else data for data in table]
        self._info = VocabInfo.from_table(table, self.eos_token_ids)
        self.vocabulary = outlines_vocabulary(table, self.eos_token_ids[0])
        self.vocabulary.insert(mark, self._info.end_mark_id)

    def using(self, build_index: Callable[[str], Index]) -> OutlinesBackend:
        """A view of this backend whose indexes are built by ``build_index(regex)``."""
        view = copy.copy(self)
        view.build_index = build_index
        return view

    def compile_regex(self, regex: str) -> OutlinesGrammar:
        try:
            return self._compile(regex)
        except ValueError as e:
            raise describe_regex_error(regex, e) from e

    def compile_json_schema(self, schema: str) -> OutlinesGrammar:
        regex = json_schema_regex(schema, self.whitespace_pattern)
        try:
            return self._compile(regex)
        except ValueError as e:
            raise ValueError(f"json_schema could not be compiled: {e}") from e

    def _compile(self, regex: str) -> OutlinesGrammar:
        check_regex_size(regex)
        regex = f"(?:{regex}){END_MARK}"
        build = self.build_index
        index = Index(regex, self.vocabulary) if build is None else build(regex)
        return OutlinesGrammar(index, self._info)
