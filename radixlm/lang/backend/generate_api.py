"""Shared logic of the backends that speak the runtime's ``/generate`` request shapes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from radixlm.lang.backend.base import BaseBackend
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod, mean_logprob

if TYPE_CHECKING:
    from radixlm.lang.executor import StreamExecutor
    from radixlm.lang.ir import SglSamplingParams


class GenerateApiBackend(BaseBackend):
    """A backend built on two calls: ``_generate(body)`` returns the response (a list for a
    batch) and ``_generate_stream(body)`` yields chunks whose ``text`` is the new text only."""

    def _generate(self, body: dict[str, Any]) -> dict | list[dict]:
        raise NotImplementedError

    def _generate_stream(self, body: dict[str, Any]) -> Iterator[dict]:
        raise NotImplementedError

    # -- generation ----------------------------------------------------------------------------

    def cache_prefix(self, prefix: str) -> None:
        if prefix:
            self._generate({"text": prefix, "sampling_params": {"max_new_tokens": 0}})

    def generate(self, s: StreamExecutor, sampling_params: SglSamplingParams) -> tuple[Any, Any]:
        out = self._generate(self._body(s.text_, sampling_params))
        if isinstance(out, list):
            return [o["text"] for o in out], [o["meta_info"] for o in out]
        return out["text"], out["meta_info"]

    def generate_stream(
        self, s: StreamExecutor, sampling_params: SglSamplingParams
    ) -> Iterator[tuple[str, dict]]:
        if (sampling_params.n or 1) > 1:
            raise ValueError("streaming supports n=1 only")
        for chunk in self._generate_stream(self._body(s.text_, sampling_params)):
            yield chunk["text"], chunk["meta_info"]

    @staticmethod
    def _body(text: str, params: SglSamplingParams) -> dict[str, Any]:
        return {"text": text, "sampling_params": params.to_runtime(), **params.request_options()}

    # -- select --------------------------------------------------------------------------------

    def select(
        self,
        s: StreamExecutor,
        choices: list[str],
        temperature: float,
        choices_method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        """Cache the prefix, then score every choice in one batched request that reuses it."""
        if temperature > 1e-5:
            raise ValueError("select scores choices by likelihood; temperature must be 0")
        prefix = s.text_
        n_prefix = self._prefix_tokens(prefix)
        start = max(n_prefix - 1, 0)
        outs = self._generate({
            "text": [prefix + c for c in choices],
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": start,
            "return_text_in_logprobs": True,
        })
        inputs = [
            self._choice_entries(prefix, c, o["meta_info"]["input_token_logprobs"], start)
            for c, o in zip(choices, outs)
        ]
        return choices_method(
            choices=choices,
            normalized_prompt_logprobs=[mean_logprob(e) for e in inputs],
            input_token_logprobs=inputs,
            output_token_logprobs=[o["meta_info"].get("output_token_logprobs", []) for o in outs],
            unconditional_token_logprobs=(
                self._unconditional(inputs) if choices_method.requires_unconditional_logprobs
                else None
            ),
        )

    def _prefix_tokens(self, prefix: str) -> int:
        if not prefix:
            return 0
        out = self._generate({"text": prefix, "sampling_params": {"max_new_tokens": 0}})
        return out["meta_info"]["prompt_tokens"]

    def _encode(self, text: str) -> list[int] | None:
        """Token ids of ``text`` as the runtime tokenises it, or ``None`` if unavailable."""
        return None

    def _choice_entries(self, prefix: str, choice: str, entries: list, start: int) -> list:
        """The entries (from position ``start``) that belong to ``choice``: the tokens after the
        longest common token prefix of ``prefix`` and ``prefix + choice``. Without a tokenizer,
        ``entries[0]`` (the last prefix token) counts as the choice's only when tokenising
        ``prefix + choice`` merged it with the choice's first characters."""
        if not prefix:
            return entries
        base, full = self._encode(prefix), self._encode(prefix + choice)
        if base is not None and full is not None:
            common = 0
            while common < min(len(base), len(full)) and base[common] == full[common]:
                common += 1
            return entries[max(common - start, 0):]
        rest = "".join(e[2] or "" for e in entries[1:])
        return entries[1:] if rest == choice and len(entries) > 1 else entries

    def _unconditional(self, inputs: list[list]) -> list[list]:
        outs = self._generate({
            "input_ids": [[e[1] for e in entries] for entries in inputs],
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
            "return_text_in_logprobs": True,
        })
        return [o["meta_info"]["input_token_logprobs"] for o in outs]
