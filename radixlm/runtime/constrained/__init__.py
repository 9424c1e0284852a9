"""Constrained decoding: regex / JSON-schema / choice grammars as token bitmasks."""

from radixlm.runtime.constrained.base import (
    GRAMMAR_BACKENDS,
    Grammar,
    GrammarBackend,
    Matcher,
    allocate_bitmask,
    apply_bitmask,
    create_grammar_backend,
    unpack_bitmask,
)
from radixlm.runtime.constrained.compiler import GrammarCompiler
from radixlm.runtime.constrained.jump_forward import advance_with_jump_forward
from radixlm.runtime.constrained.specs import constraint_from_params

__all__ = [
    "GRAMMAR_BACKENDS",
    "Grammar",
    "GrammarBackend",
    "GrammarCompiler",
    "Matcher",
    "allocate_bitmask",
    "apply_bitmask",
    "constraint_from_params",
    "create_grammar_backend",
    "advance_with_jump_forward",
    "unpack_bitmask",
]
