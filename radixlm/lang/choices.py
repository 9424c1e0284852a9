"""How ``select`` picks a choice from the log-probabilities of each choice's tokens.

Token logprob entries are ``[logprob, token_id, text]``, as in the runtime's responses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

TokenLogprobs = list[list[Any]]


@dataclass
class ChoicesDecision:
    """The chosen text and the scores behind it."""

    decision: str
    meta_info: dict[str, Any] | None = None


def mean_logprob(entries: TokenLogprobs) -> float:
    """The mean logprob of ``entries``, skipping ``None`` (a sequence's first token)."""
    values = [e[0] for e in entries if e[0] is not None]
    if not values:
        raise ValueError("a choice has no scored tokens")
    return sum(values) / len(values)


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


class ChoicesSamplingMethod(ABC):
    """A rule that turns per-choice token logprobs into a decision."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return False

    @abstractmethod
    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[TokenLogprobs],
        output_token_logprobs: list[TokenLogprobs],
        unconditional_token_logprobs: list[TokenLogprobs] | None = None,
    ) -> ChoicesDecision: ...


def _meta(normalized: list[float], inputs: list[TokenLogprobs], outputs: list[TokenLogprobs],
          **extra: Any) -> dict[str, Any]:
    return {
        "normalized_prompt_logprobs": normalized,
        "input_token_logprobs": inputs,
        "output_token_logprobs": outputs,
        **extra,
    }


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The choice with the highest mean token logprob."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs,
                 output_token_logprobs, unconditional_token_logprobs=None) -> ChoicesDecision:
        best = choices[_argmax(normalized_prompt_logprobs)]
        meta = _meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs)
        return ChoicesDecision(best, meta)


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Compare choices token by token, keeping those with the best logprob at each position.

    A shorter choice is padded with its own mean logprob.
    """

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs,
                 output_token_logprobs, unconditional_token_logprobs=None) -> ChoicesDecision:
        width = max(len(option) for option in input_token_logprobs)
        matrix = [self._padded_row(option, width) for option in input_token_logprobs]
        remaining = list(range(len(choices)))
        for j in range(width):
            best = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == best]
            if len(remaining) == 1:
                break
        meta = _meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                     greedy_logprob_matrix=matrix)
        return ChoicesDecision(choices[remaining[0]], meta)

    @staticmethod
    def _padded_row(option: TokenLogprobs, width: int) -> list[float]:
        values = [e[0] for e in option]
        mean = sum(values) / len(values) if values else float("nan")
        return values + [mean] * (width - len(values))


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """The choice whose tokens gain the most, on average, from the prompt: the mean of
    ``logprob(token | prompt) - logprob(token | choice alone)``."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs,
                 output_token_logprobs, unconditional_token_logprobs=None) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional token logprobs are required for this method")
        scores = [
            self._gain(cond, uncond)
            for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs)
        ]
        meta = _meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                     unconditional_token_logprobs=unconditional_token_logprobs,
                     normalized_unconditional_prompt_logprobs=scores)
        return ChoicesDecision(choices[_argmax(scores)], meta)

    @staticmethod
    def _gain(cond: TokenLogprobs, uncond: TokenLogprobs) -> float:
        if len(cond) != len(uncond):
            raise ValueError("conditional and unconditional logprobs differ in length")
        diffs = [c[0] - (u[0] or 0.0) for c, u in zip(cond, uncond)]
        return sum(diffs) / len(diffs)


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
