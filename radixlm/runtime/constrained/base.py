"""Grammar-backend interfaces, their registry, and token-bitmask helpers.

A bitmask is an int32 tensor ``[batch, ceil(vocab_size / 32)]`` on the CPU: bit ``j`` of word
``i`` set means token ``32 * i + j`` is allowed. Matchers fill one row each; ``apply_bitmask``
turns the rows into ``-inf`` logits in one masked fill.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import torch

from radixlm.runtime.constrained.specs import (
    KINDS,
    check_regex,
    choices_regex,
    constraint_from_params,
    parse_choices,
)

__all__ = [
    "DEFAULT_WHITESPACE_PATTERN",
    "GRAMMAR_BACKENDS",
    "Grammar",
    "GrammarBackend",
    "Matcher",
    "allocate_bitmask",
    "apply_bitmask",
    "constraint_from_params",
    "create_grammar_backend",
    "register_grammar_backend",
    "unpack_bitmask",
]

DEFAULT_WHITESPACE_PATTERN = r"[ ]?"
GRAMMAR_BACKENDS: dict[str, type[GrammarBackend]] = {}


def register_grammar_backend(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        GRAMMAR_BACKENDS[name] = cls
        return cls

    return wrap


class Matcher(ABC):
    """Per-request grammar state: which tokens may come next, advanced one token at a time."""

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (CPU int32; words past the
        grammar's vocabulary are zeroed)."""

    @abstractmethod
    def advance(self, token_id: int) -> None:
        """Consume one token; ValueError (state unchanged) if the grammar does not allow it."""

    @abstractmethod
    def rollback(self, k: int) -> None:
        """Undo the last ``k`` advances; ValueError if fewer were made."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """EOS was accepted, or the grammar is complete and nothing but EOS may follow."""

    @abstractmethod
    def is_accepting(self) -> bool:
        """EOS is allowed now (the output so far is a complete match)."""

    @abstractmethod
    def forced_continuation(self) -> str | None:
        """Text every continuation must start with (for jump-forward), or None if there is none."""


class Grammar(ABC):
    """A compiled grammar: immutable, shared by every request with the same constraint."""

    @abstractmethod
    def matcher(self) -> Matcher:
        """A fresh matcher at the grammar's start."""


class GrammarBackend(ABC):
    """Compiles ``(kind, spec)`` constraints into grammars over one tokenizer's vocabulary.

    ``vocab_size`` is the width of the masks it writes (at least the tokenizer's size; the
    model's padded vocabulary is fine). ``eos_token_ids`` are allowed exactly when a match is
    complete. ``whitespace_pattern`` is the regex for optional whitespace in JSON output.
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        whitespace_pattern: str | None = None,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("a grammar backend needs at least one EOS token id")
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.whitespace_pattern = (
            DEFAULT_WHITESPACE_PATTERN if whitespace_pattern is None else whitespace_pattern
        )
        self._delegates: dict[str, GrammarBackend] = {}  # NOTE: shared by copies (``using``)

    def compile(self, kind: str, spec: str) -> Grammar:
        """Compile a constraint: ``regex`` (full match), ``json_schema`` (JSON text),
        ``choices`` (JSON list of strings) or ``ebnf`` (GBNF/EBNF or Lark grammar text).
        Raises ValueError naming what is wrong."""
        compilers = {
            "regex": lambda: self.compile_regex(check_regex(spec)),
            "json_schema": lambda: self.compile_json_schema(spec),
            "choices": lambda: self.compile_regex(choices_regex(parse_choices(spec))),
            "ebnf": lambda: self.compile_ebnf(spec),
        }
        if kind not in compilers:
            raise ValueError(f"constraint kind must be one of {list(KINDS)}, got {kind!r}")
        return compilers[kind]()

    @abstractmethod
    def compile_regex(self, regex: str) -> Grammar:
        """Compile a regex already checked by ``check_regex``."""

    @abstractmethod
    def compile_json_schema(self, schema: str) -> Grammar:
        """Compile a JSON schema given as JSON text."""

    def compile_ebnf(self, grammar: str) -> Grammar:
        """Compile a context-free grammar. A backend without a grammar parser of its own (the
        regex-only outlines) hands it to llguidance over the same tokenizer: its matchers
        work in the same masks."""
        if "llguidance" not in self._delegates:
            from radixlm.runtime.constrained.llguidance_backend import LLGuidanceBackend

            self._delegates["llguidance"] = LLGuidanceBackend(
                self.tokenizer, self.vocab_size, self.eos_token_ids, self.whitespace_pattern
            )
        return self._delegates["llguidance"].compile_ebnf(grammar)


def create_grammar_backend(
    name: str,
    tokenizer: Any,
    vocab_size: int,
    eos_token_ids: Sequence[int],
    whitespace_pattern: str | None = None,
) -> GrammarBackend:
    """The registered backend ``name`` (``outlines``, ``llguidance``, or ``xgrammar`` when it is
    installed) for ``tokenizer``."""
    # NOTE: importing the modules registers the backends; xgrammar's (an optional package, about
    # 1 s to import) only when it is asked for.
    from radixlm.runtime.constrained import llguidance_backend, outlines_backend  # noqa: F401

    if name == "xgrammar":
        try:
            from radixlm.runtime.constrained import xgrammar_backend  # noqa: F401
        except (ImportError, OSError, RuntimeError) as e:
            raise ValueError(
                "grammar_backend 'xgrammar' needs the xgrammar package (pip install xgrammar, or "
                f"radixlm[grammars]): {e}"
            ) from e
    if name not in GRAMMAR_BACKENDS:
        raise ValueError(f"grammar_backend must be one of {sorted(GRAMMAR_BACKENDS)}, got {name!r}")
    return GRAMMAR_BACKENDS[name](tokenizer, vocab_size, eos_token_ids, whitespace_pattern)


def allocate_bitmask(batch: int, vocab_size: int) -> torch.Tensor:
    """An all-allowed CPU bitmask ``[batch, ceil(vocab_size / 32)]`` (int32)."""
    return torch.full((batch, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """Bool ``[batch, width]``: token allowed; tokens past the mask's words are disallowed."""
    return ~_disallowed(bitmask, width)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set disallowed logits to ``-inf`` in place; ``logits`` ``[batch, V]`` may be wider than
    the mask (padded model vocabulary), and tokens past the mask are disallowed."""
    bitmask = bitmask.to(logits.device, non_blocking=True)
    logits.masked_fill_(_disallowed(bitmask, logits.shape[-1]), float("-inf"))


def _disallowed(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    one = torch.ones(32, device=bitmask.device, dtype=torch.int32)
    bits = one << torch.arange(32, device=bitmask.device, dtype=torch.int32)
    off = ((bitmask.unsqueeze(-1) & bits) == 0).flatten(1)
    if off.shape[1] >= width:
        return off[:, :width]
    pad = torch.ones(off.shape[0], width - off.shape[1], dtype=torch.bool, device=off.device)
    return torch.cat([off, pad], dim=1)
