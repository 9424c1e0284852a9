"""The tokenizer manager releases a request's state on every path, even when sending fails."""

from __future__ import annotations

import pytest

from radixlm.runtime import tokenizer_manager


def test_a_failure_inside_the_server_leaves_no_request_state(tiny_engine, monkeypatch):
    real_send = tokenizer_manager.ipc.send

    def failing_send(socket, msg):
        if type(msg).__name__ == "GenerateReq":
            raise OverflowError("simulated encoder failure")
        return real_send(socket, msg)

    monkeypatch.setattr(tokenizer_manager.ipc, "send", failing_send)
    for _ in range(20):
        with pytest.raises(OverflowError):
            tiny_engine.generate("hi", {"max_new_tokens": 2})
    monkeypatch.setattr(tokenizer_manager.ipc, "send", real_send)
    assert tiny_engine.runtime.manager.states == {}
    out = tiny_engine.generate("hi", {"max_new_tokens": 2, "ignore_eos": True})
    assert out["meta_info"]["completion_tokens"] == 2
