"""Tool-call formats: whole-output parsing, streaming in any split, and call regexes."""

from __future__ import annotations

import random
import re

import interegular
import pytest

from radixlm.runtime.function_call import (
    ParseResult,
    ToolCall,
    detect_tool_parser,
    get_tool_parser,
    merge_deltas,
)

WEATHER = ToolCall("get_weather", '{"city":"Paris"}')
NOW = ToolCall("now", "{}")
HERMES_WEATHER = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
HERMES_NOW = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
LLAMA_WEATHER = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
MISTRAL_WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'

# (format, output, expected content, expected calls)
CASES = [
    ("hermes", HERMES_WEATHER, "", [WEATHER]),
    ("hermes", f"{HERMES_WEATHER}\n{HERMES_NOW}\n", "", [WEATHER, NOW]),
    ("hermes", '<tool_call>\n{"name": "now"}\n</tool_call>', "", [NOW]),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}</tool_call>',
        "",
        [ToolCall("f", '{"a":[1,2]}')],
    ),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"city": "Zürich"}}</tool_call>',
        "",
        [ToolCall("f", '{"city":"Zürich"}')],
    ),
    ("hermes", f"Let me check.\n{HERMES_WEATHER}\nDone.", "Let me check.\n\nDone.", [WEATHER]),
    ("hermes", "No tools needed <tool here>.", "No tools needed <tool here>.", []),
    (
        "hermes",
        "<tool_call>\n{bad json}\n</tool_call>",
        "<tool_call>\n{bad json}\n</tool_call>",
        [],
    ),
    (
        "hermes",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        [],
    ),
    ("hermes", '<tool_call>\n{"name": "f"', '<tool_call>\n{"name": "f"', []),
    ("hermes", f"<tool_call>oops {HERMES_NOW}", "<tool_call>oops ", [NOW]),
    ("llama3", LLAMA_WEATHER, "", [WEATHER]),
    ("llama3", f'\n{LLAMA_WEATHER}; {{"name": "now", "parameters": {{}}}}', "", [WEATHER, NOW]),
    ("llama3", '<|python_tag|>{"name": "now", "arguments": {}}', "", [NOW]),
    ("llama3", '<|python_tag|>{"name": "now"}', "", [NOW]),
    ("llama3", f"Checking.<|python_tag|>{LLAMA_WEATHER}", "Checking.", [WEATHER]),
    ("llama3", f"{LLAMA_WEATHER}\nDone.", "\nDone.", [WEATHER]),
    ("llama3", f"{LLAMA_WEATHER};", ";", [WEATHER]),
    ("llama3", '{"name": "Bob"}', '{"name": "Bob"}', []),
    ("llama3", '{"answer": 42} is it', '{"answer": 42} is it', []),
    ("llama3", f"Sure: {LLAMA_WEATHER}", f"Sure: {LLAMA_WEATHER}", []),
    ("llama3", '{"name": "f", "parameters": {', '{"name": "f", "parameters": {', []),
    ("llama3", "<|python_tag|>print(1)", "<|python_tag|>print(1)", []),
    ("mistral", f"[TOOL_CALLS][{MISTRAL_WEATHER}]", "", [WEATHER]),
    (
        "mistral",
        f'[TOOL_CALLS] [{MISTRAL_WEATHER}, {{"name": "now", "arguments": {{}}}}]',
        "",
        [WEATHER, NOW],
    ),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]now[ARGS]{}',
        "",
        [WEATHER, NOW],
    ),
    ("mistral", f"Sure.\n[TOOL_CALLS][{MISTRAL_WEATHER}]\nDone.", "Sure.\n\nDone.", [WEATHER]),
    ("mistral", '[TOOL_CALLS][{"name": 1}]', '[TOOL_CALLS][{"name": 1}]', []),
    ("mistral", "[TOOL_CALLS] hello", "[TOOL_CALLS] hello", []),
    ("mistral", "[TOOL_CALLS]", "[TOOL_CALLS]", []),
    ("mistral", '[TOOL_CALLS][{"name": "f"', '[TOOL_CALLS][{"name": "f"', []),
    ("mistral", "[TOOL_CALLS]f[ARGS]oops", "[TOOL_CALLS]f[ARGS]oops", []),
    ("pythonic", '[get_weather(city="Paris")]', "", [WEATHER]),
    ("pythonic", ' [get_weather(city="Paris"), now()]', "", [WEATHER, NOW]),
    (
        "pythonic",
        "[f(a=1, b=-2.5, c=True, d=None, e=[1, 'x'], f={'k': false}, g=null, h=(1,))]",
        "",
        [
            ToolCall(
                "f",
                '{"a":1,"b":-2.5,"c":true,"d":null,"e":[1,"x"],"f":{"k":false},"g":null,"h":[1]}',
            )
        ],
    ),
    ("pythonic", "[now()]\nDone.", "\nDone.", [NOW]),
    ("pythonic", '[f(s="a ] ) \' b")]', "", [ToolCall("f", '{"s":"a ] ) \' b"}')]),
    ("pythonic", "Sure: [now()]", "Sure: [now()]", []),
    ("pythonic", "[f(1)]", "[f(1)]", []),
    ("pythonic", "[f(a=g())]", "[f(a=g())]", []),
    ("pythonic", "[f(**kw)]", "[f(**kw)]", []),
    ("pythonic", "[1, 2]", "[1, 2]", []),
    ("pythonic", "[link](https://x.y)", "[link](https://x.y)", []),
    ("pythonic", '[f(a="x"', '[f(a="x"', []),
]

