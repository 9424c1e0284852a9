"""gen(..., tools=...) in @function programs: constrained calls, parsed back, and a round trip."""

from __future__ import annotations

import pytest

import radixlm as sgl
from tests.server.tool_defs import WEATHER

TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 20}},
            "required": ["zone"],
        },
    },
}


@sgl.function
def weather_agent(s, question, tool_choice):
    s += sgl.system("You are a helpful assistant.\n\n" + sgl.tools_prompt([WEATHER, TIME]))
    s += sgl.user(question)
    s += sgl.assistant(
        sgl.gen("call", tools=[WEATHER, TIME], tool_choice=tool_choice, max_tokens=96)
    )
    for call in s.tool_calls("call"):
        s += sgl.user(f"<tool_response>\n{call['name']}: sunny, 21 degrees\n</tool_response>")
    s += sgl.assistant(sgl.gen("answer", max_tokens=24))


@pytest.mark.parametrize("tool_choice", ["required", "get_weather"])
def test_tool_gen_returns_calls_matching_the_schema(smol, tool_choice):
    state = weather_agent.run(
        question="What's the weather in Lima?", tool_choice=tool_choice, temperature=0,
        backend=smol,
    )
    assert state.error() is None
    calls = state.tool_calls("call")
    assert len(calls) == 1
    call = calls[0]
    if tool_choice == "get_weather":
        assert call["name"] == "get_weather"
    if call["name"] == "get_weather":
        assert call["arguments"]["unit"] in ("celsius", "fahrenheit")
        assert isinstance(call["arguments"]["city"], str)
    assert "<tool_response>" in state.text() and isinstance(state["answer"], str)


def test_tool_gen_rejects_unknown_tool_and_stray_choice():
    with pytest.raises(ValueError, match="tool_choice.function.name"):
        sgl.gen("x", tools=[WEATHER], tool_choice="nope")
    with pytest.raises(ValueError, match="tool_choice needs tools"):
        sgl.gen("x", tool_choice="required")
    with pytest.raises(ValueError, match="defined twice"):
        sgl.gen("x", tools=[WEATHER, WEATHER], tool_choice="required")
