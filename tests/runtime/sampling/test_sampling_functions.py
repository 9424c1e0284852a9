"""The pure sampling functions: each penalty and filter changes logits as defined."""

from __future__ import annotations

import torch

from radixlm.runtime.messages import Sampling
from radixlm.runtime.sampling import penalties
from radixlm.runtime.sampling.sampler import SampleRow, filtered_probs, sample


def test_frequency_and_presence_penalties():
    logits = torch.zeros(1, 5)
    counts = penalties.token_counts([[1, 1, 3]], 5, torch.device("cpu"))
    out = penalties.apply_frequency_presence(
        logits, counts, torch.tensor([0.5]), torch.tensor([0.25])
    )
    assert out.tolist() == [[0.0, -1.25, 0.0, -0.75, 0.0]]


def test_repetition_penalty_divides_positive_multiplies_negative():
    logits = torch.tensor([[2.0, -2.0, 2.0]])
    seen = torch.tensor([[True, True, False]])
    out = penalties.apply_repetition(logits, seen, torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 2.0]]


def test_top_k_top_p_min_p_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))

    def kept(**kw):
        return (filtered_probs(logits.clone(), [Sampling(**kw)]) > 0).tolist()[0]

    assert kept(top_k=2) == [True, True, False, False]
    assert kept(top_p=0.7) == [True, True, False, False]
    assert kept(top_p=0.85) == [True, True, True, False]
    assert kept(min_p=0.5) == [True, True, False, False]


def test_greedy_banned_tokens_and_logprobs():
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    row = SampleRow(Sampling(temperature=0), [0], [], banned_ids=[1])
    out = sample(logits.clone(), [row], top_n=2)
    assert out.token_ids == [2]
    expected = torch.log_softmax(logits, -1)[0]
    assert abs(out.logprobs[0] - expected[2].item()) < 1e-6
    assert [t for _, t in out.top_logprobs[0]] == [1, 2]


def test_logit_bias_per_row_before_the_grammar_mask():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]] * 3)
    rows = [
        SampleRow(Sampling(temperature=0, logit_bias={3: 100.0}), [0], [], []),
        SampleRow(Sampling(temperature=0, logit_bias={1: -100.0, 2: -0.5}), [0], [], []),
        SampleRow(Sampling(temperature=0), [0], [], []),
    ]
    assert sample(logits.clone(), rows).token_ids == [3, 2, 1]
    # NOTE: a mask still wins over a bias: token 3 is banned by the grammar in every row
    bitmask = torch.tensor([[0b0111]] * 3, dtype=torch.int32)
    assert sample(logits.clone(), rows, bitmask).token_ids == [1, 2, 1]
    # the logprobs a request gets are the model's, before the bias (as vLLM reports them)
    out = sample(logits.clone(), rows[:1])
    assert abs(out.logprobs[0] - torch.log_softmax(logits[0], -1)[3].item()) < 1e-6


def test_seeded_sampling_is_reproducible_and_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    picks = []
    for seed in range(400):
        row = SampleRow(Sampling(temperature=1.0, sampling_seed=seed), [0], [], [])
        picks.append(sample(logits.clone(), [row]).token_ids[0])
        again = sample(logits.clone(), [row]).token_ids[0]
        assert again == picks[-1]
    share = picks.count(0) / len(picks)
    assert 0.6 < share < 0.8
