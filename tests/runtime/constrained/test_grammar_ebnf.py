"""EBNF/GBNF grammars (SGLang's ``ebnf``, vLLM's ``guided_grammar``) on every backend: the
output is a sentence of the grammar; outlines hands grammars to llguidance; a bad grammar is a
ValueError naming it."""

from __future__ import annotations

import re

import pytest
from backend_params import BACKENDS

# GBNF as llama.cpp and xgrammar write it; the regex is the same language, for checking
GRAMMARS = [
    ('root ::= "yes" | "no"', r"yes|no"),
    (
        'root ::= "(" expr ")"\nexpr ::= term ("+" term)*\nterm ::= [0-9] | "x"',
        r"\([0-9x](\+[0-9x])*\)",
    ),
    (
        'root ::= "name: " name "\\n" "age: " age\n'
        "name ::= [A-Z] [a-z]? [a-z]?\nage ::= [1-9] [0-9]?",
        r"name: [A-Z][a-z]{0,2}\nage: [1-9][0-9]?",
    ),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("grammar", "regex"), GRAMMARS, ids=["choice", "expr", "record"])
def test_output_is_a_sentence_of_the_grammar(backends, sample, decode, backend, grammar, regex):
    compiled = backends[backend].compile("ebnf", grammar)
    for seed in (0, 1, None):
        tokens, ended = sample(compiled.matcher(), seed)
        assert ended, decode(tokens)
        assert re.fullmatch(regex, decode(tokens)), decode(tokens)


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_lark_syntax_is_accepted_where_llguidance_parses(backends, sample, decode, backend):
    compiled = backends[backend].compile("ebnf", 'start: "A" | "B" "C"')
    tokens, ended = sample(compiled.matcher(), 0)
    assert ended and decode(tokens) in ("A", "BC")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("grammar", ['root ::= "a" undefined_rule', "root ::= (", "  "])
def test_bad_grammar_is_a_value_error(backends, backend, grammar):
    from radixlm.runtime.constrained.specs import constraint_from_params

    with pytest.raises(ValueError, match="ebnf"):
        constraint_from_params(ebnf=grammar)
        backends[backend].compile("ebnf", grammar)


def test_only_one_constraint_kind():
    from radixlm.runtime.constrained.specs import constraint_from_params

    with pytest.raises(ValueError, match="only one of .*got regex, ebnf"):
        constraint_from_params(regex="a", ebnf='root ::= "a"')
