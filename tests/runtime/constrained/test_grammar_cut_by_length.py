"""A constrained output that ends is a whole match; one cut by ``max_new_tokens`` ends with
``length`` and is a prefix of a match. Anchored patterns in the shape of SGLang's regex tests,
on the embedded SmolLM2 (a real model writes long runs where a pattern lets it), greedy and
sampled, on every grammar backend; JSON mode (any object, as ``response_format`` ``json_object``
asks) checked against a recursive JSON pattern of its own."""

from __future__ import annotations

import json

import pytest
import regex
from backend_params import BACKENDS
from test_constrained_engine import run

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.messages import FinishKind, GenerateReq
from radixlm.runtime.sampling.params import parse_sampling
from radixlm.runtime.scheduler.scheduler import Scheduler

CASES = [
    (r"^(Hi|Hello|Hey)$", "Write a greeting:"),
    (r"^\d{3}$", "Write a number with three digits:"),
    (r"^\(\d{3}\) \d{3}-\d{4}$", "Write a phone number:"),
    (r"^2025-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$", "Write a date:"),
    (r"^\[2025-06-01T08:30:00Z\] WARN: Disk\.check - Volume [a-z]+ is full$", "Write a log line:"),
    (r'^\{\s*"title"\s*:\s*"[a-zA-Z ]+"\s*,\s*"year"\s*:\s*[1-9][0-9]*\s*\}$', "Write JSON:"),
]
MAX_NEW = 24  # NOTE: short enough that the runs of [a-z]+, [a-zA-Z ]+ and \s* get cut


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_match_or_are_a_prefix_of_a_match(smollm_path, backend):
    scheduler = Scheduler(ServerArgs(model_path=smollm_path, dtype="float32",
                                     max_total_tokens=4096, grammar_backend=backend))  # fmt: skip
    tok = scheduler.runner.tokenizer
    reqs = []
    for i, (pattern, prompt) in enumerate(CASES):
        for j, params in enumerate([{"temperature": 0}, {"temperature": 0.5, "sampling_seed": 1},
                                    {"temperature": 0.5, "sampling_seed": 2}]):  # fmt: skip
            sampling = parse_sampling({"max_new_tokens": MAX_NEW, "regex": pattern, **params})
            reqs.append(GenerateReq(f"{i}-{j}", tok.encode(prompt), sampling))
    kinds = set()
    for rid, (ids, finish) in run(scheduler, reqs).items():
        pattern = CASES[int(rid.split("-")[0])][0].removeprefix("^").removesuffix("$")
        text = tok.decode(ids, skip_special_tokens=True)
        kinds.add(finish.kind)
        if finish.kind is FinishKind.STOP:
            assert regex.fullmatch(pattern, text), (backend, rid, text)
        else:
            assert finish.kind is FinishKind.LENGTH and len(ids) == MAX_NEW, (rid, finish)
            assert regex.fullmatch(pattern, text, partial=True), (backend, rid, text)
    assert kinds == {FinishKind.STOP, FinishKind.LENGTH}  # NOTE: both kinds are checked


JSON_VALUE = regex.compile(r"""(?(DEFINE)
    (?<ws>[ \t\n\r]*)
    (?<str>"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*")
    (?<num>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
    (?<val>(?&obj)|(?&arr)|(?&str)|(?&num)|true|false|null)
    (?<member>(?&str)(?&ws):(?&ws)(?&val)(?&ws))
    (?<obj>\{(?&ws)(?:(?&member)(?:,(?&ws)(?&member))*)?\})
    (?<arr>\[(?&ws)(?:(?&val)(?&ws)(?:,(?&ws)(?&val)(?&ws))*)?\])
)(?&ws)(?&obj)(?&ws)""", regex.VERBOSE)  # NOTE: `regex` recurses and matches partially


def test_json_pattern_tells_prefixes_from_mistakes():
    for prefix in ['{"a": [1, {"b": tr', '{"a": 1.', '{"c": "x\\u12', '{ "k"']:
        assert JSON_VALUE.fullmatch(prefix, partial=True) and not JSON_VALUE.fullmatch(prefix)
    for wrong in ['{"a" 1', '{"a": 1}}', '{"a":,', '[1]', '{"a": tru }']:
        assert not JSON_VALUE.fullmatch(wrong, partial=True), wrong
    assert JSON_VALUE.fullmatch('{"a": {"b": [1, 2e3, null]}, "c": "x\\n"}')


@pytest.mark.parametrize("backend", BACKENDS)
def test_json_mode_ends_as_an_object_or_a_prefix_of_one(smollm_path, backend):
    scheduler = Scheduler(ServerArgs(model_path=smollm_path, dtype="float32",
                                     max_total_tokens=4096, grammar_backend=backend))  # fmt: skip
    tok = scheduler.runner.tokenizer
    prompt = tok.encode("A book as a JSON object with its title and year:")
    reqs = [
        GenerateReq(f"{max_new}-{j}", prompt, parse_sampling(
            {"max_new_tokens": max_new, "json_schema": '{"type": "object"}', **params}))
        for max_new in (12, 96)
        for j, params in enumerate([{"temperature": 0}, {"temperature": 0.7, "sampling_seed": 3}])
    ]  # fmt: skip
    kinds = set()
    for rid, (ids, finish) in run(scheduler, reqs).items():
        text = tok.decode(ids, skip_special_tokens=True)
        kinds.add(finish.kind)
        if finish.kind is FinishKind.STOP:
            assert isinstance(json.loads(text), dict) and JSON_VALUE.fullmatch(text), (rid, text)
        else:
            assert finish.kind is FinishKind.LENGTH and len(ids) == int(rid.split("-")[0])
            assert JSON_VALUE.fullmatch(text, partial=True), (backend, rid, text)
    assert kinds == {FinishKind.STOP, FinishKind.LENGTH}  # NOTE: 12 tokens cut, 96 end
