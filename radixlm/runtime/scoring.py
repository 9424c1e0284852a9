"""Scoring, as SGLang's ``/v1/score`` and ``Engine.score``: how likely each of some label
tokens is to come next after ``query + item``, for every item.

Each item is one request that generates a single greedy token with ``token_ids_logprob``: the
first output token's logprobs come from the prefill's last logits, so no decode step runs, and
items after a shared query reuse its KV from the radix tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from radixlm.runtime.io_struct import GenerateInput, is_int


@dataclass
class ScoreInput:
    """``query`` and ``items`` are both text or both token ids; ``item_first`` puts each item
    before the query instead of after it."""

    query: str | list[int]
    items: str | list[str] | list[list[int]]
    label_token_ids: list[int]
    apply_softmax: bool = False  # normalise over the labels; else each label's probability
    item_first: bool = False
    cache_salt: str | None = None
    lora_path: str | None = None

    def generate_input(self, vocab_size: int) -> GenerateInput:
        labels = self.label_token_ids
        if not isinstance(labels, list) or not labels or not all(map(is_int, labels)):
            raise ValueError("label_token_ids must be a non-empty list of token ids")
        bad = next((t for t in labels if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ValueError(f"label_token_ids: Token ID {bad} is out of vocabulary (vocab "
                             f"size: {vocab_size})")  # fmt: skip
        items = [self.items] if isinstance(self.items, str) else self.items
        if not isinstance(items, list) or not items:
            raise ValueError("items must be a string or a non-empty list")
        both = "query and items must both be text or both be token ids"
        if isinstance(self.query, str):
            if not all(isinstance(i, str) for i in items):
                raise ValueError(both)
            text = [self._join(self.query, i) for i in items]
            if "" in text:
                raise ValueError("query and items are empty: there is nothing to score after")
            return self._input(text=text)
        ids = [self.query, *items]
        if not all(isinstance(x, list) and all(map(is_int, x)) for x in ids):
            raise ValueError(both)
        prompts = [self._join(self.query, i) for i in items]
        if [] in prompts:
            raise ValueError("query and items are empty: there is nothing to score after")
        return self._input(input_ids=prompts)

    def _join(self, query, item):
        return item + query if self.item_first else query + item

    def _input(self, **prompts) -> GenerateInput:
        n = len(next(iter(prompts.values())))
        return GenerateInput(
            **prompts,
            sampling_params={"max_new_tokens": 1, "temperature": 0.0},
            return_logprob=True,
            token_ids_logprob=list(self.label_token_ids),
            cache_salt=self.cache_salt,
            lora_path=[self.lora_path] * n,
        )

    def scores(self, outputs: list[dict]) -> list[list[float]]:
        """Per item, one score per label in ``label_token_ids`` order."""
        return [self._row(out["meta_info"]["output_token_ids_logprobs"][0]) for out in outputs]

    def _row(self, entries: list) -> list[float]:
        by_id = {e[1]: e[0] for e in entries}
        logprobs = [by_id[t] for t in self.label_token_ids]
        if not self.apply_softmax:
            return [math.exp(lp) for lp in logprobs]
        top = max(logprobs)
        weights = [math.exp(lp - top) for lp in logprobs]
        total = sum(weights)
        return [w / total for w in weights]
