"""``skip_tokenizer_init``: a model directory without tokenizer files, token ids in and out."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.loader.loader import load_model
from radixlm.runtime.messages import GenerateReq
from radixlm.runtime.sampling.params import parse_sampling
from radixlm.runtime.scheduler.scheduler import Scheduler
from tests.conftest import assert_no_leak

PROMPT = "Tell me a story about a dragon."
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def bare_engine(bare_llama):
    from radixlm import Engine

    engine = Engine(bare_llama, dtype="float32", max_total_tokens=4096, skip_tokenizer_init=True)
    yield engine
    engine.shutdown()


@pytest.fixture(autouse=True)
def _bare_engine_slots_freed(request):
    yield
    if "bare_engine" in request.fixturenames:
        assert_no_leak(request.getfixturevalue("bare_engine"))


def test_ids_in_ids_out_match_the_model_with_its_tokenizer(bare_engine, tiny_engine):
    assert bare_engine.tokenizer is None
    ids = tiny_engine.tokenizer.encode(PROMPT)
    want = tiny_engine.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"]
    out = bare_engine.generate(input_ids=ids, sampling_params=GREEDY)
    assert out["output_ids"] == want and len(want) == GREEDY["max_new_tokens"]
    assert out["text"] == ""
    chunks = list(bare_engine.generate(input_ids=ids, sampling_params=GREEDY, stream=True))
    assert [t for c in chunks for t in c["output_ids"]] == want
    assert all(c["text"] == "" for c in chunks)


def test_stop_token_ids_and_logprobs_work_without_text(bare_engine, tiny_engine):
    ids = tiny_engine.tokenizer.encode(PROMPT)
    first = bare_engine.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"]
    out = bare_engine.generate(
        input_ids=ids,
        sampling_params={**GREEDY, "stop_token_ids": [first[2]]},
        return_logprob=True,
        return_text_in_logprobs=True,
    )
    assert out["output_ids"] == first[: first.index(first[2]) + 1]
    entries = out["meta_info"]["output_token_logprobs"]
    assert [e[1] for e in entries] == out["output_ids"]
    assert all(e[2] is None for e in entries)


NEEDS_TOKENIZER = [
    ({"prompt": PROMPT}, "text.*input_ids"),
    ({"input_ids": [1, 2, 3], "sampling_params": {"stop": "."}}, "stop.*stop_token_ids"),
    ({"input_ids": [1, 2, 3], "sampling_params": {"json_schema": {}}}, "json_schema"),
    ({"input_ids": [1, 2, 3], "sampling_params": {"regex": "a+"}}, "regex"),
    ({"input_ids": [1, 2, 3], "sampling_params": {"choices": ["a", "b"]}}, "choices"),
]


@pytest.mark.parametrize("kwargs, message", NEEDS_TOKENIZER)
def test_what_needs_a_tokenizer_is_refused(bare_engine, kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        bare_engine.generate(**kwargs)
    assert "skip_tokenizer_init" in str(info.value)


def test_dummy_weights_from_a_bare_config(bare_llama, tmp_path):
    """``load_format="dummy"`` needs only config.json."""
    shutil.copy(os.path.join(bare_llama, "config.json"), tmp_path)
    args = ServerArgs(
        model_path=str(tmp_path),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="float32",
        max_total_tokens=256,
    )
    loaded = load_model(args, torch.device("cpu"), torch.float32)
    assert loaded.tokenizer is None and loaded.config.eos_token_ids
    scheduler = Scheduler(args)
    scheduler.handle(GenerateReq("ok", [5, 6, 7], parse_sampling({**GREEDY, "max_new_tokens": 3})))
    outs: dict = {}
    while scheduler.has_work or scheduler.outbox:
        for o in scheduler.step():
            outs.setdefault(o.rid, []).append(o)
    assert len([t for o in outs["ok"] for t in o.new_ids]) == 3
