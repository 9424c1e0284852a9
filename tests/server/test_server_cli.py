"""The command line, the chat-template option, and start-up failures."""

from __future__ import annotations

import socket
import subprocess
import sys

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


def test_sglang_flags_are_taken():
    args = parse_args([
        "--chunked-prefill-size", "-1", "--attention-backend", "torch_native", "--enable-metrics",
        "--is-embedding", "--incremental-streaming-output",
        "--json-model-override-args", '{"rope_theta": 500000.0}', "--max-payload-size", "1024",
        "--tool-call-parser", "qwen25",
    ])
    assert args.max_request_bytes == 1024 and args.tool_call_parser == "qwen25"
    assert args.chunked_prefill_size is None and args.attention_backend == "torch"
    assert args.is_embedding and args.incremental_streaming_output
    assert args.model_overrides == {"rope_theta": 500000.0}


BAD_FLAGS = [["--dtype", "int3"], ["--max-running-requests", "0"], ["--bogus"],
             ["--json-model-override-args", "{rope"], ["--json-model-override-args", "[1]"],
             ["--chunked-prefill-size", "-2"]]  # fmt: skip


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


def _serve(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "radixlm.server", *argv],
        capture_output=True, text=True, timeout=120,
    )


def test_start_up_failures_are_one_line_before_the_model_loads(tiny_llama, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        cases = {
            "does not exist": ["--model-path", str(tmp_path / "missing")],
            "Address already in use": ["--model-path", tiny_llama, "--port", port],
            "port must be in [0, 65535]": ["--port", "99999"],
            "chat_template": ["--chat-template", str(tmp_path / "none.jinja")],
        }
        for needle, argv in cases.items():
            done = _serve(*argv)
            lines = done.stderr.strip().splitlines()
            assert done.returncode != 0 and len(lines) == 1, done.stderr
            assert lines[0].startswith("radixlm serve: error:") and needle in lines[0]


def test_server_info_reports_start_up_phases_and_memory(tiny_client):
    info = tiny_client.get("/get_server_info").json()
    assert {"load", "kv_allocate"} <= set(info["startup_s"])
    memory = info["memory_bytes"]
    assert memory["weights"] > 0 and memory["kv_pool"] > 0
    assert set(info["rss_bytes"]) == {"scheduler", "detokenizer", "server"}
    assert all(v > 0 for v in info["rss_bytes"].values())
