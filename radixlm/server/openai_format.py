"""Translation between OpenAI's request/response shapes and the runtime's ``/generate`` shapes."""

from __future__ import annotations

import json
import os
from typing import Any

from radixlm.runtime.constrained.schema_regex import json_schema_regex
from radixlm.runtime.io_struct import GenerateInput
from radixlm.runtime.sampling.params import CONSTRAINTS
from radixlm.runtime.tokenizer_manager import check_text
from radixlm.server.chat_prompt import render_chat
from radixlm.server.chat_tools import ChatPlan, with_reasoning
from radixlm.server.errors import guess_param
from radixlm.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseFormat,
    SamplingFields,
)

OPENAI_NAMES = {
    "max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "sampling_seed": "seed",
}
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}


def openai_message(message: str) -> tuple[str, str | None, str | None]:
    """A runtime error message in OpenAI's parameter names, the parameter it is about, and
    OpenAI's error code where it has one (``context_length_exceeded``, which clients test)."""
    if message.startswith("max_new_tokens is too large"):  # NOTE: as SGLang words it
        return message.replace("max_new_tokens", "max_completion_tokens", 1), "max_tokens", None
    for ours, theirs in OPENAI_NAMES.items():
        message = message.replace(ours, theirs)
    if "maximum context length" in message:
        return message, None, "context_length_exceeded"
    return message, guess_param(message), None


def sampling_params(req: SamplingFields, max_tokens: int | None) -> dict[str, Any]:
    """The runtime's sampling parameters for an OpenAI request (unset fields keep defaults)."""
    params = {
        "max_new_tokens": max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "n": req.n,
        "stop": req.stop,
        "sampling_seed": req.seed,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "repetition_penalty": req.repetition_penalty,
        "min_new_tokens": req.min_tokens,
        "ignore_eos": req.ignore_eos,
        "stop_token_ids": req.stop_token_ids,
        "stop_regex": req.stop_regex,
        "skip_special_tokens": req.skip_special_tokens,
        "no_stop_trim": req.no_stop_trim,
        "logit_bias": req.logit_bias,
        "speculative": req.speculative,
        "custom_logit_processor": req.custom_logit_processor,
        "custom_params": req.custom_params,
        **structured_output(req),
    }
    if req.include_stop_str_in_output is not None and req.no_stop_trim is None:
        params["no_stop_trim"] = req.include_stop_str_in_output
    return {k: v for k, v in params.items() if v is not None}


def structured_output(req: SamplingFields) -> dict[str, Any]:
    """The one output constraint a request sets, as the runtime's parameter (``regex``,
    ``json_schema``, ``choices`` or ``ebnf``), from radixlm's/SGLang's fields or vLLM's
    (``guided_*``, ``structured_outputs``); ValueError naming them when more than one is set."""
    so = req.structured_outputs
    given = [
        ("regex", "regex", req.regex),
        ("json_schema", "json_schema", req.json_schema),
        ("ebnf", "ebnf", req.ebnf),
        ("guided_regex", "regex", req.guided_regex),
        ("guided_json", "json_schema", req.guided_json),
        ("guided_choice", "choices", req.guided_choice),
        ("guided_grammar", "ebnf", req.guided_grammar),
    ]
    if so is not None:
        given += [
            ("structured_outputs.regex", "regex", so.regex),
            ("structured_outputs.json", "json_schema", so.json_),
            ("structured_outputs.choice", "choices", so.choice),
            ("structured_outputs.grammar", "ebnf", so.grammar),
            ("structured_outputs.json_object", "json_schema",
             {"type": "object"} if so.json_object else None),
        ]  # fmt: skip
    given = [g for g in given if g[2] is not None]
    if len(given) > 1:
        names = ", ".join(name for name, _, _ in given)
        raise ValueError(f"only one output constraint may be set; got {names}")
    return {kind: value for _, kind, value in given}


def has_constraint(params: dict[str, Any]) -> bool:
    return any(k in params for k in CONSTRAINTS)


def completion_input(req: CompletionRequest) -> GenerateInput:
    prompt = req.prompt
    if isinstance(prompt, list) and not prompt:
        raise ValueError("prompt must not be empty")
    is_ids = isinstance(prompt, list) and not isinstance(prompt[0], str)
    logprobs = req.logprobs is not None
    params = sampling_params(req, req.max_tokens)
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        if has_constraint(params):
            raise ValueError("response_format cannot be combined with another output constraint")
        params["json_schema"] = _format_schema(fmt)
    return GenerateInput(
        text=None if is_ids else prompt,
        input_ids=prompt if is_ids else None,
        sampling_params=params,
        stream=req.stream,
        return_logprob=logprobs,
        logprob_start_len=0 if logprobs and req.echo else -1,
        top_logprobs_num=req.logprobs or 0,
        return_text_in_logprobs=True,
        rid=req.rid,
        cache_salt=req.cache_salt,
        priority=req.priority,
    )


