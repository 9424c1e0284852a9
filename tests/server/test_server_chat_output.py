"""Reading an assistant output back (reasoning, tool calls), whole and streamed, and the grammar
a chat request gets; no server needed."""

from __future__ import annotations

import json
import re

import pytest
from tool_defs import TOOLS, WEATHER

from radixlm.server.chat_output import ChoiceStream, chat_message
from radixlm.server.chat_prompt import render_chat
from radixlm.server.chat_tools import plan_chat, with_reasoning
from radixlm.server.protocol import ChatCompletionRequest

HERMES_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}{{ tools }}<tool_call>"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'  # noqa: E501
OUTPUT = "<think>\nThe user wants weather.\n</think>\n\nLet me check." + CALL


def _plan(reasoning="qwen3", **body):
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **body)
    return plan_chat(req, HERMES_TEMPLATE, None, reasoning, "")


def _streamed(plan, text, step):
    stream, deltas = ChoiceStream(plan), []
    for i in range(0, len(text), step):
        deltas.append(stream.feed(text[i : i + step]))
    deltas.append(stream.finish())
    return deltas, stream.has_calls


def test_whole_output_splits_reasoning_content_and_calls():
    message, has_calls = chat_message(_plan(tools=TOOLS), OUTPUT)
    assert has_calls and message["reasoning_content"] == "The user wants weather."
    assert message["reasoning"] == message["reasoning_content"]
    assert message["content"] == "Let me check."
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_streamed_deltas_join_to_the_whole_output(step):
    plan = _plan(tools=TOOLS)
    deltas, has_calls = _streamed(plan, OUTPUT, step)
    whole, _ = chat_message(plan, OUTPUT)
    joined = lambda key: "".join(d.get(key, "") for d in deltas)  # noqa: E731
    assert has_calls
    assert joined("reasoning_content") == whole["reasoning_content"]
    assert joined("content") == whole["content"]
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather"
    args = "".join(c["function"].get("arguments", "") for c in calls)
    assert args == whole["tool_calls"][0]["function"]["arguments"]
    assert all("<tool_call>" not in d.get("content", "") for d in deltas)


def test_without_tools_the_call_text_is_plain_content():
    message, has_calls = chat_message(_plan(reasoning=None), CALL)
    assert not has_calls and message["content"] == CALL


def test_required_grammar_admits_only_calls_after_the_reasoning_block():
    plan = _plan(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert plan.calls_only
    regex = with_reasoning(plan, plan.regex)
    compact = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}\n</tool_call>'  # noqa: E501
    assert re.fullmatch(regex, compact)
    assert re.fullmatch(regex, "<think>\nhmm <b>\n</think>\n\n" + compact)
    assert not re.fullmatch(regex, "Sure! " + compact)
    assert not re.fullmatch(regex, compact.replace("celsius", "kelvin"))


def test_auto_with_a_strict_tool_allows_text_then_a_valid_call():
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
    plan = _plan(reasoning=None, tools=[strict], tool_choice="auto", parallel_tool_calls=False)
    compact = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo","unit":"celsius"}}\n</tool_call>'  # noqa: E501
    assert not plan.calls_only
    assert re.fullmatch(plan.regex, "Plain answer, a < b.")
    assert re.fullmatch(plan.regex, "Checking. " + compact)
    assert not re.fullmatch(plan.regex, "Checking. <tool_call>\n{}\n</tool_call>")


def test_tool_choice_none_bans_the_call_tag_but_yields_to_response_format():
    plan = _plan(reasoning=None, tools=[WEATHER], tool_choice="none")
    assert plan.parser is None and not plan.tools
    assert re.fullmatch(plan.regex, "No tools needed <b>here</b>.")
    assert not re.fullmatch(plan.regex, "Calling <tool_call>")


TOOL_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}[call {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}]{% endfor %}{% endfor %}<assistant>"
)
ROUND_TRIP = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


def test_a_tool_aware_template_gets_tools_and_calls_with_object_arguments(smollm_tokenizer):
    req = ChatCompletionRequest(messages=ROUND_TRIP, tools=[WEATHER])
    plan = plan_chat(req, TOOL_TEMPLATE, None, None, "")
    text = render_chat(smollm_tokenizer, req, TOOL_TEMPLATE, plan.tools)
    assert text.startswith("<tools>get_weather;</tools><user>Weather in Paris?")
    assert '[call get_weather {"city": "Paris"}]' in text and "<tool>sunny" in text


def test_a_template_without_tools_gets_the_builtin_prompt(smollm_tokenizer):
    req = ChatCompletionRequest(messages=ROUND_TRIP, tools=[WEATHER])
    text = render_chat(smollm_tokenizer, req, None, plan_chat(req, None, None, None, "").tools)
    assert "<tools>" in text and '"name": "get_weather"' in text
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert f"<tool_call>\n{call}\n</tool_call>" in text
    assert "<tool_response>\nsunny\n</tool_response>" in text


def test_constrained_calls_stream_their_name_first_then_the_arguments():
    plan = _plan(reasoning=None, tools=TOOLS, tool_choice="required")
    args = '{"city":"Paris","unit":"celsius"}'
    text = f'<tool_call>\n{{"name":"get_weather","arguments":{args}}}\n</tool_call>\n' * 2
    deltas, has_calls = _streamed(plan, text, 1)
    pieces = [c for d in deltas for c in d.get("tool_calls", [])]
    assert has_calls and [p["index"] for p in pieces] == [0, 0, 1, 1]
    first, second = pieces[0], pieces[1]
    assert first["function"] == {"name": "get_weather", "arguments": ""}
    assert first["id"].startswith("call_") and "id" not in second
    assert second["function"] == {"arguments": args}
    assert all("content" not in d for d in deltas)
