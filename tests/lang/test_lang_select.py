"""select with SmolLM2: a choice comes back and its scores are the Engine's mean logprobs."""

from __future__ import annotations

import pytest

import radixlm as sgl

PREFIX = "The capital of France is"
CHOICES = [" Paris", " Rome", " a city in Italy"]


@sgl.function
def pick_capital(s, method=sgl.token_length_normalized):
    s += PREFIX
    s += sgl.select("city", choices=CHOICES, choices_method=method)


def _direct_mean_logprobs(engine, prefix, choices):
    tok = engine.tokenizer
    base = tok.encode(prefix)
    means = []
    for choice in choices:
        ids = tok.encode(prefix + choice)
        k = next(i for i, (a, b) in enumerate(zip(base + [None], ids)) if a != b)
        out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0},
                              return_logprob=True, logprob_start_len=k)
        values = [lp for lp, *_ in out["meta_info"]["input_token_logprobs"]]
        means.append(sum(values) / len(values))
    return means


def test_select_scores_equal_engine_mean_logprobs(smol, smol_engine):
    state = pick_capital.run(backend=smol)
    assert state["city"] == " Paris"
    assert state.text() == PREFIX + " Paris"
    meta = state.get_meta_info("city")
    expected = _direct_mean_logprobs(smol_engine, PREFIX, CHOICES)
    assert meta["normalized_prompt_logprobs"] == pytest.approx(expected, abs=1e-3)
    assert [len(t) for t in meta["input_token_logprobs"]] == [1, 1, 4]


@pytest.mark.parametrize("method", [sgl.greedy_token_selection,
                                    sgl.unconditional_likelihood_normalized])
def test_other_choice_methods_return_a_choice(smol, method):
    state = pick_capital.run(method=method, backend=smol)
    assert state["city"] in CHOICES
    assert "normalized_prompt_logprobs" in state.get_meta_info("city")


def test_select_inside_a_chat_turn(smol):
    @sgl.function
    def yes_no(s):
        s += sgl.user("Is Paris the capital of France? Answer yes or no.")
        s += sgl.assistant(sgl.gen("verdict", choices=["yes", "no"]))

    state = yes_no.run(backend=smol)
    assert state["verdict"] in ("yes", "no")
    assert state.messages()[-1] == {"role": "assistant", "content": state["verdict"]}


def test_select_rejects_sampling_temperature(smol):
    @sgl.function
    def hot(s):
        s += PREFIX + sgl.select("x", choices=["a", "b"], temperature=0.7)

    assert isinstance(hot.run(backend=smol).error(), ValueError)
