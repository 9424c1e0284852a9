"""Expressions, sampling parameters and the public constructors (no model needed)."""

from __future__ import annotations

import pytest

import radixlm as sgl
from radixlm.lang.function import split_sampling_kwargs
from radixlm.lang.ir import SglConstantText, SglExprList, SglGen, SglSamplingParams, SglSelect


def test_strings_and_expressions_concatenate_into_one_flat_list():
    expr = "Q: " + sgl.gen("a") + "\n" + sgl.select("b", choices=["x", "y"])
    assert isinstance(expr, SglExprList)
    kinds = [type(e) for e in expr.expr_list]
    assert kinds == [SglConstantText, SglGen, SglConstantText, SglSelect]


def test_gen_with_choices_is_a_select_and_gen_int_sets_dtype():
    assert isinstance(sgl.gen("c", choices=["a", "b"]), SglSelect)
    assert sgl.gen_int("n").sampling_params.dtype is int
    assert sgl.gen_string("s").sampling_params.dtype is str


def test_bad_arguments_are_rejected_early():
    with pytest.raises(ValueError, match="invalid regex"):
        sgl.gen("x", regex="(")
    with pytest.raises(ValueError, match="choices"):
        sgl.select("x", choices=[])
    with pytest.raises(TypeError):
        sgl.gen("x") + 3


def test_gen_overrides_program_defaults_and_maps_to_runtime_names():
    defaults = SglSamplingParams(max_new_tokens=64, temperature=0.7, stop="\n")
    params = defaults.merged(sgl.gen("x", max_tokens=5, stop=["."], top_k=3).sampling_params)
    assert params.to_runtime() == {
        "max_new_tokens": 5, "temperature": 0.7, "stop": ["."], "top_k": 3,
    }
    with_logprobs = sgl.gen("x", return_logprob=True, top_logprobs_num=2).sampling_params
    assert with_logprobs.request_options() == {"return_logprob": True, "top_logprobs_num": 2}


def test_run_keywords_split_between_sampling_defaults_and_program_arguments():
    defaults, args = split_sampling_kwargs(
        {"temperature": 0, "question": "q", "stop": "x"}, arg_names=["question", "stop"]
    )
    assert defaults.temperature == 0 and defaults.stop is None
    assert args == {"question": "q", "stop": "x"}


def test_function_checks_its_signature_and_bind():
    @sgl.function
    def prog(s, a, b="b"):
        s += a + b

    assert prog.arg_names == ["a", "b"]
    assert prog.bind(a="x").bind_arguments == {"a": "x"}
    with pytest.raises(TypeError, match="no argument"):
        prog.bind(c=1)
    with pytest.raises(TypeError, match="program state"):
        sgl.function(lambda: None)


def test_run_without_a_backend_explains_what_to_do():
    @sgl.function
    def prog(s):
        s += "hi"

    sgl.set_default_backend(None)
    with pytest.raises(ValueError, match="set_default_backend"):
        prog.run()


SGLANG_NAMES = [
    "function", "gen", "gen_int", "gen_string", "select", "system", "user", "assistant",
    "system_begin", "system_end", "user_begin", "user_end", "assistant_begin", "assistant_end",
    "set_default_backend", "Engine", "RuntimeEndpoint", "OpenAI", "Runtime", "flush_cache",
    "get_server_info", "REGEX_INT", "REGEX_FLOAT", "REGEX_BOOL", "REGEX_STR",
    "token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized",
]


def test_the_sglang_frontend_names_are_on_the_package():
    missing = [name for name in SGLANG_NAMES if not hasattr(sgl, name)]
    assert missing == []
