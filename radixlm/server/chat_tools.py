"""What a chat request's ``tools``, ``tool_choice`` and reasoning settings mean for its prompt,
its grammar and how its output is read back.

- ``none`` (the default without tools): tools are not offered, the output is plain content.
- ``auto``: tools offered; the output is parsed for calls. With a ``strict`` tool and a format
  that opens calls with a tag, free text runs until the tag and the grammar takes the calls.
- ``required`` / a named tool: the output is constrained from its first token to calls whose
  arguments match their schemas (jump-forward emits the forced tags and names).
A reasoning parser puts its ``<think>...</think>`` block in front of any grammar.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.runtime.constrained.specs import escape_literal
from radixlm.runtime.constrained.text_regex import text_without
from radixlm.runtime.function_call import (
    BUILTIN_TOOL_PARSER,
    detect_tool_parser,
    get_tool_parser,
)
from radixlm.runtime.function_call.base import ToolParser
from radixlm.runtime.function_call.toolset import (
    ToolSpec,
    calls_constraint,
    check_tools,
    named_tool,
)
from radixlm.runtime.reasoning import ReasoningParser, get_reasoning_parser
from radixlm.server.chat_prompt import supports_tools
from radixlm.server.protocol import ChatCompletionRequest


@dataclass
class ChatPlan:
    """The tools to render into the prompt, the grammar regex (None: unconstrained) and the
    parsers that read the output back. ``calls_only``: the grammar admits nothing but calls, so
    any text outside them (a call cut off by ``max_tokens``) is not content."""

    tools: list[ToolSpec] = field(default_factory=list)
    parser: ToolParser | None = None
    reasoning: ReasoningParser | None = None
    regex: str | None = None
    calls_only: bool = False


def plan_chat(
    req: ChatCompletionRequest,
    template: str | None,
    tool_call_parser: str | None,
    reasoning_parser: str | None,
    whitespace: str,
) -> ChatPlan:
    """Validate the request's tools and choose prompt, grammar and parsers for it."""
    plan = _plan_tools(req, template, tool_call_parser, whitespace)
    if reasoning_parser is not None and req.separate_reasoning:
        plan.reasoning = get_reasoning_parser(reasoning_parser)
    return plan


def with_reasoning(plan: ChatPlan, regex: str | None) -> str | None:
    """``regex`` preceded by the reasoning block the model writes first (when it has one)."""
    r = plan.reasoning
    if regex is None or r is None:
        return regex
    block = f"{text_without(r.end_tag)}{escape_literal(r.end_tag)}\\n*"
    if not r.starts_in_reasoning:
        block = f"(?:{escape_literal(r.start_tag)}{block})?"
    return f"{block}(?:{regex})"


def _plan_tools(
    req: ChatCompletionRequest, template: str | None, parser_name: str | None, whitespace: str
) -> ChatPlan:
    tools = check_tools([t.model_dump() for t in req.tools or []], whitespace)
    choice = req.tool_choice or ("auto" if tools else "none")
    if choice == "auto" and not tools:
        choice = "none"  # NOTE: as OpenAI: "auto" with no tools is plain text
    if choice != "none" and not tools:
        raise ValueError("tool_choice requires a tool but tools is empty: give tools, or send "
                         "tool_choice 'auto' or 'none'")  # fmt: skip
    if not supports_tools(template):
        parser_name = BUILTIN_TOOL_PARSER  # NOTE: the format the built-in tool prompt asks for
    parser = get_tool_parser(parser_name or detect_tool_parser(template))
    if choice == "none":
        # NOTE: tools not offered, and the call tag banned from the text
        return ChatPlan(regex=text_without(parser.trigger) if tools and parser.trigger else None)
    parallel = req.parallel_tool_calls
    if choice == "auto":
        strict = any(t.strict for t in tools)
        regex = calls_constraint(parser, tools, parallel, True, whitespace) if strict else None
    elif choice == "required":
        regex = calls_constraint(parser, tools, parallel, False, whitespace)
    else:
        chosen = [named_tool(tools, choice.function.name)]
        regex = calls_constraint(parser, chosen, parallel, False, whitespace)
    calls_only = choice != "auto" and regex is not None
    return ChatPlan(tools=tools, parser=parser, regex=regex, calls_only=calls_only)
