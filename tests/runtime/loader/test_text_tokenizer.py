"""The torch-free tokenizer of the server and detokenizer gives transformers' ids, text and
prompts, and those processes' modules import no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.loader.text_tokenizer import (
    TextTokenizer,
    load_text_tokenizer,
    save_text_tokenizer,
    text_tokenizer_dir,
)

TEXTS = [
    "Hello world!",
    "  leading spaces,\ttabs\n\nand newlines ",
    "<|im_start|>user\nhi<|im_end|>",
    "émoji 🤖 and 中文",
    "don't , . ? it 's",
    "",
]
CHATS = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue"},
    ],
]


def assert_same(hf, text: TextTokenizer) -> None:
    for s in TEXTS:
        for special in (True, False):
            assert text.encode(s, add_special_tokens=special) == hf.encode(
                s, add_special_tokens=special
            ), s
        ids = hf.encode(s)
        for skip in (True, False):
            assert text.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip
            ), s


def test_smollm2_tokenizer_matches_transformers(smollm_tokenizer, tmp_path):
    assert save_text_tokenizer(smollm_tokenizer, str(tmp_path / "saved"))
    text = TextTokenizer(str(tmp_path / "saved"))
    assert_same(smollm_tokenizer, text)
    assert (text.eos_token, text.eos_token_id) == (
        smollm_tokenizer.eos_token,
        smollm_tokenizer.eos_token_id,
    )
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for chat in CHATS:
        for kwargs in (
            {"add_generation_prompt": True},
            {"add_generation_prompt": False, "tools": tools},
            {"continue_final_message": chat[-1]["role"] == "assistant"},
        ):
            expected = smollm_tokenizer.apply_chat_template(chat, tokenize=False, **kwargs)
            assert text.apply_chat_template(chat, tokenize=False, **kwargs) == expected
            ids = smollm_tokenizer.apply_chat_template(chat, **kwargs, return_dict=False)
            assert text.apply_chat_template(chat, **kwargs) == ids


@pytest.fixture(scope="module")
def wordpiece_tokenizer():
    """A WordPiece tokenizer that adds [CLS]/[SEP] and cleans up spaces on decode, with two
    named chat templates."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(
        ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "hello", "world", "it", "'", "s", ",", ".", "?",
         "don", "t", "##s", "user", "bot", ":"])}  # fmt: skip
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="[PAD]", clean_up_tokenization_spaces=True,
    )  # fmt: skip
    tok.chat_template = {
        "default": "{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}",
        "tool_use": "{{ tools | length }} tools {% for m in messages %}{{ m.content }}{% endfor %}",
    }
    return tok


def test_wordpiece_with_post_processor_and_clean_up_matches(wordpiece_tokenizer, tmp_path):
    assert save_text_tokenizer(wordpiece_tokenizer, str(tmp_path / "saved"))
    text = TextTokenizer(str(tmp_path / "saved"))
    assert_same(wordpiece_tokenizer, text)
    assert text.encode("hello world")[0] == 1  # NOTE: [CLS] added, as transformers does
    assert text.decode(text.encode("it 's , don't ?"), skip_special_tokens=True) == (
        wordpiece_tokenizer.decode(wordpiece_tokenizer.encode("it 's , don't ?"), True)
    )
    chat = [{"role": "user", "content": "hello"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    for kwargs in ({}, {"tools": tools}, {"chat_template": "tool_use", "tools": []}):
        expected = wordpiece_tokenizer.apply_chat_template(chat, tokenize=False, **kwargs)
        assert text.apply_chat_template(chat, tokenize=False, **kwargs) == expected
    with pytest.raises(ValueError, match="empty conversation"):
        text.apply_chat_template([], tokenize=False)


def test_the_saved_tokenizer_is_keyed_by_its_files(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLM_CACHE", str(tmp_path / "cache"))
    path = tiny_llama
    args = ServerArgs(model_path=path)
    first = text_tokenizer_dir(args, path)
    assert not isinstance(load_text_tokenizer(args, path, "safetensors"), TextTokenizer)
    loaded = load_text_tokenizer(args, path, "safetensors")  # NOTE: the first load saved it
    assert isinstance(loaded, TextTokenizer) and os.path.isdir(first)
    config = os.path.join(path, "tokenizer_config.json")
    stat = os.stat(config)
    try:
        os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        assert text_tokenizer_dir(args, path) != first
    finally:
        os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert load_text_tokenizer(ServerArgs(model_path=path, skip_tokenizer_init=True), path,
                               "safetensors") is None  # fmt: skip


def test_server_and_detokenizer_modules_import_no_torch(smollm_tokenizer, tmp_path):
    """What ``radixlm serve`` runs in its own process and in the detokenizer, with torch made
    unimportable: the modules, the tokenizer and a chat prompt."""
    save_text_tokenizer(smollm_tokenizer, str(tmp_path / "saved"))
    code = f"""
import sys
sys.modules["torch"] = None  # NOTE: any import of torch now raises
import radixlm.server.cli, radixlm.server.app, radixlm.runtime.detokenizer, radixlm.runtime.worker
from radixlm.runtime.loader.text_tokenizer import TextTokenizer
tok = TextTokenizer({str(tmp_path / "saved")!r})
print(tok.apply_chat_template({json.dumps(CHATS[0])}, add_generation_prompt=True, tokenize=False))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.endswith("<|im_start|>assistant\n\n")
