"""Roles render with SmolLM2's own chat template; messages() is the OpenAI-style history."""

from __future__ import annotations

import radixlm as sgl


@sgl.function
def two_turns(s, q1, q2):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(q1)
    s += sgl.assistant(sgl.gen("a1", max_tokens=6))
    with s.user():
        s += q2
    with s.assistant():
        s += sgl.gen("a2", max_tokens=6)


def test_multi_turn_messages_and_text_match_the_model_template(smol, smol_engine):
    state = two_turns.run(q1="What is 2+2?", q2="And 3+3?", temperature=0, backend=smol)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[1]["content"] == "What is 2+2?"
    assert messages[2]["content"] == state["a1"].lstrip() != ""
    assert messages[4]["content"] == state["a2"].lstrip()
    expected = smol_engine.tokenizer.apply_chat_template(messages, tokenize=False)
    assert state.text() == expected


def test_a_chat_without_system_gets_the_template_default(smol, smol_engine):
    @sgl.function
    def one_turn(s):
        s += sgl.user_begin() + "Hi" + sgl.user_end()
        s += sgl.assistant_begin()

    state = one_turn.run(backend=smol)
    assert state.messages()[0]["role"] == "system"
    expected = smol_engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert state.text() == expected