def chat_input(
    req: ChatCompletionRequest, tokenizer, template: str | None, plan: ChatPlan, whitespace: str
) -> GenerateInput:
    params = sampling_params(req, req.max_completion_tokens or req.max_tokens)
    regex = _response_format_regex(req, params, plan, whitespace)
    own = regex is not None or has_constraint(params)
    if plan.regex is not None and not (own and plan.parser is None):
        # NOTE: with tool_choice none the regex only bans the call tag; the client's wins
        if own:
            raise ValueError(
                "tool_choice (required, a named tool, or auto with a strict tool) cannot be "
                "combined with response_format or another output constraint"
            )
        regex = plan.regex
    if regex is not None:
        params["regex"] = with_reasoning(plan, regex)
    prompt = render_chat(tokenizer, req, template, plan.tools)
    check_text("messages", prompt)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    if not ids:
        raise ValueError("messages: the chat template produced an empty prompt")
    return GenerateInput(
        input_ids=ids,
        sampling_params=params,
        stream=req.stream,
        return_logprob=req.logprobs,
        top_logprobs_num=(req.top_logprobs or 0) if req.logprobs else 0,
        return_text_in_logprobs=True,
        rid=req.rid,
        cache_salt=req.cache_salt,
        priority=req.priority,
    )


def _response_format_regex(
    req: ChatCompletionRequest, params: dict[str, Any], plan: ChatPlan, whitespace: str
) -> str | None:
    """``response_format`` as a json_schema param, or as a regex when a reasoning block must
    come first (None then means the json_schema param was set)."""
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if has_constraint(params):
        raise ValueError("response_format cannot be combined with another output constraint")
    spec = _format_schema(fmt)
    if plan.reasoning is None:
        params["json_schema"] = spec
        return None
    try:
        return json_schema_regex(spec, whitespace)
    except ValueError as e:
        raise ValueError(f"response_format.json_schema.schema: {e}") from None


def _format_schema(fmt: ResponseFormat) -> str:
    """The JSON schema ``response_format`` asks for (any object for ``json_object``)."""
    schema = fmt.json_schema.schema_ if fmt.type == "json_schema" and fmt.json_schema else None
    return json.dumps(schema or {"type": "object"})


def load_chat_template(spec: str | None) -> str | None:
    """``--chat-template``: a file path or the Jinja template itself."""
    if spec is None:
        return None
    if os.path.isfile(spec):
        with open(spec) as f:
            return f.read()
    if "{{" in spec or "{%" in spec:
        return spec
    raise ValueError(f"chat_template {spec!r} is neither a file nor a Jinja template")


# -- responses ------------------------------------------------------------------------------------


def finish_reason(meta: dict[str, Any]) -> str | None:
    reason = meta.get("finish_reason")
    return FINISH_REASONS.get(reason["type"], reason["type"]) if reason else None


def matched_stop(meta: dict[str, Any]) -> int | str | None:
    """SGLang's ``matched_stop``: the stop string or token id (an EOS too) that ended the
    output; None while running, at a length limit or at the end of a grammar."""
    return (meta.get("finish_reason") or {}).get("matched")


def usage(results: list[dict], n: int) -> dict[str, Any]:
    """Token counts over all choices; each prompt counts once however many samples it has."""
    metas = [r["meta_info"] for r in results]
    prompts = metas[::n]
    prompt_tokens = sum(m["prompt_tokens"] for m in prompts)
    completion = sum(m["completion_tokens"] for m in metas)
    cached = sum(
        max(m.get("cached_tokens", 0) for m in metas[i : i + n]) for i in range(0, len(metas), n)
    )
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": min(cached, prompt_tokens)},
    }


def completion_logprobs(meta: dict[str, Any], start: int, offset: int, echo: bool) -> dict:
    """The legacy completions ``logprobs`` object for output entries from ``start`` on."""
    entries = list(meta.get("output_token_logprobs", []))[start:]
    tops = list(meta.get("output_top_logprobs", []))[start:]
    if echo and start == 0:
        entries = list(meta.get("input_token_logprobs", [])) + entries
        tops = list(meta.get("input_top_logprobs", [])) + tops
    tokens = [e[2] or "" for e in entries]
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [e[0] for e in entries],
        "top_logprobs": [_top_dict(row) for row in tops] if tops else None,
        "text_offset": offsets,
    }


def _top_dict(row: list | None) -> dict[str, float] | None:
    return {(e[2] or ""): e[0] for e in row} if row else None


def chat_logprobs(meta: dict[str, Any], start: int) -> dict[str, Any]:
    """The chat ``logprobs`` object for output entries from ``start`` on."""
    entries = list(meta.get("output_token_logprobs", []))[start:]
    tops = list(meta.get("output_top_logprobs", []))[start:] or [None] * len(entries)
    return {
        "content": [
            {**_chat_token(e), "top_logprobs": [_chat_token(t) for t in (row or [])]}
            for e, row in zip(entries, tops)
        ]
    }


def _chat_token(entry: list) -> dict[str, Any]:
    text = entry[2] or ""
    return {"token": text, "logprob": entry[0], "bytes": list(text.encode())}