CASE_IDS = [f"{case[0]}-{i}" for i, case in enumerate(CASES)]


def stream_all(name: str, pieces: list[str]) -> ParseResult:
    stream = get_tool_parser(name).stream()
    return merge_deltas([stream.feed(piece) for piece in pieces] + [stream.finish()])


def random_split(text: str, rng: random.Random, longest: int = 5) -> list[str]:
    pieces, pos = [], 0
    while pos < len(text):
        size = rng.randint(1, longest)
        pieces.append(text[pos : pos + size])
        pos += size
    return pieces


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES, ids=CASE_IDS)
def test_parse(name: str, text: str, content: str, calls: list[ToolCall]) -> None:
    assert get_tool_parser(name).parse(text) == ParseResult(content, calls)


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES, ids=CASE_IDS)
def test_stream_matches_parse(name: str, text: str, content: str, calls: list[ToolCall]) -> None:
    expected = ParseResult(content, calls)
    assert stream_all(name, list(text)) == expected
    rng = random.Random(len(text))
    for _ in range(5):
        assert stream_all(name, random_split(text, rng)) == expected


FRAGMENTS = {
    "hermes": [HERMES_WEATHER, HERMES_NOW, "<tool_call>", "</tool_call>", "<tool", '{"name": "f"'],
    "llama3": [LLAMA_WEATHER, "<|python_tag|>", "<|py", ";", "{", "}", '{"name": "x"}'],
    "mistral": [
        f"[TOOL_CALLS][{MISTRAL_WEATHER}]",
        "[TOOL_CALLS]now[ARGS]{}",
        "[TOOL_CALLS]",
        "now[ARGS]{}",
        "[TOOL",
        "[",
        "]",
    ],
    "pythonic": ['[get_weather(city="Paris")]', "[", "now()", "]", "(", "'", '"', "[f(a=1)]"],
}


@pytest.mark.parametrize("name", sorted(FRAGMENTS))
def test_stream_matches_parse_on_random_outputs(name: str) -> None:
    rng = random.Random(name)
    common = [" ", "\n", "text", "a b", ","]
    for _ in range(300):
        pool = FRAGMENTS[name] + common
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 8)))
        expected = get_tool_parser(name).parse(text)
        assert stream_all(name, random_split(text, rng, 4)) == expected, text
        assert stream_all(name, list(text)) == expected, text


@pytest.mark.parametrize(
    ("name", "piece", "shown"),
    [
        ("hermes", "Hello <tool", "Hello "),
        ("hermes", "Hello <b>", "Hello <b>"),
        ("mistral", "Hi [TOOL_", "Hi "),
        ("llama3", "Hi <|python", "Hi "),
        ("llama3", '{"name": "f"', ""),
        ("pythonic", "[get_wea", ""),
        ("pythonic", "[1] Intro", "[1] Intro"),
        ("pythonic", "Hello [now()", "Hello [now()"),
    ],
)
def test_stream_holds_back_only_possible_calls(name: str, piece: str, shown: str) -> None:
    assert get_tool_parser(name).stream().feed(piece).content == shown


def test_stream_sends_each_call_whole_with_its_index() -> None:
    stream = get_tool_parser("hermes").stream()
    first = stream.feed(f"{HERMES_WEATHER}\n{HERMES_NOW[:-3]}")
    second = stream.feed(HERMES_NOW[-3:])
    assert [(c.index, c.name, c.arguments) for c in first.calls] == [
        (0, "get_weather", WEATHER.arguments)
    ]
    assert [(c.index, c.name, c.arguments) for c in second.calls] == [(1, "now", "{}")]
    assert not stream.finish()


