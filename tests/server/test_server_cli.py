"""The command line and the chat-template option, without starting a server."""

from __future__ import annotations

import pytest

from radixlm.server.chat_prompt import render_chat
from radixlm.server.cli import parse_args
from radixlm.server.openai_format import load_chat_template
from radixlm.server.protocol import ChatCompletionRequest


def test_serve_flags_become_server_args():
    args = parse_args([
        "serve", "--port", "31234", "--max-queued-requests", "0", "--disable-radix-cache",
        "--schedule-policy", "fcfs", "--api-key", "k", "--served-model-name", "m",
    ])
    assert (args.port, args.max_queued_requests, args.disable_radix_cache) == (31234, 0, True)
    assert (args.schedule_policy, args.api_key, args.served_model_name) == ("fcfs", "k", "m")
    assert args.host == "127.0.0.1" and args.model_path is None


BAD_FLAGS = [["--dtype", "int3"], ["--max-running-requests", "0"], ["--bogus"]]


@pytest.mark.parametrize("argv", BAD_FLAGS)
def test_bad_flags_exit_with_a_message(argv):
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code != 0


def test_chat_template_from_string_or_file(tmp_path):
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    assert load_chat_template(template) == template
    path = tmp_path / "t.jinja"
    path.write_text(template)
    assert load_chat_template(str(path)) == template
    assert load_chat_template(None) is None
    with pytest.raises(ValueError, match="chat_template"):
        load_chat_template("no-such-file.jinja")


def test_render_chat_uses_the_given_or_the_model_template(smollm_tokenizer):
    req = ChatCompletionRequest(messages=[
        {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                     {"type": "text", "text": "there"}]},
    ])
    custom = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    expected = "<system>Be terse.<user>Hi there<assistant>"
    assert render_chat(smollm_tokenizer, req, custom) == expected
    own = render_chat(smollm_tokenizer, req, None)
    assert "Hi there" in own and own.rstrip().endswith("assistant")


def test_api_key_from_a_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("RADIXLM_API_KEY", raising=False)
    assert parse_args([]).api_key is None
    monkeypatch.setenv("RADIXLM_API_KEY", "from-env")
    assert parse_args([]).api_key == "from-env"
    key = tmp_path / "key"
    key.write_text("from-file\n")
    assert parse_args(["--api-key-file", str(key)]).api_key == "from-file"
    assert parse_args(["--api-key", "flag"]).api_key == "flag"
    with pytest.raises(SystemExit, match="api_key_file"):
        parse_args(["--api-key-file", str(tmp_path / "missing")])


def test_num_threads_flag():
    assert parse_args(["--num-threads", "3"]).num_threads == 3
    assert parse_args([]).num_threads is None
    with pytest.raises(SystemExit, match="num_threads must be >= 1"):
        parse_args(["--num-threads", "0"])
