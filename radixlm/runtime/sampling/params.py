"""Per-request sampling parameters and their validation."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.constrained.specs import check_regex, constraint_from_params
from radixlm.runtime.messages import Sampling

INT32_MAX = 2**31 - 1  # NOTE: every integer crosses the wire as msgpack; bound them all
MAX_STOPS = 256  # stop strings (the check decodes a window as long as the longest, per token)
MAX_STOP_CHARS = 4096
MAX_STOP_TOKEN_IDS = 1024


@dataclass
class SamplingParams:
    """What to generate and how. ``from_dict`` validates and names any bad field."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None
    choices: list[str] | None = None
    # NOTE: (kind, spec) normalised by validate(); what the grammar queue compiles
    constraint: tuple[str, str] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        d = dict(d or {})
        known = {f.name for f in dataclasses.fields(cls)} - {"constraint"}
        if "seed" in d and "sampling_seed" not in d:
            d["sampling_seed"] = d.pop("seed")
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s) {unknown}; known: {sorted(known)}")
        d = {k: v for k, v in d.items() if v is not None or k in ("sampling_seed",)}
        if isinstance(d.get("stop"), str):
            d["stop"] = [d["stop"]]
        if isinstance(d.get("json_schema"), (dict, bool)):
            d["json_schema"] = json.dumps(d["json_schema"])
        params = cls(**d)
        params.validate()
        return params

    def validate(self) -> None:
        _int_range("max_new_tokens", self.max_new_tokens, 0, INT32_MAX)
        _int_range("min_new_tokens", self.min_new_tokens, 0, INT32_MAX)
        _int_range("n", self.n, 1, 128)
        _num_range("temperature", self.temperature, 0.0, 100.0)
        _num_range("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _num_range("min_p", self.min_p, 0.0, 1.0)
        _num_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _num_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _num_range("repetition_penalty", self.repetition_penalty, 0.0, 10.0, low_open=True)
        if (
            not isinstance(self.top_k, int)
            or isinstance(self.top_k, bool)
            or (self.top_k < 1 and self.top_k not in (-1, 0))
            or self.top_k > INT32_MAX
        ):
            raise ValueError(
                f"top_k must be -1 (all tokens) or an integer >= 1, got {self.top_k!r}"
            )
        if self.top_k == 0:
            self.top_k = -1
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(
                f"stop must be a non-empty string or a list of them, got {self.stop!r}"
            )
        if len(self.stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in self.stop):
            raise ValueError(
                f"stop must hold at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} "
                f"characters, got {len(self.stop)} of up to {max(map(len, self.stop))}"
            )
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(
                f"stop_token_ids must hold at most {MAX_STOP_TOKEN_IDS} ids, "
                f"got {len(self.stop_token_ids)}"
            )
        if not isinstance(self.stop_token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT32_MAX
            for t in self.stop_token_ids
        ):
            raise ValueError(
                f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}"
            )
        if self.sampling_seed is not None:
            _int_range("sampling_seed", self.sampling_seed, -(2**63), 2**63 - 1)
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens ({self.min_new_tokens}) must be <= "
                f"max_new_tokens ({self.max_new_tokens})"
            )
        self.constraint = constraint_from_params(self.regex, self.json_schema, self.choices)
        if self.constraint is not None and self.constraint[0] == "regex":
            check_regex(self.constraint[1])

    def check_without_tokenizer(self) -> None:
        """Raise for the fields that only work with a tokenizer (``skip_tokenizer_init``)."""
        if self.stop:
            raise ValueError(
                "stop is unavailable with skip_tokenizer_init (no tokenizer to match strings "
                "with): use stop_token_ids"
            )
        for name in ("regex", "json_schema", "choices"):
            if getattr(self, name) is not None:
                raise ValueError(
                    f"{name} is unavailable with skip_tokenizer_init (a grammar needs a tokenizer)"
                )

    def to_wire(self, **changes: Any) -> Sampling:
        """The validated parameters as the scheduler takes them: the constraint once, as
        ``(kind, spec)``, without the fields it came from (or ``n``, which the caller split)."""
        wire = {f: getattr(self, f) for f in Sampling.__struct_fields__}
        return Sampling(**{**wire, **changes})


def _int_range(name: str, value: Any, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")


def _num_range(name: str, value: Any, low: float, high: float, low_open: bool = False) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        raise ValueError(f"{name} must be a number, got {value!r}")
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise ValueError(f"{name} must be in {bracket}{low}, {high}], got {value}")


def wire_sampling(d: dict[str, Any] | None) -> Sampling:
    """Validated parameters as they cross the wire to the scheduler (ValueError naming a bad
    field); what the tokenizer manager sends, and what tests that drive a scheduler send."""
    return SamplingParams.from_dict(d).to_wire()
