"""The xgrammar grammar backend (SGLang's default): a pushdown automaton with precomputed masks.

Optional: this module imports only when ``xgrammar`` is installed (``pip install xgrammar``, or
radixlm's ``grammars`` extra), and the backend is registered only then.

A grammar is an ``xgrammar.CompiledGrammar``; each request gets its own ``GrammarMatcher``, which
rolls back any number of tokens. xgrammar silently ignores some JSON-schema keywords; those are
refused with a ValueError, as the other backends refuse what they cannot enforce.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import torch
import xgrammar

from radixlm.runtime.constrained.base import (
    Grammar,
    GrammarBackend,
    Matcher,
    register_grammar_backend,
)
from radixlm.runtime.constrained.schema_bounds import bound_schema_numbers, subschemas

# NOTE: keywords xgrammar 0.2.9 accepts and does not enforce (multipleOf: not with the bounds
# bound_schema_numbers adds; unevaluated*: not after it fills additionalProperties and items),
# as outlines refuses them; formats it has no grammar for would pass as any string.
_IGNORED = (
    "uniqueItems", "multipleOf", "contains", "not", "if", "then", "else", "dependentRequired",
    "dependentSchemas", "patternProperties", "unevaluatedProperties", "unevaluatedItems",
)
_FORMATS = {
    "date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid",
    "json-pointer", "relative-json-pointer",
}
_UNSUPPORTED = "is not supported by the xgrammar grammar backend"
# NOTE: e.g. "[19:03:01] /project/cpp/grammar_parser.cc:820: EBNF parser error at line 1,
# column 16: Lower bound ..." (the EBNF position is in xgrammar's rewrite, not the user's text)
_LOG_PREFIX = re.compile(
    r"^\[[0-9:]+\] \S+:[0-9]+: (Check failed: .*? is false: )?(EBNF parser error at [^:]*: )?"
)


class XGrammarMatcher(Matcher):
    """Wraps one ``xgrammar.GrammarMatcher``.

    xgrammar terminates only on EOS; ``is_terminated`` is also true when the match is complete
    and the mask allows nothing but EOS, found from a mask kept per state (``_version``).
    """

    def __init__(self, matcher: xgrammar.GrammarMatcher, words: int, eos_ids: frozenset[int]):
        self._matcher = matcher
        self._words = words
        self._eos_ids = eos_ids
        self._steps = 0
        self._version = 0
        self._only_eos: tuple[int, bool] | None = None

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if bitmask.dtype != torch.int32 or not bitmask.is_cpu or bitmask.shape[1] < self._words:
            raise ValueError(f"bitmask must be CPU int32 with at least {self._words} words per row")
        if self._matcher.is_terminated():
            bitmask[row] = 0
            return
        # NOTE: xgrammar wants exactly ``words`` per row; a one-row view of that width is fine
        self._matcher.fill_next_token_bitmask(bitmask[row : row + 1, : self._words])
        bitmask[row, self._words :] = 0

    def advance(self, token_id: int) -> None:
        if self._matcher.is_terminated():
            raise ValueError(f"token {token_id} after the grammar terminated")
        if not (0 <= token_id < self._words * 32 and self._matcher.accept_token(token_id)):
            raise ValueError(f"token {token_id} is not allowed by the grammar here")
        self._steps += 1
        self._version += 1

    def rollback(self, k: int) -> None:
        if not 0 <= k <= self._steps:
            raise ValueError(f"cannot roll back {k} tokens; {self._steps} were advanced")
        if k:
            self._matcher.rollback(k)
            self._steps -= k
            self._version += 1

    def is_terminated(self) -> bool:
        if self._matcher.is_terminated():
            return True
        if not self._matcher.is_completed():
            return False
        if self._only_eos is None or self._only_eos[0] != self._version:
            self._only_eos = (self._version, self._allows_only_eos())
        return self._only_eos[1]

    def is_accepting(self) -> bool:
        return self._matcher.is_completed()

    def forced_continuation(self) -> str | None:
        if self._matcher.is_terminated():
            return None
        return self._matcher.find_jump_forward_string() or None

    def _allows_only_eos(self) -> bool:
        mask = torch.empty(1, self._words, dtype=torch.int32)
        self._matcher.fill_next_token_bitmask(mask)
        for token_id in self._eos_ids:
            word, bit = divmod(token_id, 32)
            if word < self._words:
                mask[0, word] &= ~(1 << bit)
        return not bool(mask.any())


class XGrammarGrammar(Grammar):
    """A compiled xgrammar grammar; each matcher starts from it."""

    def __init__(self, compiled: xgrammar.CompiledGrammar, words: int, eos_ids: frozenset[int]):
        self._compiled = compiled
        self._words = words
        self._eos_ids = eos_ids

    def matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(xgrammar.GrammarMatcher(self._compiled), self._words, self._eos_ids)


@register_grammar_backend("xgrammar")
class XGrammarBackend(GrammarBackend):
    """xgrammar over ``TokenizerInfo.from_huggingface`` of the tokenizer.

    JSON whitespace: an empty pattern gives compact JSON; xgrammar takes no whitespace regex, so
    any other pattern gives its flexible whitespace (space, tab, newline), at most one character
    where the pattern cannot match two spaces (the default ``[ ]?``), else unlimited.
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        whitespace_pattern: str | None = None,
    ) -> None:
        super().__init__(tokenizer, vocab_size, eos_token_ids, whitespace_pattern)
        try:
            info = xgrammar.TokenizerInfo.from_huggingface(
                tokenizer, vocab_size=vocab_size, stop_token_ids=list(self.eos_token_ids)
            )
        except (RuntimeError, ValueError, TypeError) as e:
            raise ValueError(f"the xgrammar grammar backend cannot use this tokenizer: {e}") from e
        # NOTE: GrammarCompiler (compiler.py) caches grammars already; xgrammar's cache is unbounded
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self._words = (vocab_size + 31) // 32

    def compile_regex(self, regex: str) -> XGrammarGrammar:
        try:
            return self._build(self._compiler.compile_regex(regex))
        except RuntimeError as e:
            raise ValueError(f"invalid regex {regex!r}: {_summary(e)}") from e

    def compile_json_schema(self, schema: str) -> XGrammarGrammar:
        try:
            obj = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from e
        for node in subschemas(obj):
            _check_supported(node)
        try:
            compiled = self._compiler.compile_json_schema(
                bound_schema_numbers(schema), **self._json_options()
            )
        except RuntimeError as e:
            raise ValueError(f"unsupported json_schema: {_summary(e)}") from e
        return self._build(compiled)

    def compile_ebnf(self, grammar: str) -> XGrammarGrammar:
        """xgrammar's EBNF (GBNF-style, start rule ``root``)."""
        try:
            return self._build(self._compiler.compile_grammar(grammar))
        except RuntimeError as e:
            raise ValueError(f"invalid ebnf grammar: {_summary(e)}") from e

    def _json_options(self) -> dict[str, Any]:
        if not self.whitespace_pattern:
            return {"any_whitespace": False, "separators": (",", ":")}
        try:
            unlimited = re.fullmatch(self.whitespace_pattern, "  ") is not None
        except re.error:
            unlimited = True
        return {"any_whitespace": True, "max_whitespace_cnt": None if unlimited else 1}

    def _build(self, compiled: xgrammar.CompiledGrammar) -> XGrammarGrammar:
        return XGrammarGrammar(compiled, self._words, frozenset(self.eos_token_ids))


def _check_supported(node: dict[str, Any]) -> None:
    for key in _IGNORED:
        if key in node and not (key == "uniqueItems" and node[key] is False):
            raise ValueError(f"json_schema keyword {key!r} {_UNSUPPORTED}")
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        raise ValueError(f"json_schema 'allOf' with more than one schema {_UNSUPPORTED}")
    fmt = node.get("format")
    if fmt is not None and fmt not in _FORMATS:
        raise ValueError(f"json_schema format {fmt!r} {_UNSUPPORTED}")


def _summary(error: Exception) -> str:
    """xgrammar's message without its log prefix (time, C++ source line, failed check)."""
    lines = str(error).strip().splitlines() or ["invalid grammar"]
    return _LOG_PREFIX.sub("", lines[0]).strip() or "invalid grammar"
