"""The three choice-scoring methods, on hand-made token logprobs."""

from __future__ import annotations

import pytest

import radixlm as sgl
from radixlm.lang.choices import mean_logprob


def _entries(*logprobs):
    return [[lp, i, f"t{i}"] for i, lp in enumerate(logprobs)]


CHOICES = ["short", "longer one"]
INPUTS = [_entries(-1.0), _entries(-0.5, -3.0)]


def _call(method, unconditional=None):
    return method(
        choices=CHOICES,
        normalized_prompt_logprobs=[mean_logprob(e) for e in INPUTS],
        input_token_logprobs=INPUTS,
        output_token_logprobs=[[], []],
        unconditional_token_logprobs=unconditional,
    )


def test_token_length_normalized_picks_the_best_mean():
    decision = _call(sgl.token_length_normalized)
    assert decision.decision == "short"
    assert decision.meta_info["normalized_prompt_logprobs"] == [-1.0, -1.75]


def test_greedy_token_selection_compares_position_by_position():
    decision = _call(sgl.greedy_token_selection)
    assert decision.decision == "longer one"
    assert decision.meta_info["greedy_logprob_matrix"] == [[-1.0, -1.0], [-0.5, -3.0]]


def test_unconditional_likelihood_normalized_subtracts_the_choice_alone():
    unconditional = [_entries(None), [[None, 0, "t0"], [-0.5, 1, "t1"]]]
    decision = _call(sgl.unconditional_likelihood_normalized, unconditional)
    assert decision.meta_info["normalized_unconditional_prompt_logprobs"] == [-1.0, -1.5]
    assert decision.decision == "short"
    with pytest.raises(ValueError, match="unconditional"):
        _call(sgl.unconditional_likelihood_normalized)


def test_mean_logprob_skips_the_unscored_first_token():
    assert mean_logprob([[None, 1, "a"], [-2.0, 2, "b"]]) == -2.0
    with pytest.raises(ValueError):
        mean_logprob([[None, 1, "a"]])
