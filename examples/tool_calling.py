"""An agent loop with tool calls: ``gen(tools=..., tool_choice=...)`` constrains the model to a
call whose arguments match the tool's schema; Python runs the tool, the result goes back into
the conversation, and the model answers from it.

Run: ``python examples/tool_calling.py [--url URL]``
"""

from __future__ import annotations

from _backend import backend_from_args

import radixlm as sgl

CITIES = {"paris": "light rain, 14 C", "lima": "sunny, 22 C", "oslo": "snow, -3 C"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 30}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_temperature",
            "description": "Convert degrees Celsius to Fahrenheit.",
            "parameters": {
                "type": "object",
                "properties": {"celsius": {"type": "number", "minimum": -90, "maximum": 60}},
                "required": ["celsius"],
            },
        },
    },
]


def run_tool(call: dict) -> str:
    args = call["arguments"]
    if call["name"] == "get_weather":
        return CITIES.get(args["city"].strip().lower(), "unknown city")
    return f"{args['celsius'] * 9 / 5 + 32:.1f} F"


@sgl.function
def agent(s, question):
    s += sgl.system("You are a helpful assistant.\n\n" + sgl.tools_prompt(TOOLS))
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("call", tools=TOOLS, tool_choice="required", max_tokens=64))
    for call in s.tool_calls("call"):
        s += sgl.user(f"<tool_response>\n{run_tool(call)}\n</tool_response>")
    s += sgl.assistant(sgl.gen("answer", max_tokens=48, temperature=0))


def main() -> None:
    backend_from_args(__doc__.splitlines()[0])
    questions = ["What's the weather in Paris?", "Is it cold in Oslo right now?"]
    states = agent.run_batch([{"question": q} for q in questions], temperature=0)
    for q, state in zip(questions, states):
        print(f"Q: {q}\n  call:   {state.tool_calls('call')}\n  answer: {state['answer']!r}")


if __name__ == "__main__":
    main()
