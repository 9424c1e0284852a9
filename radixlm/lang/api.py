"""The public functions of the language, with SGLang's names and arguments."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from radixlm.lang.backend.base import BaseBackend, resolve_backend
from radixlm.lang.choices import ChoicesSamplingMethod, token_length_normalized
from radixlm.lang.function import SglFunction
from radixlm.lang.global_config import global_config
from radixlm.lang.ir import (
    SglExpr,
    SglExprList,
    SglGen,
    SglMedia,
    SglRoleBegin,
    SglRoleEnd,
    SglSamplingParams,
    SglSelect,
    SglSeparateReasoning,
    as_expr,
)
from radixlm.lang.tools import tool_call_regex


def function(func: Callable | None = None, num_api_spec_tokens: int | None = None):
    """Decorate ``def prog(s, ...)`` to make a program (also usable as ``@function()``)."""
    if func is not None:
        return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)
    return lambda f: SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)


def set_default_backend(backend: Any) -> None:
    """The backend programs run on when ``run`` is not given one: an ``Engine``, a
    ``RuntimeEndpoint``, an ``OpenAI`` backend, or ``None`` to clear it."""
    global_config.default_backend = None if backend is None else resolve_backend(backend)


def _chosen(backend: Any) -> BaseBackend | None:
    backend = backend if backend is not None else global_config.default_backend
    return None if backend is None else resolve_backend(backend)


def flush_cache(backend: Any = None) -> bool:
    """Empty the backend's prefix cache; ``False`` when there is no backend."""
    chosen = _chosen(backend)
    return False if chosen is None else chosen.flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any] | None:
    """The backend's server info (``stats`` holds cache hit rate and friends)."""
    chosen = _chosen(backend)
    return None if chosen is None else chosen.get_server_info()


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    choices: list[str] | None = None,
    choices_method: ChoicesSamplingMethod | None = None,
    regex: str | None = None,
    json_schema: str | dict | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict | None = None,
    parallel_tool_calls: bool = False,
) -> SglExpr:
    """Generate text into variable ``name``. With ``choices`` it is a ``select``; ``regex``,
    ``json_schema`` or ``dtype`` (int, float, str, bool) constrain the output. ``tools``
    (OpenAI tool dicts, offered in the prompt with ``tools_prompt``) with ``tool_choice``
    (auto | required | a tool's name) constrain it to calls, read back by ``s.tool_calls(name)``
    (see ``radixlm.lang.tools``)."""
    if choices:
        method = choices_method or token_length_normalized
        return SglSelect(name, choices, 0.0 if temperature is None else temperature, method)
    if tools:
        tools_regex = tool_call_regex(tools, tool_choice, parallel_tool_calls)
        if tools_regex is not None and (regex is not None or json_schema is not None):
            raise ValueError("tools with tool_choice cannot be combined with regex or json_schema")
        regex = tools_regex if tools_regex is not None else regex
    elif tool_choice is not None:
        raise ValueError("tool_choice needs tools")
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as e:
            raise ValueError(f"invalid regex {regex!r}: {e}") from None
    params = SglSamplingParams(
        max_new_tokens=max_tokens, min_new_tokens=min_tokens, n=n, stop=stop,
        stop_token_ids=stop_token_ids, stop_regex=stop_regex, temperature=temperature,
        top_p=top_p, top_k=top_k,
        min_p=min_p, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
        ignore_eos=ignore_eos, return_logprob=return_logprob,
        logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs, dtype=dtype, regex=regex,
        json_schema=json_schema, parse_tool_calls=True if tools else None,
    )
    return SglGen(name, params)


def gen_int(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> SglExpr:
    """Generate an integer (the variable holds an ``int``)."""
    return gen(name, max_tokens, dtype=int, **kwargs)


def gen_string(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> SglExpr:
    """Generate a double-quoted string."""
    return gen(name, max_tokens, dtype=str, **kwargs)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesSamplingMethod = token_length_normalized,
) -> SglExpr:
    """Append the most likely of ``choices`` (scored by ``choices_method``) into ``name``."""
    if not choices:
        raise ValueError("select needs a non-empty list of choices")
    if not all(isinstance(c, str) and c for c in choices):
        raise ValueError("every choice must be a non-empty string")
    return SglSelect(name, choices, temperature, choices_method)


def _role(name: str, expr: Any = None) -> SglExprList:
    inner = [] if expr is None else [as_expr(expr)]
    return SglExprList([SglRoleBegin(name), *inner, SglRoleEnd(name)])


def system(expr: Any = None) -> SglExprList:
    return _role("system", expr)


def user(expr: Any = None) -> SglExprList:
    return _role("user", expr)


def assistant(expr: Any = None) -> SglExprList:
    return _role("assistant", expr)


def system_begin() -> SglRoleBegin:
    return SglRoleBegin("system")


def system_end() -> SglRoleEnd:
    return SglRoleEnd("system")


def user_begin() -> SglRoleBegin:
    return SglRoleBegin("user")


def user_end() -> SglRoleEnd:
    return SglRoleEnd("user")


def assistant_begin() -> SglRoleBegin:
    return SglRoleBegin("assistant")


def assistant_end() -> SglRoleEnd:
    return SglRoleEnd("assistant")


def separate_reasoning(expr: SglExpr | None = None, model_type: str | None = None) -> SglExpr:
    """Run the named ``gen`` (or ``select``) ``expr``, then split its value: ``s[name]`` is the
    content after the reasoning block, ``s[name + "_reasoning_content"]`` the reasoning
    (``model_type``: a ``--reasoning-parser`` name such as ``deepseek-r1`` or ``qwen3``; as in
    SGLang, an unknown one is a ValueError when the program runs)."""
    if not isinstance(expr, (SglGen, SglSelect)) or expr.name is None:
        raise ValueError(
            "separate_reasoning wraps a named gen, e.g. "
            "sgl.separate_reasoning(sgl.gen('answer'), model_type='deepseek-r1')"
        )
    return SglExprList([expr, SglSeparateReasoning(model_type, expr=expr)])


def image(path: str) -> SglExpr:
    """SGLang's image input (a file path, URL or bytes): sent as an ``image_url`` part through
    the ``OpenAI`` backend; running it on radixlm's text-only models raises a clear error."""
    return SglMedia("image", path)


def video(path: str, num_frames: int = 0) -> SglExpr:
    """SGLang's video input; running it on radixlm's text-only models raises a clear error."""
    return SglMedia("video", path)