ARGS_RE = r'\{"city":"[a-z]+"\}'
SERIALIZED = {
    "hermes": (
        '<tool_call>\n{"name":"get_weather","arguments":{"city":"paris"}}\n</tool_call>',
        "\n",
    ),
    "builtin": (
        '<tool_call>\n{"name":"get_weather","arguments":{"city":"paris"}}\n</tool_call>',
        "",
    ),
    "llama3": ('{"name":"get_weather","parameters":{"city":"paris"}}', ";"),
    "mistral": ('[TOOL_CALLS][{"name":"get_weather","arguments":{"city":"paris"}}]', ","),
}


def _twice(name: str) -> str:
    one, sep = SERIALIZED[name]
    if name == "mistral":
        body = one[len("[TOOL_CALLS][") : -1]
        return f"[TOOL_CALLS][{body}{sep}{body}]"
    return one + sep + one


@pytest.mark.parametrize("name", sorted(SERIALIZED))
def test_calls_regex_accepts_the_format_it_parses(name: str) -> None:
    parser = get_tool_parser(name)
    one = parser.call_regex("get_weather", ARGS_RE)
    single, parallel = parser.calls_regex(one, False), parser.calls_regex(one, True)
    text, twice = SERIALIZED[name][0], _twice(name)
    call = ToolCall("get_weather", '{"city":"paris"}')
    # NOTE: the output may end right after any call
    assert re.fullmatch(single, text) and re.fullmatch(parallel, text)
    assert re.fullmatch(parallel, twice) and not re.fullmatch(single, twice)
    assert not re.fullmatch(parallel, text.replace("get_weather", "get_time"))
    assert parser.parse(text) == ParseResult("", [call])
    assert parser.parse(twice) == ParseResult("", [call, call])
    interegular.parse_pattern(parallel)


def test_call_regex_escapes_the_name() -> None:
    one = get_tool_parser("hermes").call_regex("a.b", "\\{\\}")
    assert re.fullmatch(one, '{"name":"a.b","arguments":{}}')
    assert not re.fullmatch(one, '{"name":"axb","arguments":{}}')


def test_pythonic_has_no_grammar() -> None:
    parser = get_tool_parser("pythonic")
    assert parser.trigger is None and parser.call_regex("f", ARGS_RE) is None


def test_unknown_parser_names_the_option() -> None:
    with pytest.raises(ValueError, match="tool_call_parser.*hermes"):
        get_tool_parser("nope")


@pytest.mark.parametrize(
    ("template", "name"),
    [
        ("{{ '<tool_call>\\n' }}{{ tool_call | tojson }}", "hermes"),
        ("{{ '[TOOL_CALLS]' }}", "mistral"),
        ("<|start_header_id|>ipython ... <|python_tag|>", "llama3"),
        ('<|start_header_id|>{"name": function name, "parameters": dict}', "llama3"),
        ("[func_name1(params_name1=params_value1)]", "pythonic"),
        ("{{ messages }}", "hermes"),
        (None, "hermes"),
    ],
)
def test_detect_tool_parser(template: str | None, name: str) -> None:
    assert detect_tool_parser(template) == name


def test_tool_schemas_with_code_type_names_become_json_schema():
    """SGLang accepts tools written from code or databases (``int``, ``varchar(64)``); their
    schemas reach the prompt and the grammar with JSON Schema's names."""
    from radixlm.runtime.function_call import get_tool_parser
    from radixlm.runtime.function_call.toolset import check_tools

    params = {"type": "object", "properties": {
        "n": {"type": "int"}, "name": {"type": "varchar(64)"},
        "ratio": {"type": ["float64", "null"]},
        "flags": {"type": "list", "items": {"type": "bool"}},
        "description": {"type": "str", "enum": ["int", "str"]},  # NOTE: a property so named
    }, "required": ["n"]}  # fmt: skip
    tool = check_tools([{"type": "function", "function": {"name": "f", "parameters": params}}])[0]
    props = tool.parameters["properties"]
    assert props["n"] == {"type": "integer"} and props["name"] == {"type": "string"}
    assert props["ratio"] == {"type": ["number", "null"]}
    assert props["flags"] == {"type": "array", "items": {"type": "boolean"}}
    assert props["description"] == {"type": "string", "enum": ["int", "str"]}
    assert get_tool_parser("qwen25").name == get_tool_parser("hermes").name == "hermes"
    with pytest.raises(ValueError, match=r"tools\[0\].function.parameters"):
        check_tools([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "foo"}}}}}])
