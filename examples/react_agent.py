"""A ReAct-style tool loop: the model thinks, picks a tool with ``select``, writes the tool's
input (constrained by a regex or a choice list); Python runs the tool and appends the
observation; repeat until ``finish``.

Every step extends the same state, so each request reuses the KV of all the steps before it.
Run: ``python examples/react_agent.py [--url URL]``
"""

from __future__ import annotations

import ast
import operator

from _backend import backend_from_args

import radixlm as sgl

CAPITALS = {"japan": "Tokyo", "france": "Paris", "kenya": "Nairobi", "peru": "Lima"}
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.Div: operator.truediv}


def calculator(expression: str) -> str:
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("only + - * / on numbers")

    try:
        return str(ev(ast.parse(expression.strip(), mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"


def capital_lookup(country: str) -> str:
    return CAPITALS.get(country.strip().lower().rstrip("."), "unknown")


TOOLS = {"calculator": calculator, "capital_lookup": capital_lookup}
INSTRUCTIONS = (
    "Answer the question using tools. Tools: calculator (arithmetic like 3*7), "
    "capital_lookup (a country name). Use the format:\n"
    "Thought: ...\nAction: <tool or finish>\nInput: <tool input or final answer>\n"
    "Observation: <tool result>\n\n"
    "Question: What is 6 times 7?\nThought: I should multiply.\nAction: calculator\n"
    "Input: 6*7\nObservation: 42\nThought: I know the answer.\nAction: finish\nInput: 42\n\n"
    "Question: What is the capital of France?\nThought: I should look up the capital.\n"
    "Action: capital_lookup\nInput: France\nObservation: Paris\n"
    "Thought: I know the answer.\nAction: finish\nInput: Paris\n\n"
)


def tool_input(action: str, name: str):
    """The tool's input, constrained to what the tool accepts."""
    if action == "capital_lookup":
        return sgl.select(name, choices=[c.title() for c in CAPITALS])
    if action == "calculator":
        return sgl.gen(name, max_tokens=12, regex=r"[0-9]+ ?[-+*/] ?[0-9]+")
    return sgl.gen(name, max_tokens=12, stop="\n")


@sgl.function
def react(s, question, max_steps=3):
    s += INSTRUCTIONS + "Question: " + question + "\n"
    for step in range(max_steps):
        s += "Thought:" + sgl.gen(f"thought_{step}", max_tokens=24, stop="\n") + "\n"
        s += "Action: " + sgl.select(f"action_{step}", choices=[*TOOLS, "finish"]) + "\n"
        action = s[f"action_{step}"]
        s += "Input: " + tool_input(action, f"input_{step}") + "\n"
        if action == "finish":
            return s[f"input_{step}"].strip()
        s += "Observation: " + TOOLS[action](s[f"input_{step}"]) + "\n"
    return None


def main() -> None:
    _, backend = backend_from_args(__doc__)
    for question in ("What is the capital of Kenya?", "What is 12 plus 30?"):
        state = react.run(question=question, temperature=0)
        transcript = state.text()[len(INSTRUCTIONS):]
        print(transcript.rstrip(), f"\n=> final answer: {state.ret_value!r}\n")
    backend.shutdown()


if __name__ == "__main__":
    main()
