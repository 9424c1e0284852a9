"""``/v1/responses`` with the official openai client and the Agents SDK's Responses model, on the
embedded SmolLM2: the same text as the chat route, the stream's events, tools, JSON output, the
item types of a conversation, and a 400 for everything that needs stored state."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest
from tool_defs import WEATHER

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "sunny": {"type": "boolean"}},
    "required": ["city", "sunny"],
    "additionalProperties": False,
}
FLAT_WEATHER = {"type": "function", **WEATHER["function"]}
ARGS = '{"city": "Paris", "unit": "celsius"}'


@pytest.fixture(scope="module")
def client(smol_server):
    return openai.OpenAI(base_url=f"{smol_server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_text_equals_the_chat_route_and_streams_as_events(client, model):
    ask = {"model": model, "temperature": 0, "max_output_tokens": 24}
    whole = client.responses.create(input="Name three colors.", instructions="Be brief.", **ask)
    chat = client.chat.completions.create(
        model=model, temperature=0, max_tokens=24, messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name three colors."},
        ],
    )  # fmt: skip
    assert whole.output_text == chat.choices[0].message.content
    assert whole.object == "response" and whole.id.startswith("resp_")
    assert whole.usage.input_tokens == chat.usage.prompt_tokens
    assert whole.usage.output_tokens == chat.usage.completion_tokens
    assert whole.status == ("incomplete" if chat.choices[0].finish_reason == "length" else
                            "completed")  # fmt: skip

    events = list(client.responses.create(input="Name three colors.", instructions="Be brief.",
                                          stream=True, **ask))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == f"response.{whole.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text == whole.output_text
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [d.item.id for d in done] == [item.id for item in final.output]


def test_a_cut_off_response_is_incomplete(client, model):
    r = client.responses.create(model=model, input="Write a long story about a dragon.",
                                max_output_tokens=4, temperature=0)  # fmt: skip
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 4 and r.output[0].status == "incomplete"


def test_json_schema_text_format(client, model):
    r = client.responses.create(
        model=model, input="The weather in Oslo: give the city and whether it is sunny.",
        text={"format": {"type": "json_schema", "name": "weather", "schema": SCHEMA,
                         "strict": True}},
        temperature=0, max_output_tokens=48,
    )  # fmt: skip
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    assert r.text.format.type == "json_schema"


def test_required_tool_call_whole_and_streamed(client, model):
    ask = {"model": model, "input": "What's the weather in Paris?", "tools": [FLAT_WEATHER],
           "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0,
           "max_output_tokens": 96}  # fmt: skip
    whole = client.responses.create(**ask)
    calls = [item for item in whole.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["function"]["parameters"])
    assert calls[0].call_id.startswith("call_")

    events = list(client.responses.create(stream=True, **ask))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == args == calls[0].arguments
    assert events[-1].response.output[-1].arguments == args


def test_a_conversation_of_items_renders_like_its_chat_messages(client, model):
    """Assistant messages, function calls and their outputs become the chat messages an
    equivalent chat request sends: the greedy answers are the same."""
    items = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": ARGS},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C."},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "It is sunny and 21 C in Paris."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "And should I take a coat?"}]},
    ]  # fmt: skip
    messages = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": ARGS},
        }]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."},
        {"role": "assistant", "content": "It is sunny and 21 C in Paris."},
        {"role": "user", "content": "And should I take a coat?"},
    ]  # fmt: skip
    r = client.responses.create(model=model, input=items, tools=[FLAT_WEATHER],
                                temperature=0, max_output_tokens=24)  # fmt: skip
    chat = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER],
                                          temperature=0, max_tokens=24)  # fmt: skip
    assert r.output_text == (chat.choices[0].message.content or "")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"n": 2}, "n"),
        ({"truncation": "auto"}, "truncation"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": []}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0]"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ],
)
def test_bad_requests_are_400_naming_the_field(smol_server, extra, param):
    body = {"input": "hi", "max_output_tokens": 4, **extra}
    r = httpx.post(f"{smol_server.url}/v1/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert param in error["message"], error


def test_openai_agents_sdk_responses_model_completes_a_tool_round_trip(smol_server, model):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.items import ToolCallOutputItem
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"It is sunny and 21 degrees in {city}."

    client = AsyncOpenAI(base_url=f"{smol_server.url}/v1", api_key="unused", max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=model, openai_client=client),
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=48
        ),
    )

    async def run(streamed: bool):
        if not streamed:
            return await Runner.run(agent, "What's the weather in Paris?", max_turns=4)
        result = Runner.run_streamed(agent, "What's the weather in Paris?", max_turns=4)
        async for _ in result.stream_events():
            pass
        return result

    async def both():  # NOTE: one event loop: the client's connections belong to it
        return [await run(False), await run(True)]

    for result in asyncio.run(both()):
        assert len(asked) >= 2, "the agent never called the tool"
        outputs = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
        assert outputs and "sunny" in str(outputs[0].output)
        assert isinstance(result.final_output, str) and result.final_output
