"""SGLang frontend names beyond the core: ``separate_reasoning``, ``stop_regex``,
``global_config`` and the media inputs (a clear error on text-only models)."""

from __future__ import annotations

import re

import pytest

import radixlm as sgl

THINKING = r"<think>\nFirst add 2 and 2\.\n</think>\n\nThe answer is 4\."


def test_separate_reasoning_splits_the_variable(tiny):
    @sgl.function
    def think(s):
        s += "Q: 2+2? A: "
        s += sgl.separate_reasoning(sgl.gen("answer", max_tokens=40, regex=THINKING),
                                    model_type="deepseek-r1")  # fmt: skip

    state = think.run(temperature=0, backend=tiny)
    assert state.error() is None
    assert state["answer"] == "The answer is 4."
    assert state["answer_reasoning_content"] == "First add 2 and 2."
    assert "<think>" in state.text()  # the program's text keeps what the model wrote


def test_separate_reasoning_without_a_block_leaves_the_text(tiny):
    @sgl.function
    def plain(s):
        s += "Say: "
        s += sgl.separate_reasoning(sgl.gen("x", max_tokens=8, regex="hello there"),
                                    model_type="qwen3")  # fmt: skip

    state = plain.run(temperature=0, backend=tiny)
    assert state["x"] == "hello there" and state["x_reasoning_content"] == ""


def test_separate_reasoning_has_sglangs_shape():
    from radixlm.lang.ir import SglExprList, SglSeparateReasoning

    expr = sgl.separate_reasoning(sgl.gen("test_var"), model_type="deepseek-r1")
    assert isinstance(expr, SglExprList)
    split = expr.expr_list[1]
    assert isinstance(split, SglSeparateReasoning) and split.model_type == "deepseek-r1"
    assert split.name == "test_var_reasoning_content"
    assert split.process_name_for_reasoning("other") == "other_reasoning_content"
    want = "SeparateReasoning(model_type=deepseek-r1, name=test_var_reasoning_content)"
    assert repr(split) == want
    with pytest.raises(ValueError, match="Either expr or name must be provided"):
        SglSeparateReasoning(model_type="deepseek-r1")
    with pytest.raises(ValueError, match="named gen"):
        sgl.separate_reasoning("text", model_type="qwen3")
    # NOTE: as SGLang, any model_type is taken here; running it checks it
    unknown = sgl.separate_reasoning(sgl.gen("x"), model_type="invalid-model")
    assert unknown.expr_list[1].model_type == "invalid-model"


def test_separate_reasoning_with_an_unknown_model_type_fails_when_run(tiny):
    @sgl.function
    def think(s):
        s += "Q: "
        s += sgl.separate_reasoning(sgl.gen("a", max_tokens=2), model_type="invalid-model")

    state = think.run(temperature=0, backend=tiny)
    assert isinstance(state.error(), ValueError)
    assert "unsupported model_type 'invalid-model'" in str(state.error())


def test_media_inputs_fail_clearly_on_a_text_only_model(tiny):
    @sgl.function
    def look(s):
        s += sgl.user(sgl.image("cat.png") + "What is this?")
        s += sgl.assistant(sgl.gen("answer", max_tokens=4))

    state = look.run(backend=tiny)
    assert isinstance(state.error(), ValueError)
    assert "image input is not supported by this model" in str(state.error())
    with pytest.raises(sgl.ProgramError):
        state["answer"]  # noqa: B018  (reading a variable of the failed program)


def test_global_config_is_sglangs():
    assert sgl.global_config is sgl.lang.global_config
    sgl.set_default_backend(None)
    assert sgl.global_config.default_backend is None


def test_stop_regex_in_a_program(tiny):
    @sgl.function
    def story(s):
        s += "Once upon a time"
        s += sgl.gen("rest", max_tokens=24, temperature=0, stop_regex=r"\s")

    state = story.run(backend=tiny)
    assert state.error() is None and not re.search(r"\s", state["rest"])
