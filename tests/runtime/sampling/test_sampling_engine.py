"""Sampling through the Engine: seeds, top-k, stops, min tokens, logprobs, validation."""

from __future__ import annotations

import pytest

from tests.conftest import assert_no_leak

PROMPT = "Tell me a story about a dragon."


def test_same_seed_same_text_whatever_the_batch(tiny_engine):
    p = {"max_new_tokens": 16, "temperature": 1.0, "sampling_seed": 1234}
    alone = tiny_engine.generate(PROMPT, p)["output_ids"]
    batch = tiny_engine.generate(
        ["Other prompt one", PROMPT, "A third, longer prompt for the batch"],
        [{"max_new_tokens": 8, "temperature": 1.0}, p, {"max_new_tokens": 20, "temperature": 0.7}],
    )
    assert batch[1]["output_ids"] == alone
    other_seed = tiny_engine.generate(PROMPT, {**p, "sampling_seed": 99})["output_ids"]
    assert other_seed != alone


def test_top_k_one_equals_greedy(tiny_engine):
    greedy = tiny_engine.generate(PROMPT, {"max_new_tokens": 16, "temperature": 0})
    top1 = tiny_engine.generate(PROMPT, {"max_new_tokens": 16, "temperature": 1.5, "top_k": 1})
    assert top1["output_ids"] == greedy["output_ids"]


def test_stop_string_trimmed_and_reported(smol_engine):
    out = smol_engine.generate(
        "Count: 1, 2, 3,", {"max_new_tokens": 32, "temperature": 0, "stop": " 6"}
    )
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": " 6"}
    assert out["text"].endswith("5,") and " 6" not in out["text"]


def test_stop_token_id_and_ignore_eos(tiny_engine):
    first = tiny_engine.generate(PROMPT, {"max_new_tokens": 8, "temperature": 0})["output_ids"]
    out = tiny_engine.generate(
        PROMPT, {"max_new_tokens": 8, "temperature": 0, "stop_token_ids": [first[2]]}
    )
    assert out["output_ids"] == first[: first.index(first[2]) + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": first[2]}


def test_min_new_tokens_holds_back_eos(smol_engine):
    chat = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    short = smol_engine.generate(chat, {"max_new_tokens": 64, "temperature": 0})
    n = short["meta_info"]["completion_tokens"]
    assert short["meta_info"]["finish_reason"]["type"] == "stop" and n < 40
    longer = smol_engine.generate(
        chat, {"max_new_tokens": 64, "temperature": 0, "min_new_tokens": n + 5}
    )
    assert longer["meta_info"]["completion_tokens"] >= n + 5


def test_min_new_tokens_holds_back_stop_strings_too(tiny_engine):
    """As SGLang and vLLM: before ``min_new_tokens`` no stop of any kind ends the output."""
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    free = tiny_engine.generate(PROMPT, params)
    stop = tiny_engine.tokenizer.decode(free["output_ids"][1:2])  # the second token's text
    early = tiny_engine.generate(PROMPT, {**params, "stop": [stop]})
    assert early["meta_info"]["completion_tokens"] <= 2
    held = tiny_engine.generate(PROMPT, {**params, "stop": [stop], "min_new_tokens": 8})
    assert held["meta_info"]["completion_tokens"] >= 8
    assert held["output_ids"][:8] == free["output_ids"][:8]


def test_output_logprobs_match_prompt_logprobs(tiny_engine):
    out = tiny_engine.generate(
        PROMPT, {"max_new_tokens": 6, "temperature": 0}, return_logprob=True, top_logprobs_num=3
    )
    meta = out["meta_info"]
    lps = meta["output_token_logprobs"]
    assert [t for _, t, _ in lps] == out["output_ids"]
    for (lp, tid, _), top in zip(lps, meta["output_top_logprobs"]):
        assert top[0][0] == pytest.approx(lp, abs=1e-5) and top[0][1] == tid  # greedy = top-1
    ids = tiny_engine.tokenizer.encode(PROMPT) + out["output_ids"][:-1]
    again = tiny_engine.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 1},
        return_logprob=True,
        logprob_start_len=0,
        return_text_in_logprobs=True,
    )
    prompt_lps = again["meta_info"]["input_token_logprobs"]
    assert prompt_lps[0][0] is None and len(prompt_lps) == len(ids)
    n_prompt = len(tiny_engine.tokenizer.encode(PROMPT))
    for (lp, tid, text), (lp2, tid2, _) in zip(prompt_lps[n_prompt:], lps):
        assert tid == tid2 and lp == pytest.approx(lp2, abs=1e-4) and isinstance(text, str)


@pytest.mark.parametrize(
    "params,field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -3}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"stop": [""]}, "stop"),
        ({"min_new_tokens": 10, "max_new_tokens": 5}, "min_new_tokens"),
        ({"no_such_param": 1}, "no_such_param"),
        ({"regex": "a", "json_schema": {}}, "only one of"),
        ({"logit_bias": {"5": 101}}, r"logit_bias\[5\]"),
        ({"logit_bias": {"x": 1}}, "logit_bias keys"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias keys must be token ids in"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "at most 300"),
        ({"logit_bias": [1]}, "logit_bias"),
        ({"ebnf": "root ::= ("}, "ebnf"),
    ],
)
def test_invalid_parameters_raise_value_error(tiny_engine, params, field):
    with pytest.raises(ValueError, match=field):
        tiny_engine.generate(PROMPT, params)


def test_logit_bias_forces_and_bans_tokens(tiny_engine):
    p = {"max_new_tokens": 6, "temperature": 0}
    greedy = tiny_engine.generate(PROMPT, p)["output_ids"]
    forced = tiny_engine.generate(PROMPT, {**p, "logit_bias": {"7": 100}})["output_ids"]
    assert forced == [7] * 6
    banned = {str(t): -100 for t in set(greedy)}
    out = tiny_engine.generate(PROMPT, {**p, "logit_bias": banned})["output_ids"]
    assert not set(out) & set(greedy)
    # batched with an unbiased request, each row keeps its own bias
    both = tiny_engine.generate([PROMPT, PROMPT], [{**p, "logit_bias": {7: 100}}, p])
    assert [r["output_ids"] for r in both] == [[7] * 6, greedy]


def test_prompt_over_context_length_is_refused(tiny_engine):
    ctx = tiny_engine.info["context_len"]
    with pytest.raises(ValueError, match=str(ctx)):
        tiny_engine.generate(input_ids=[5] * (ctx - 2), sampling_params={"max_new_tokens": 10})


def test_streaming_chunks_concatenate_to_the_text(smol_engine):
    p = {"max_new_tokens": 24, "temperature": 0}
    chunks = list(smol_engine.generate("Once upon a time", p, stream=True))
    final = smol_engine.generate("Once upon a time", p)
    assert "".join(c["text"] for c in chunks) == final["text"]
    assert sum(len(c["output_ids"]) for c in chunks) == 24
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_no_slot_leaks(tiny_engine, smol_engine):
    assert_no_leak(tiny_engine)
    assert_no_leak(smol_engine)
