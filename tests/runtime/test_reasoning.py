"""Reasoning parsers: ``<think>`` blocks split from the content, whole or streamed."""

from __future__ import annotations

import random

import pytest

from radixlm.runtime.reasoning import get_reasoning_parser

# (parser, output, expected reasoning, expected content)
CASES = [
    ("qwen3", "<think>\nI think.\n</think>\n\nAnswer.", "I think.", "Answer."),
    ("qwen3", "<think>\na\n\nb\n</think>\n\nA\n\nB\n", "a\n\nb", "A\n\nB\n"),
    ("qwen3", "Answer only.", None, "Answer only."),
    ("qwen3", "\n\nAnswer", None, "\n\nAnswer"),
    ("qwen3", "<think>\nstill thinking", "still thinking", ""),
    ("qwen3", "  <think>x</think>y", "x", "y"),
    ("qwen3", "<think></think>\n\nA", "", "A"),
    ("qwen3", "Hi <think>x</think>", None, "Hi <think>x</think>"),
    ("qwen3", "<thinking>", None, "<thinking>"),
    ("qwen3", "<thi", None, "<thi"),
    ("qwen3", "", None, ""),
    ("deepseek-r1", "I think.\n</think>\n\nAnswer.", "I think.", "Answer."),
    ("deepseek-r1", "<think>\nI think.</think>Answer", "I think.", "Answer"),
    ("deepseek-r1", "\nstill thinking </thi", "still thinking </thi", ""),
    ("deepseek-r1", "x</think>a</think>b", "x", "a</think>b"),
    ("deepseek-r1", "", "", ""),
]
CASE_IDS = [f"{case[0]}-{i}" for i, case in enumerate(CASES)]


def stream_all(name: str, pieces: list[str]) -> tuple[str, str]:
    stream = get_reasoning_parser(name).stream()
    deltas = [stream.feed(piece) for piece in pieces] + [stream.finish()]
    return "".join(r for r, _ in deltas), "".join(c for _, c in deltas)


def random_split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text), rng.randint(0, 6))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES, ids=CASE_IDS)
def test_split(name: str, text: str, reasoning: str | None, content: str) -> None:
    assert get_reasoning_parser(name).split(text) == (reasoning, content)


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES, ids=CASE_IDS)
def test_stream_matches_split(name: str, text: str, reasoning: str | None, content: str) -> None:
    assert stream_all(name, list(text)) == (reasoning or "", content)
    rng = random.Random(text)
    for _ in range(5):
        assert stream_all(name, random_split(text, rng)) == (reasoning or "", content)


@pytest.mark.parametrize("name", ["qwen3", "deepseek-r1"])
def test_stream_matches_split_on_random_outputs(name: str) -> None:
    rng = random.Random(name)
    pieces = ["<think>", "</think>", "\n", "\n\n", "a", " b", "<", "</th", "<thi"]
    for _ in range(500):
        text = "".join(rng.choices(pieces, k=rng.randint(0, 8)))
        reasoning, content = get_reasoning_parser(name).split(text)
        assert stream_all(name, random_split(text, rng)) == (reasoning or "", content), text
        assert stream_all(name, list(text)) == (reasoning or "", content), text


def test_stream_holds_back_partial_tags() -> None:
    qwen = get_reasoning_parser("qwen3").stream()
    assert qwen.feed("<thi") == ("", "")
    assert qwen.feed("nk>\nStep 1.\n</th") == ("Step 1.", "")
    assert qwen.feed("ink>\n\nDone") == ("", "Done")
    assert qwen.finish() == ("", "")
    deepseek = get_reasoning_parser("deepseek-r1").stream()
    assert deepseek.feed("Hmm") == ("Hmm", "")


def test_parser_attributes() -> None:
    qwen, deepseek = get_reasoning_parser("qwen3"), get_reasoning_parser("deepseek-r1")
    assert (qwen.start_tag, qwen.end_tag) == ("<think>", "</think>")
    assert not qwen.starts_in_reasoning and deepseek.starts_in_reasoning


def test_unknown_parser_names_the_option() -> None:
    with pytest.raises(ValueError, match="reasoning_parser.*qwen3"):
        get_reasoning_parser("nope")
