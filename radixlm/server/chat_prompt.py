"""A conversation (and the tools it offers) rendered into prompt text by the chat template.

Templates that know tools (their text uses ``tools``) get OpenAI's tool dicts and the messages
as they are, with call arguments as objects, as transformers' ``apply_chat_template`` expects.
Templates without tool support (SmolLM2's) get the built-in tool prompt as a system message,
earlier calls as ``<tool_call>`` text and tool results as ``<tool_response>`` user turns.
"""

from __future__ import annotations

import json
from typing import Any

import jinja2

from radixlm.runtime.function_call.toolset import ToolSpec, builtin_tool_prompt
from radixlm.server.protocol import ChatCompletionRequest, ChatMessage, ToolCallItem


def template_text(tokenizer, template: str | None) -> str | None:
    """The Jinja text in use: ``--chat-template`` or the tokenizer's default one."""
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, dict):
        own = own.get("default")
    return template or own


def supports_tools(template: str | None) -> bool:
    """Whether the template renders a ``tools`` list itself."""
    return template is not None and "tools" in template


def check_text_only(messages: list[ChatMessage]) -> None:
    """A ValueError naming the first image, audio or file part: the models are text-only."""
    for i, m in enumerate(messages):
        try:
            m.text()
        except ValueError as e:
            raise ValueError(f"messages[{i}].{e}") from None


def render_chat(
    tokenizer,
    req: ChatCompletionRequest,
    template: str | None,
    tools: list[ToolSpec] | None = None,
) -> str:
    """The prompt text of a conversation, ending with the assistant's turn opened."""
    text = template_text(tokenizer, template)
    if text is None:
        raise ValueError("the model has no chat template; start the server with --chat-template")
    kwargs: dict[str, Any] = dict(req.chat_template_kwargs or {})
    if supports_tools(text):
        messages = [_native(m) for m in req.messages]
        if tools:
            kwargs["tools"] = [t.openai() for t in tools]
    else:
        messages = _builtin(req.messages, tools)
    for reserved in ("messages", "tokenize", "add_generation_prompt", "chat_template",
                     "continue_final_message"):  # fmt: skip
        kwargs.pop(reserved, None)
    opening = _opens_a_turn(req)
    try:
        return tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=opening,
            continue_final_message=req.continue_final_message, **kwargs,
        )
    except jinja2.TemplateError as e:
        raise ValueError(f"messages: the chat template rejected them: {e}") from None


def _opens_a_turn(req: ChatCompletionRequest) -> bool:
    """Whether the prompt ends with a new assistant turn opened (else it continues the last
    message, which must then be the assistant's)."""
    if not req.continue_final_message:
        return req.add_generation_prompt is not False
    if req.add_generation_prompt:
        raise ValueError(
            "continue_final_message and add_generation_prompt cannot both be true: the last "
            "message is either continued or followed by a new turn"
        )
    if req.messages[-1].role != "assistant":
        raise ValueError(
            "continue_final_message needs the last message to be the assistant's, got "
            f"{req.messages[-1].role!r}"
        )
    return False


def _role(m: ChatMessage) -> str:
    return "system" if m.role == "developer" else m.role


def _native(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": _role(m), "content": m.text()}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None and m.role == "tool":
        out["name"] = m.name
    return out


def _arguments(arguments: str | dict) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _builtin_call(c: ToolCallItem) -> str:
    call = {"name": c.function.name, "arguments": _arguments(c.function.arguments)}
    return f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"


def _builtin(messages: list[ChatMessage], tools: list[ToolSpec] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            result = f"<tool_response>\n{m.text()}\n</tool_response>"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
            continue
        content = m.text()
        if m.tool_calls:
            content += "\n" + "".join(_builtin_call(c) for c in m.tool_calls)  # NOTE: back to back
        out.append({"role": _role(m), "content": content.lstrip("\n")})
    for m in out:
        m.pop("tool_results", None)
    if tools:
        prompt = builtin_tool_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{prompt}"
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
