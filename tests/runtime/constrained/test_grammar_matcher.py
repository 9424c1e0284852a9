"""Matcher behaviour the scheduler relies on: masks, EOS, rollback, forced text, errors."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from backend_params import BACKENDS, INSTALLED, needs_xgrammar

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.constrained.base import (
    GRAMMAR_BACKENDS,
    allocate_bitmask,
    create_grammar_backend,
    unpack_bitmask,
)
from radixlm.runtime.constrained.jump_forward import advance_with_jump_forward

VOCAB = 49152
EOS = 2
NAME_SCHEMA = json.dumps(
    {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
)


def allowed(matcher, width: int = VOCAB) -> set[int]:
    bitmask = allocate_bitmask(1, width)
    matcher.fill_bitmask(bitmask, 0)
    return set(torch.nonzero(unpack_bitmask(bitmask, width)[0]).flatten().tolist())


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def walk(backend, kind: str, spec: str, tokenizer, text: str):
    matcher = backend.compile(kind, spec).matcher()
    for token_id in encode(tokenizer, text):
        matcher.advance(token_id)
    return matcher


@pytest.fixture(scope="module")
def compact_backends(tokenizer) -> dict:
    return {n: create_grammar_backend(n, tokenizer, VOCAB, [EOS], "") for n in INSTALLED}


@pytest.mark.parametrize("backend", BACKENDS)
def test_eos_only_when_complete(backend, backends, tokenizer):
    matcher = walk(backends[backend], "regex", "[0-9]{2}", tokenizer, "4")
    assert EOS not in allowed(matcher) and not matcher.is_accepting()
    matcher.advance(encode(tokenizer, "2")[0])
    assert allowed(matcher) == {EOS}
    assert matcher.is_accepting() and matcher.is_terminated()
    matcher.advance(EOS)
    assert matcher.is_terminated()


@pytest.mark.parametrize("backend", BACKENDS)
def test_accepting_but_not_terminated_while_continuations_exist(backend, backends, tokenizer):
    matcher = walk(backends[backend], "regex", "a[0-9]*", tokenizer, "a")
    assert matcher.is_accepting() and not matcher.is_terminated()
    assert EOS in allowed(matcher) and len(allowed(matcher)) > 10


@pytest.mark.parametrize("backend", BACKENDS)
def test_disallowed_token_raises_and_keeps_state(backend, backends, tokenizer):
    matcher = walk(backends[backend], "regex", "ab[0-9]", tokenizer, "a")
    before = allowed(matcher)
    with pytest.raises(ValueError, match="not allowed"):
        matcher.advance(encode(tokenizer, "z")[0])
    with pytest.raises(ValueError):
        matcher.advance(EOS)
    assert allowed(matcher) == before
    matcher.advance(encode(tokenizer, "b")[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_rollback_restores_masks(backend, backends, tokenizer, sample):
    grammar = backends[backend].compile("json_schema", NAME_SCHEMA)
    tokens, _ = sample(grammar.matcher(), 0)
    matcher = grammar.matcher()
    masks = [allowed(matcher)]
    for token_id in tokens:
        matcher.advance(token_id)
        masks.append(allowed(matcher))
    matcher.advance(EOS)
    matcher.rollback(1)
    assert allowed(matcher) == masks[-1]
    for k in (1, 3, len(tokens) - 4):
        matcher.rollback(k)
        tokens, masks = tokens[:-k], masks[:-k]
        assert allowed(matcher) == masks[-1]
    with pytest.raises(ValueError):
        matcher.rollback(len(tokens) + 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forced_json_prefix_without_whitespace(backend, compact_backends):
    matcher = compact_backends[backend].compile("json_schema", NAME_SCHEMA).matcher()
    assert matcher.forced_continuation() == '{"name":"'


@pytest.mark.parametrize("backend", BACKENDS)
def test_forced_json_prefix_with_optional_space(backend, backends, tokenizer):
    matcher = backends[backend].compile("json_schema", NAME_SCHEMA).matcher()
    assert matcher.forced_continuation() == "{"
    matcher = walk(backends[backend], "json_schema", NAME_SCHEMA, tokenizer, '{ "')
    assert matcher.forced_continuation() == 'name"'


@pytest.mark.parametrize("backend", BACKENDS)
def test_forced_regex_text(backend, backends, tokenizer):
    spec = json.dumps(["hello world", "hello there"])
    assert backends[backend].compile("choices", spec).matcher().forced_continuation() == "hello "
    matcher = walk(backends[backend], "regex", "abc[0-9]+xyz", tokenizer, "ab")
    assert matcher.forced_continuation() == "c"
    assert walk(backends[backend], "regex", "a+", tokenizer, "a").forced_continuation() is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_jump_forward_advances_over_forced_tokens(backend, compact_backends, tokenizer, decode):
    matcher = compact_backends[backend].compile("json_schema", NAME_SCHEMA).matcher()
    first = encode(tokenizer, "{")[0]
    taken = advance_with_jump_forward(matcher, first, tokenizer, room=64)
    assert decode(taken) == '{"name":"'
    assert matcher.forced_continuation() is None
    matcher.advance(encode(tokenizer, "Bob")[0])
    assert advance_with_jump_forward(matcher, encode(tokenizer, "x")[0], tokenizer, 1) == [
        encode(tokenizer, "x")[0]
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_is_zero_past_grammar_vocab(backend, backends):
    bitmask = torch.full((2, VOCAB // 32 + 4), -1, dtype=torch.int32)
    backends[backend].compile("regex", "[a-z]+").matcher().fill_bitmask(bitmask, 1)
    assert bitmask[1, VOCAB // 32 :].eq(0).all() and bitmask[0].eq(-1).all()


@pytest.mark.parametrize(
    ("regex", "text"),
    [
        (r"[0-9]{3}-[a-z]{2}", "123-ab"),
        (r"[0-9]{1,3}(,[0-9]{3})*", "12,345,678"),
        (r"[a-z]+( [a-z]+)*\.", "the cat sat."),
        (r"(ab|c)+x?", "abcabx"),
    ],
)
def test_backends_agree_on_regex_masks(regex, text, backends, tokenizer):
    matchers = [backends[n].compile("regex", regex).matcher() for n in INSTALLED]
    for token_id in [*encode(tokenizer, text), None]:
        first, *others = (allowed(m) for m in matchers)
        assert all(other == first for other in others)
        if token_id is not None:
            for matcher in matchers:
                matcher.advance(token_id)


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_byte_token_allowed_after_a_complete_match(backend, backends, tokenizer):
    matcher = walk(backends[backend], "regex", r"[0-9]+(,[0-9]+)*", tokenizer, "12")
    assert matcher.is_accepting()
    assert encode(tokenizer, ",")[0] in allowed(matcher)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("kind", "spec", "message"),
    [
        ("regex", "(a", "invalid regex"),
        ("regex", "(?=a)b", "look-around"),
        ("regex", "a(?!b)", "look-around"),
        ("regex", "(?<=a)b", "look-around"),
        ("regex", r"(a)\1", "back-references"),
        ("regex", "a{3,1}", "invalid regex"),
        ("regex", r"\bword", "anchors"),
        ("json_schema", '{"type": "nosuchtype"}', "nosuchtype"),
        ("json_schema", "{not json", "json_schema"),
        ("json_schema", '{"type": "array", "uniqueItems": true}', "uniqueItems"),
        ("choices", "[]", "non-empty"),
        ("choices", '["a", 3]', "strings"),
        ("grammar", "start: x", "kind must be one of"),
    ],
)
def test_invalid_specs_raise_value_error(backend, backends, kind, spec, message):
    with pytest.raises(ValueError, match=message):
        backends[backend].compile(kind, spec)


@pytest.mark.parametrize("backend", BACKENDS)
def test_outer_anchors_and_rust_syntax_accepted(backend, backends, tokenizer):
    matcher = walk(backends[backend], "regex", "^ab$", tokenizer, "ab")
    assert matcher.is_accepting()
    if backend == "xgrammar":  # NOTE: its regexes have no Unicode classes (xgrammar 0.2.9)
        with pytest.raises(ValueError, match="invalid regex.*Unicode character class"):
            backends[backend].compile("regex", r"\p{Lu}[0-9]")
        return
    matcher = walk(backends[backend], "regex", r"\p{Lu}[0-9]", tokenizer, "Q")
    assert not matcher.is_accepting()


def test_registry_lists_backends(tokenizer):
    with pytest.raises(ValueError, match="llguidance.*outlines"):
        create_grammar_backend("nope", tokenizer, VOCAB, [EOS])
    assert {"outlines", "llguidance"} <= set(GRAMMAR_BACKENDS)


def test_xgrammar_without_the_package_is_refused_at_start_up(monkeypatch, tokenizer):
    import radixlm.runtime.constrained as constrained

    monkeypatch.setitem(sys.modules, "xgrammar", None)  # NOTE: import xgrammar -> ImportError
    monkeypatch.delitem(sys.modules, "radixlm.runtime.constrained.xgrammar_backend", raising=False)
    monkeypatch.delattr(constrained, "xgrammar_backend", raising=False)
    monkeypatch.delitem(GRAMMAR_BACKENDS, "xgrammar", raising=False)
    with pytest.raises(ValueError, match=r"grammar_backend 'xgrammar'.*pip install xgrammar"):
        ServerArgs(grammar_backend="xgrammar")
    with pytest.raises(ValueError, match=r"grammar_backend 'xgrammar'.*pip install xgrammar"):
        create_grammar_backend("xgrammar", tokenizer, VOCAB, [EOS])


@pytest.mark.parametrize("backend", BACKENDS)
def test_several_eos_ids_and_padded_vocab(backend, tokenizer):
    padded = VOCAB + 64
    grammar = create_grammar_backend(backend, tokenizer, padded, [EOS, 0]).compile("regex", "x")
    matcher = grammar.matcher()
    matcher.advance(encode(tokenizer, "x")[0])
    assert allowed(matcher, padded) == {0, EOS}
    matcher.advance(0)
    assert matcher.is_terminated()


@needs_xgrammar
@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "integer", "multipleOf": 3}, "'multipleOf' is not supported"),
        ({"type": "array", "contains": {"const": 5}}, "'contains' is not supported"),
        ({"not": {"type": "string"}}, "'not' is not supported"),
        ({"if": {"type": "string"}, "then": {"minLength": 3}}, "'if' is not supported"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "'dependentRequired'"),
        ({"type": "object", "patternProperties": {"^a": {}}}, "'patternProperties'"),
        ({"allOf": [{"required": ["a"]}, {"required": ["b"]}]}, "'allOf' with more than one"),
        ({"type": "string", "format": "iri"}, "format 'iri' is not supported"),
        (
            {"type": "object", "properties": {"x": {"items": {"not": {}}}}},
            "'not' is not supported",
        ),
    ],
)
def test_xgrammar_refuses_keywords_it_would_ignore(backends, schema, message):
    with pytest.raises(ValueError, match=message):
        backends["xgrammar"].compile("json_schema", json.dumps(schema))


@needs_xgrammar
def test_xgrammar_keywords_are_names_inside_properties(backends, tokenizer):
    schema = {"type": "object", "properties": {"not": {"type": "integer"}}, "required": ["not"]}
    matcher = walk(backends["xgrammar"], "json_schema", json.dumps(schema), tokenizer, '{"not":1}')
    assert matcher.is_accepting()


@needs_xgrammar
def test_xgrammar_whitespace_pattern(tokenizer):
    schema = json.dumps({"type": "array", "items": {"type": "integer"}, "maxItems": 3})
    spaced = create_grammar_backend("xgrammar", tokenizer, VOCAB, [EOS], r"[ ]*")
    assert walk(spaced, "json_schema", schema, tokenizer, "[1,   2]").is_accepting()
    one = create_grammar_backend("xgrammar", tokenizer, VOCAB, [EOS])  # NOTE: default [ ]?
    assert walk(one, "json_schema", schema, tokenizer, "[1, 2]").is_accepting()
    with pytest.raises(ValueError, match="not allowed"):
        walk(one, "json_schema", schema, tokenizer, "[1,  2]")
