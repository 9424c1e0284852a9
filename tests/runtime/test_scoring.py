"""Engine.score (SGLang's scoring): label-token probabilities after query + item equal
transformers' next-token distribution, as text and token ids, item first or last."""

from __future__ import annotations

import pytest
import torch

LABELS = [5, 17, 300]


@pytest.fixture(scope="module")
def hf_next(tiny_llama):
    """transformers' next-token probabilities after a prompt of token ids."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()

    def probs(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0, -1].softmax(-1)

    return probs


def _check(got: list[list[float]], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for row, w in zip(got, want):
        assert all(isinstance(v, float) for v in row)
        torch.testing.assert_close(torch.tensor(row, dtype=torch.float32), w, atol=1e-5,
                                   rtol=1e-4)  # fmt: skip


def test_token_id_scores_equal_transformers_both_orders(tiny_engine, hf_next):
    query, items = [11, 12, 13, 14, 15, 16], [[21], [22, 23], [24, 25, 26]]
    got = tiny_engine.score(query, items, LABELS)
    _check(got, [hf_next(query + i)[LABELS] for i in items])
    soft = tiny_engine.score(query, items, LABELS, apply_softmax=True)
    want = [(p := hf_next(query + i)[LABELS]) / p.sum() for i in items]
    _check(soft, want)
    assert all(abs(sum(row) - 1.0) < 1e-6 for row in soft)
    first = tiny_engine.score(query, items, LABELS, item_first=True)
    _check(first, [hf_next(i + query)[LABELS] for i in items])


def test_text_scores_tokenize_query_and_item_together(tiny_engine, hf_next):
    tok = tiny_engine.tokenizer
    query, items = "The capital of France is", [" Paris", " London", ""]
    got = tiny_engine.score(query, items, LABELS, apply_softmax=True)
    want = []
    for item in items:
        p = hf_next(tok.encode(query + item))[LABELS]
        want.append(p / p.sum())
    _check(got, want)
    one = tiny_engine.score(query, " Paris", LABELS, apply_softmax=True)
    assert one == [pytest.approx(got[0], rel=1e-4)]


def test_bad_scoring_input_is_a_value_error_naming_the_field(tiny_engine):
    vocab = tiny_engine.info["vocab_size"]
    cases = [
        (("q", ["a"], [vocab]), "label_token_ids: Token ID"),
        (("q", ["a"], []), "label_token_ids must be a non-empty"),
        (("q", [[1, 2]], [1]), "both be text or both be token ids"),
        (([1, 2], ["a"], [1]), "both be text or both be token ids"),
        (("q", [], [1]), "items must be"),
        (([], [[]], [1]), "nothing to score"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            tiny_engine.score(*args)
