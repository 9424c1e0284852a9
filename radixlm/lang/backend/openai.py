"""Any OpenAI-compatible server, through the ``openai`` package."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from radixlm.lang.backend.base import BaseBackend
from radixlm.lang.chat_template import (
    ChatTemplate,
    get_chat_template,
    get_chat_template_by_model_path,
)
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod, mean_logprob

if TYPE_CHECKING:
    from radixlm.lang.executor import StreamExecutor
    from radixlm.lang.ir import SglSamplingParams

COMPLETION_MODEL_NAMES = ("gpt-3.5-turbo-instruct", "davinci-002", "babbage-002")


@dataclasses.dataclass
class TokenUsage:
    """Tokens the backend's requests used so far (SGLang's ``OpenAI.token_usage``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def reset(self) -> None:
        self.prompt_tokens = self.completion_tokens = 0

    def add(self, usage: Any) -> None:
        self.prompt_tokens += getattr(usage, "prompt_tokens", 0) or 0
        self.completion_tokens += getattr(usage, "completion_tokens", 0) or 0


class OpenAI(BaseBackend):
    """``OpenAI(model, base_url=..., api_key=...)``. Chat models (the default) generate
    through ``/v1/chat/completions`` from ``s.messages()``, so a ``gen`` must directly follow
    ``assistant_begin``; completion models (``is_chat_model=False``) send the text.
    ``select`` needs prompt logprobs (``echo`` with ``logprobs`` on ``/v1/completions``)."""

    def __init__(
        self,
        model_name: str,
        is_chat_model: bool | None = None,
        chat_template: str | ChatTemplate | None = None,
        is_azure: bool = False,
        **client_kwargs: Any,
    ) -> None:
        import openai

        if client_kwargs.get("base_url") and not client_kwargs.get("api_key"):
            client_kwargs["api_key"] = "EMPTY"
        self.client = (openai.AzureOpenAI if is_azure else openai.OpenAI)(**client_kwargs)
        self.model_name = model_name
        self.token_usage = TokenUsage()
        self.is_chat_model = (
            model_name not in COMPLETION_MODEL_NAMES if is_chat_model is None else is_chat_model
        )
        if isinstance(chat_template, str):
            chat_template = get_chat_template(chat_template)
        super().__init__(chat_template or get_chat_template_by_model_path(model_name))

    def get_model_name(self) -> str:
        return self.model_name

    @property
    def supports_images(self) -> bool:
        """Images travel as ``image_url`` parts of chat messages (vision models)."""
        return self.is_chat_model

    # -- generation ----------------------------------------------------------------------------

    def generate(self, s: StreamExecutor, sampling_params: SglSamplingParams) -> tuple[Any, Any]:
        kwargs = self._kwargs(s, sampling_params)
        if self.is_chat_model:
            ret = self.client.chat.completions.create(**kwargs)
            texts = [c.message.content or "" for c in ret.choices]
        else:
            ret = self.client.completions.create(**kwargs)
            texts = [c.text for c in ret.choices]
        self.token_usage.add(getattr(ret, "usage", None))
        meta = _meta(ret)
        return (texts, [meta] * len(texts)) if (sampling_params.n or 1) > 1 else (texts[0], meta)

    def generate_stream(
        self, s: StreamExecutor, sampling_params: SglSamplingParams
    ) -> Iterator[tuple[str, dict]]:
        kwargs = {**self._kwargs(s, sampling_params), "stream": True}
        create = (self.client.chat.completions if self.is_chat_model
                  else self.client.completions).create
        meta: dict[str, Any] = {}
        for chunk in create(**kwargs):
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            delta = choice.delta.content if self.is_chat_model else choice.text
            meta = {"id": chunk.id, "finish_reason": choice.finish_reason}
            if delta:
                yield delta, meta

    def _kwargs(self, s: StreamExecutor, params: SglSamplingParams) -> dict[str, Any]:
        if params.dtype is not None and params.regex is None:
            raise ValueError("dtype needs a regex-capable server")
        kwargs: dict[str, Any] = {"model": self.model_name}
        kwargs.update(_openai_sampling(params))
        if self.is_chat_model:
            kwargs["messages"] = self._chat_messages(s)
        else:
            kwargs["prompt"] = s.text_
        return kwargs

    def _chat_messages(self, s: StreamExecutor) -> list[dict[str, str]]:
        if s.cur_role != "assistant" or s.text_[s.cur_role_begin_pos:].strip():
            raise RuntimeError(
                "with an OpenAI chat model, gen must come right after assistant_begin "
                "(or inside `with s.assistant():` before any text)"
            )
        return list(s.messages_)

    # -- select --------------------------------------------------------------------------------

    def select(
        self,
        s: StreamExecutor,
        choices: list[str],
        temperature: float,
        choices_method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        """Score each choice from the prompt logprobs the server echoes back."""
        prefix = s.text_
        inputs = self._echo_logprobs([prefix + c for c in choices], len(prefix))
        unconditional = None
        if choices_method.requires_unconditional_logprobs:
            unconditional = self._echo_logprobs(list(choices), 0)
        return choices_method(
            choices=choices,
            normalized_prompt_logprobs=[mean_logprob(e) for e in inputs],
            input_token_logprobs=inputs,
            output_token_logprobs=[[] for _ in choices],
            unconditional_token_logprobs=unconditional,
        )

    def _echo_logprobs(self, prompts: list[str], start: int) -> list[list[list[Any]]]:
        try:
            ret = self.client.completions.create(
                model=self.model_name, prompt=prompts, max_tokens=1, temperature=0.0,
                echo=True, logprobs=1,
            )
        except Exception as e:
            raise NotImplementedError(_NO_LOGPROBS + f" (the request failed: {e})") from e
        self.token_usage.add(getattr(ret, "usage", None))
        ordered = sorted(ret.choices, key=lambda c: c.index)
        return [_span_entries(c.logprobs, start, len(p)) for c, p in zip(ordered, prompts)]


_NO_LOGPROBS = (
    "select needs prompt logprobs, which this server does not return for "
    "/v1/completions with echo=True and logprobs"
)


def _span_entries(logprobs: Any, start: int, end: int) -> list[list[Any]]:
    """``[logprob, None, token]`` for the echoed tokens overlapping characters [start, end)."""
    if logprobs is None or not logprobs.tokens or logprobs.text_offset is None:
        raise NotImplementedError(_NO_LOGPROBS)
    tokens, offsets, values = logprobs.tokens, logprobs.text_offset, logprobs.token_logprobs
    entries = []
    for i, token in enumerate(tokens):
        token_end = offsets[i + 1] if i + 1 < len(tokens) else offsets[i] + len(token)
        if offsets[i] < end and token_end > start:
            entries.append([values[i], None, token])
    if not entries:
        raise NotImplementedError(_NO_LOGPROBS)
    return entries


def _openai_sampling(params: SglSamplingParams) -> dict[str, Any]:
    names = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
             "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
             "n": "n"}
    out = {dst: getattr(params, src) for src, dst in names.items()
           if getattr(params, src) is not None}
    if params.stop_list():
        out["stop"] = params.stop_list()[:4]
    extra = {k: getattr(params, k) for k in ("top_k", "min_p", "regex", "ignore_eos", "stop_regex")
             if getattr(params, k) is not None}
    if params.json_schema is not None:
        schema = params.json_schema
        schema = json.loads(schema) if isinstance(schema, str) else schema
        out["response_format"] = {"type": "json_schema",
                                  "json_schema": {"name": "output", "schema": schema}}
    if extra:
        out["extra_body"] = extra
    return out


def _meta(ret: Any) -> dict[str, Any]:
    usage = getattr(ret, "usage", None)
    return {
        "id": ret.id,
        "finish_reason": ret.choices[0].finish_reason if ret.choices else None,
        "prompt_tokens": getattr(usage, "prompt_tokens", None),
        "completion_tokens": getattr(usage, "completion_tokens", None),
    }
