"""Chat templates: the registry, Llama-2 style, and templates derived from a model's Jinja."""

from __future__ import annotations

import pytest

from radixlm.lang.chat_template import (
    derive_chat_template,
    get_chat_template,
    get_chat_template_by_model_path,
    jinja_renderer,
    tokenizer_renderer,
)

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]


def test_registry_has_the_named_templates():
    for name in ("chatml", "llama-3-instruct", "llama-2-chat", "qwen", "default"):
        assert get_chat_template(name).name == name
    with pytest.raises(ValueError, match="unknown chat template"):
        get_chat_template("nope")
    assert get_chat_template_by_model_path("Qwen/Qwen2.5-0.5B-Instruct").name == "qwen"
    assert get_chat_template_by_model_path("/m/SmolLM2-135M-Instruct.gguf").name == "chatml"
    assert get_chat_template_by_model_path("some/model").name == "default"


def test_llama2_puts_the_system_block_inside_the_first_instruction():
    prompt = get_chat_template("llama-2-chat").get_prompt(CONVERSATION[:3])
    assert prompt == "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]Hello! </s><s>"


def test_template_derived_from_smollm_matches_apply_chat_template(smollm_tokenizer):
    template = derive_chat_template(tokenizer_renderer(smollm_tokenizer))
    assert template.role_prefix_and_suffix["user"] == ("<|im_start|>user\n", "<|im_end|>\n")
    assert template.stop_str == ("<|im_end|>",)
    assert template.default_system_prompt.startswith("You are a helpful AI assistant")
    expected = smollm_tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert template.get_prompt(CONVERSATION) == expected


def test_jinja_renderer_derives_the_same_template(smollm_tokenizer):
    from_jinja = derive_chat_template(jinja_renderer(smollm_tokenizer.chat_template))
    from_tokenizer = derive_chat_template(tokenizer_renderer(smollm_tokenizer))
    assert from_jinja == from_tokenizer


def test_a_template_that_rejects_system_messages_is_not_derived():
    source = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('no system') }}{% endif %}{{ m['content'] }}{% endfor %}"
    )
    assert derive_chat_template(jinja_renderer(source)) is None
