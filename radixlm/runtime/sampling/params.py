"""Per-request sampling parameters: parsed and validated once, into the wire's ``Sampling``."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from radixlm.runtime.constrained.specs import check_regex, constraint_from_params
from radixlm.runtime.io_struct import MAX_N
from radixlm.runtime.messages import Sampling
from radixlm.runtime.sampling.custom_logit_processor import check_processor_text

INT32_MAX = 2**31 - 1  # NOTE: every integer crosses the wire as msgpack; bound them all
MAX_STOPS = 256  # stop strings (the check decodes a window as long as the longest, per token)
MAX_STOP_CHARS = 4096
MAX_STOP_TOKEN_IDS = 1024
MAX_STOP_REGEX = 16  # patterns searched in the output's recent text after every token
STOP_REGEX_WINDOW = 64  # tokens of recent output a stop_regex is searched in
CONSTRAINTS = ("regex", "json_schema", "choices", "ebnf")
MAX_LOGIT_BIAS = 300  # entries, as OpenAI allows
LOGIT_BIAS_RANGE = 100.0
KNOWN = frozenset(Sampling.__struct_fields__) - {"constraint"} | {*CONSTRAINTS, "n"}


def parse_sampling(d: dict[str, Any] | None, has_tokenizer: bool = True) -> Sampling:
    """``d`` (the API's ``sampling_params``) validated into ``Sampling``, the constraint
    normalised to ``(kind, spec)``; ValueError naming any bad field. ``seed`` is an alias of
    ``sampling_seed``; ``n`` is checked here and split off by the caller."""
    d = dict(d or {})
    if "seed" in d and "sampling_seed" not in d:
        d["sampling_seed"] = d.pop("seed")
    unknown = sorted(set(d) - KNOWN)
    if unknown:
        raise ValueError(f"unknown sampling parameter(s) {unknown}; known: {sorted(KNOWN)}")
    d = {k: v for k, v in d.items() if v is not None}
    for key in ("stop", "stop_regex"):
        if isinstance(d.get(key), str):
            d[key] = [d[key]]
    _int_range("n", d.pop("n", 1), 1, MAX_N)
    if "logit_bias" in d:
        d["logit_bias"] = parse_logit_bias(d["logit_bias"])
    if "custom_logit_processor" in d:
        check_processor_text(d["custom_logit_processor"])
    if not isinstance(d.get("custom_params", {}), dict):
        raise ValueError(f"custom_params must be an object, got {d['custom_params']!r}")
    spec = {k: d.pop(k) for k in CONSTRAINTS if k in d}
    values = {**msgspec.structs.asdict(Sampling()), **d}
    _check_ranges(values)
    if not has_tokenizer:
        _check_without_tokenizer(values, spec)
    if values["top_k"] == 0:
        values["top_k"] = -1
    values["constraint"] = constraint_from_params(**spec)
    if "regex" in spec:
        check_regex(values["constraint"][1])
    try:  # NOTE: the types the ranges do not check (the booleans), as the wire will decode them
        return msgspec.convert(values, Sampling)
    except msgspec.ValidationError as e:
        raise ValueError(f"invalid sampling parameter: {e}") from None


def _check_ranges(v: dict[str, Any]) -> None:
    _int_range("max_new_tokens", v["max_new_tokens"], 0, INT32_MAX)
    _int_range("min_new_tokens", v["min_new_tokens"], 0, INT32_MAX)
    _num_range("temperature", v["temperature"], 0.0, 100.0)
    _num_range("top_p", v["top_p"], 0.0, 1.0, low_open=True)
    _num_range("min_p", v["min_p"], 0.0, 1.0)
    _num_range("frequency_penalty", v["frequency_penalty"], -2.0, 2.0)
    _num_range("presence_penalty", v["presence_penalty"], -2.0, 2.0)
    _num_range("repetition_penalty", v["repetition_penalty"], 0.0, 10.0, low_open=True)
    top_k = v["top_k"]
    if (
        not isinstance(top_k, int)
        or isinstance(top_k, bool)
        or (top_k < 1 and top_k not in (-1, 0))
        or top_k > INT32_MAX
    ):
        raise ValueError(f"top_k must be -1 (all tokens) or an integer >= 1, got {top_k!r}")
    stop = v["stop"]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"stop must be a non-empty string or a list of them, got {stop!r}")
    if len(stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stop):
        raise ValueError(
            f"stop must hold at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} "
            f"characters, got {len(stop)} of up to {max(map(len, stop))}"
        )
    _check_stop_regex(v["stop_regex"])
    ids = v["stop_token_ids"]
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT32_MAX for t in ids
    ):
        raise ValueError(f"stop_token_ids must be a list of token ids, got {ids!r}")
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise ValueError(
            f"stop_token_ids must hold at most {MAX_STOP_TOKEN_IDS} ids, got {len(ids)}"
        )
    if v["sampling_seed"] is not None:
        _int_range("sampling_seed", v["sampling_seed"], -(2**63), 2**63 - 1)
    if v["min_new_tokens"] > v["max_new_tokens"]:
        raise ValueError(
            f"min_new_tokens ({v['min_new_tokens']}) must be <= "
            f"max_new_tokens ({v['max_new_tokens']})"
        )


def parse_logit_bias(bias: Any) -> dict[int, float]:
    """``{token id (int, or its decimal text as OpenAI sends it): bias in [-100, 100]}``; the
    ids' upper bound (the vocabulary) is checked by the caller, which knows it."""
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias must be an object of token id -> bias, got {bias!r}")
    if len(bias) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias must hold at most {MAX_LOGIT_BIAS} entries, got {len(bias)}")
    out: dict[int, float] = {}
    for key, value in bias.items():
        token = key if isinstance(key, int) and not isinstance(key, bool) else None
        if isinstance(key, str) and key.strip().isdigit():
            token = int(key)
        if token is None or not 0 <= token <= INT32_MAX:
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"logit_bias[{token}] must be a number, got {value!r}")
        _num_range(f"logit_bias[{token}]", value, -LOGIT_BIAS_RANGE, LOGIT_BIAS_RANGE)
        out[token] = float(value)
    return out


def _check_stop_regex(patterns: Any) -> None:
    if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
        raise ValueError(
            f"stop_regex must be a non-empty string or a list of them, got {patterns!r}"
        )
    if len(patterns) > MAX_STOP_REGEX or any(len(p) > MAX_STOP_CHARS for p in patterns):
        raise ValueError(
            f"stop_regex must hold at most {MAX_STOP_REGEX} patterns of at most "
            f"{MAX_STOP_CHARS} characters"
        )
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"stop_regex {pattern!r} is not a valid regex: {e}") from None


def _check_without_tokenizer(v: dict[str, Any], spec: dict[str, Any]) -> None:
    """Raise for the fields that only work with a tokenizer (``skip_tokenizer_init``)."""
    if v["stop_regex"]:
        raise ValueError("stop_regex is unavailable with skip_tokenizer_init: use stop_token_ids")
    if v["stop"]:
        raise ValueError(
            "stop is unavailable with skip_tokenizer_init (no tokenizer to match strings "
            "with): use stop_token_ids"
        )
    if spec:
        raise ValueError(
            f"{next(iter(spec))} is unavailable with skip_tokenizer_init (a grammar needs a "
            "tokenizer)"
        )


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
