"""Constrained decoding through the scheduler and the Engine: every output validates."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from backend_params import BACKENDS, needs_xgrammar

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.messages import FinishKind, GenerateReq, Sampling
from radixlm.runtime.sampling.params import parse_sampling
from radixlm.runtime.scheduler.scheduler import Scheduler

# NOTE: a random-weight model will happily write digits forever, so every value here is bounded
# (the language of each schema is finite) and a correct engine always stops.
SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 8},
                "minItems": 1,
                "maxItems": 3,
            }
        },
        "required": ["tags"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": -10, "maximum": 10},
                    "y": {"type": "integer", "minimum": 0, "maximum": 5000},
                },
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "required": ["point"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "id": {
                "anyOf": [
                    {"type": "integer", "minimum": 0, "maximum": 999},
                    {"type": "string", "pattern": "^[a-z]{2,4}$"},
                ]
            }
        },
        "required": ["id"],
        "additionalProperties": False,
    },
]
REGEXES = [r"\d{3}-\d{4}", r"(yes|no)", r"[A-Z][a-z]{1,6} [A-Z][a-z]{1,6}", r"0x[0-9a-f]{2,6}"]


def run(scheduler: Scheduler, reqs: list[GenerateReq]) -> dict[str, tuple[list[int], dict]]:
    out: dict[str, list[int]] = {}
    done: dict[str, dict] = {}
    for r in reqs:
        scheduler.handle(r)
    while scheduler.has_work or scheduler.outbox:
        for o in scheduler.step():
            out.setdefault(o.rid, []).extend(o.new_ids)
            if o.finish is not None:
                done[o.rid] = o.finish
    scheduler.cache.check_idle()
    return {rid: (out.get(rid, []), done[rid]) for rid in done}


def constrained_requests(tok) -> list[GenerateReq]:
    reqs = []
    prompt = tok.encode("Answer in the requested format:")
    for i, schema in enumerate(SCHEMAS):
        for mode, params in (
            ("greedy", {"temperature": 0}),
            ("s1", {"temperature": 1.0, "sampling_seed": 1}),
            ("s2", {"temperature": 1.0, "sampling_seed": 2}),
        ):
            sampling = {"max_new_tokens": 200, "json_schema": json.dumps(schema), **params}
            reqs.append(GenerateReq(f"schema{i}-{mode}", prompt, parse_sampling(sampling)))
    for i, regex in enumerate(REGEXES):
        for mode, params in (
            ("greedy", {"temperature": 0}),
            ("s1", {"temperature": 1.0, "sampling_seed": 3}),
        ):
            reqs.append(
                GenerateReq(
                    f"regex{i}-{mode}",
                    prompt,
                    parse_sampling({"max_new_tokens": 60, "regex": regex, **params}),
                )
            )
    return reqs


def check(results, tok) -> None:
    for rid, (ids, finish) in results.items():
        text = tok.decode(ids, skip_special_tokens=True)
        assert finish.kind is FinishKind.STOP, (rid, finish, text)
        kind, index = re.match(r"([a-z]+)(\d+)", rid).groups()
        if kind == "schema":
            jsonschema.validate(json.loads(text), SCHEMAS[int(index)])
        else:
            assert re.fullmatch(REGEXES[int(index)], text), (rid, text)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("jump_forward", [True, False])
def test_outputs_validate(tiny_llama, backend, jump_forward):
    scheduler = Scheduler(
        ServerArgs(
            model_path=tiny_llama,
            dtype="float32",
            max_total_tokens=8192,
            grammar_backend=backend,
            disable_jump_forward=not jump_forward,
        )
    )
    tok = scheduler.runner.tokenizer
    check(run(scheduler, constrained_requests(tok)), tok)


def test_constrained_and_free_requests_batch_like_alone(tiny_llama):
    args = ServerArgs(model_path=tiny_llama, dtype="float32", max_total_tokens=8192)
    scheduler = Scheduler(args)
    tok = scheduler.runner.tokenizer
    reqs = constrained_requests(tok)[:6]
    free = [
        GenerateReq(
            f"free{i}",
            tok.encode(f"Free text {i}"),
            Sampling(max_new_tokens=20, temperature=0, ignore_eos=True),
        )
        for i in range(3)
    ]
    together = run(scheduler, reqs + free)
    alone = {}
    for r in reqs + free:
        alone.update(run(scheduler, [r]))
    assert together == alone


def test_engine_json_schema_and_choices(smol_engine):
    chat = smol_engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Describe a person named Alice who is 30, as JSON."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    out = smol_engine.generate(
        chat, {"max_new_tokens": 80, "temperature": 0, "json_schema": SCHEMAS[0]}
    )
    person = json.loads(out["text"])
    jsonschema.validate(person, SCHEMAS[0])
    pick = smol_engine.generate(
        "The sky is usually",
        {"max_new_tokens": 8, "temperature": 0, "choices": ["blue", "green", "purple"]},
    )
    assert pick["text"] in ("blue", "green", "purple")


@pytest.mark.parametrize(
    "params,message",
    [
        ({"regex": "(?=a)b"}, "look-around"),
        ({"regex": r"(a)\1"}, "back-references"),
        ({"regex": "[unclosed"}, "regex"),
        ({"json_schema": {"type": "nosuchtype"}}, "json_schema"),
        ({"json_schema": "{not json"}, "json_schema"),
        ({"regex": "a", "choices": ["a"]}, "only one of"),
    ],
)
def test_invalid_constraints_raise(smol_engine, params, message):
    with pytest.raises(ValueError, match=message):
        smol_engine.generate("Hi", {"max_new_tokens": 4, **params})
    assert smol_engine.generate("Hi", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2


@needs_xgrammar
def test_engine_on_xgrammar(tiny_llama):
    """``grammar_backend="xgrammar"`` end to end: valid JSON; a bad spec is a ValueError (an
    HTTP 400 on the server) and the engine keeps serving."""
    from radixlm import Engine

    engine = Engine(tiny_llama, dtype="float32", max_total_tokens=8192, grammar_backend="xgrammar")
    try:
        for seed in (None, 1):
            params = {"temperature": 0} if seed is None else {"sampling_seed": seed}
            out = engine.generate(
                "Answer:", {"max_new_tokens": 200, "json_schema": SCHEMAS[3], **params}
            )
            assert out["meta_info"]["finish_reason"]["type"] == "stop", out
            jsonschema.validate(json.loads(out["text"]), SCHEMAS[3])
        with pytest.raises(ValueError, match="invalid regex"):
            engine.generate("Hi", {"max_new_tokens": 4, "regex": "[unclosed"})
        with pytest.raises(ValueError, match="uniqueItems"):
            engine.generate("Hi", {"max_new_tokens": 4, "json_schema": {"uniqueItems": True}})
        assert engine.generate("Hi", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2
    finally:
        engine.shutdown()
