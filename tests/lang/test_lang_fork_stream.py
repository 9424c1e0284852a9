"""fork/join, copy, var_scope and streaming, on the tiny model (mechanics, not meaning)."""

from __future__ import annotations

import asyncio

import radixlm as sgl
from tests.conftest import assert_no_leak

SHARED = "A long shared introduction that every branch starts with. " * 4


@sgl.function
def three_branches(s):
    s += SHARED
    forks = s.fork(3)
    forks += lambda i: f"Branch {i}: " + sgl.gen("idea", max_tokens=4, ignore_eos=True)
    forks[0] += "!"
    values = [f["idea"] for f in forks]
    forks.join()
    s += "Done."
    return values


def test_fork_three_branches_share_the_prefix_and_join(tiny, tiny_engine):
    tiny.flush_cache()
    state = three_branches.run(temperature=0, backend=tiny)
    values = state.ret_value
    assert len(values) == 3 and all(isinstance(v, str) and v for v in values)
    assert sorted(state["idea"]) == sorted(values)
    assert state.text() == SHARED + "Done."
    assert state.error() is None
    assert_no_leak(tiny_engine)


def test_fork_branch_requests_reuse_the_cached_prefix(tiny, tiny_engine):
    @sgl.function
    def branches(s):
        s += SHARED
        forks = s.fork(3)
        forks += lambda i: f"B{i}" + sgl.gen("x", max_tokens=2, ignore_eos=True)
        forks.join()
        s["metas"] = [f.get_meta_info("x") for f in forks]

    tiny.flush_cache()
    state = branches.run(temperature=0, backend=tiny)
    n_shared = len(tiny_engine.tokenizer.encode(SHARED))
    assert all(m["cached_tokens"] >= n_shared - 1 for m in state["metas"])


def test_copy_and_var_scope(tiny):
    @sgl.function
    def scoped(s):
        s += "Start. "
        with s.var_scope("middle"):
            s += "inner text " + sgl.gen("g", max_tokens=2, ignore_eos=True)
        with s.copy() as c:
            c += "copy only " + sgl.gen("c", max_tokens=2, ignore_eos=True)

    state = scoped.run(temperature=0, backend=tiny)
    assert state["middle"] == "inner text " + state["g"]
    assert len(state["c"]) == 1 and isinstance(state["c"][0], str)
    assert "copy only" not in state.text()


def test_join_concate_and_append_adds_the_branch_text(tiny):
    @sgl.function
    def concat(s):
        s += "Root."
        forks = s.fork(2)
        forks += [" one", " two"]
        forks.join("concate_and_append")

    assert concat.run(backend=tiny).text() == "Root. one two"


@sgl.function
def streamed(s):
    s += "Count: "
    s += sgl.gen("numbers", max_tokens=6, ignore_eos=True)
    s += " end"


def test_streaming_chunks_concatenate_to_the_final_value(tiny):
    state = streamed.run(stream=True, temperature=0, backend=tiny)
    var_chunks = list(state.text_iter("numbers"))
    assert "".join(var_chunks) == state["numbers"]
    state = streamed.run(stream=True, temperature=0, backend=tiny)
    text_chunks = list(state.text_iter())
    assert len(text_chunks) > 1
    assert "".join(text_chunks) == state.text() == "Count: " + state["numbers"] + " end"


def test_async_text_iterator(tiny):
    state = streamed.run(stream=True, temperature=0, backend=tiny)

    async def collect():
        return [chunk async for chunk in state.text_async_iter("numbers")]

    assert "".join(asyncio.run(collect())) == state["numbers"]


def test_text_iter_without_streaming_yields_the_final_value(tiny):
    state = streamed.run(temperature=0, backend=tiny)
    assert list(state.text_iter("numbers")) == [state["numbers"]]


@sgl.function
def streamed_logprobs(s):
    s += "Count: "
    s += sgl.gen("numbers", max_tokens=12, ignore_eos=True, return_logprob=True)


def test_stream_meta_data_carries_each_chunks_new_logprobs(tiny):
    """SGLang's ``text_async_iter(var, return_meta_data=True)``: (text, meta) pairs whose
    output logprobs are the chunk's own, adding up to every token."""
    state = streamed_logprobs.run(stream=True, temperature=0, backend=tiny)

    async def collect():
        return [pair async for pair in state.text_async_iter("numbers", return_meta_data=True)]

    chunks, seen = asyncio.run(collect()), 0
    assert chunks and "".join(text for text, _ in chunks) == state["numbers"]
    for text, meta in chunks:
        assert text
        assert meta["completion_tokens"] == meta["output_token_logprobs_length"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - seen
        seen = meta["completion_tokens"]
    final = state.get_meta_info("numbers")["output_token_logprobs"]
    assert [entry for _, meta in chunks for entry in meta["output_token_logprobs"]] \
        == final[:seen]
    assert list(streamed_logprobs.run(temperature=0, backend=tiny).text_iter(
        "numbers", return_meta_data=True))[0][1]["completion_tokens"] == 12


def test_backends_name_their_model(tiny):
    assert tiny.get_model_name() == str(tiny.engine.server_args.model_path) != "None"
    assert sgl.OpenAI("some-model", base_url="http://127.0.0.1:9/v1").get_model_name() \
        == "some-model"
