"""The clients agents are built with, unchanged, against the running server (embedded SmolLM2):
the OpenAI Agents SDK, LangChain's ChatOpenAI.bind_tools, and instructor's JSON-schema mode.
Versions are pinned in the ``clients`` extra; nothing here reaches the network."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel, Field


@pytest.fixture(scope="module")
def base_url(smol_server):
    return f"{smol_server.url}/v1"


@pytest.fixture(scope="module")
def model(base_url):
    import openai

    return openai.OpenAI(base_url=base_url, api_key="unused").models.list().data[0].id


def test_openai_agents_sdk_completes_a_tool_round_trip(base_url, model):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
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

    agent = Agent(
        name="weather",
        instructions="Answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(
            model=model, openai_client=AsyncOpenAI(base_url=base_url, api_key="unused")
        ),
        # NOTE: tool_choice resets to auto after the first call (the SDK's default), so the
        # second turn answers in text.
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=48
        ),
    )
    result = asyncio.run(Runner.run(agent, "What's the weather in Paris?", max_turns=4))
    assert asked, "the agent never called the tool"
    outputs = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert outputs and "sunny" in str(outputs[0].output)
    assert isinstance(result.final_output, str)


def test_langchain_bind_tools_gets_tool_calls(base_url, model):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str, unit: str = "celsius") -> str:
        """The current weather in a city."""
        return "sunny"

    llm = ChatOpenAI(
        model=model, base_url=base_url, api_key="unused", temperature=0, max_tokens=64,
        max_retries=0,
    )
    bound = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False)
    message = bound.invoke("What's the weather in Oslo?")
    assert len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call["name"] == "get_weather" and isinstance(call["args"].get("city"), str)
    assert call["id"].startswith("call_")


class City(BaseModel):
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    population_millions: float = Field(ge=0, le=100)


def test_instructor_json_schema_mode_returns_a_validated_object(base_url, model):
    import instructor
    from openai import OpenAI

    client = instructor.from_openai(
        OpenAI(base_url=base_url, api_key="unused"), mode=instructor.Mode.JSON_SCHEMA
    )
    city = client.chat.completions.create(
        model=model, response_model=City, max_retries=0, max_tokens=96, temperature=0,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
    )
    assert isinstance(city, City) and city.name
