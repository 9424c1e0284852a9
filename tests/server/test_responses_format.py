"""The Responses translation without a server: input items to chat messages, and chat deltas
to output items and their stream events."""

from __future__ import annotations

import pytest

from radixlm.server.protocol import ResponsesRequest
from radixlm.server.responses_format import OutputItems, chat_request


def test_items_become_chat_messages():
    body = ResponsesRequest(instructions="Be kind.", input=[
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{\"a\":1}"},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_text", "text": "sunny"}]},
        {"type": "function_call_output", "call_id": "c2", "output": "rain"},
    ], max_output_tokens=7, temperature=0.5, seed=3)  # fmt: skip
    chat = chat_request(body)
    roles = [m.role for m in chat.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool"]
    assistant = chat.messages[2]
    assert assistant.reasoning_content == "Use the tool." and assistant.content is None
    assert [c.id for c in assistant.tool_calls] == ["c1", "c2"]
    assert chat.messages[3].content == "sunny" and chat.messages[4].tool_call_id == "c2"
    assert (chat.max_tokens, chat.temperature, chat.seed) == (7, 0.5, 3)


def test_deltas_become_items_and_events():
    out = OutputItems()
    events = out.feed({"reasoning_content": "hmm"})
    events += out.feed({"reasoning_content": " ok", "content": "Hi"})
    events += out.feed({"content": "!"}, logprobs=[{"token": "!", "logprob": -0.1}])
    events += out.feed({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                        "function": {"name": "f", "arguments": ""}}]})
    events += out.feed({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})
    events += out.finish(complete=True)
    kinds = [item["type"] for item in out.items]
    assert kinds == ["reasoning", "message", "function_call"]
    reasoning, message, call = out.items
    assert reasoning["content"][0]["text"] == "hmm ok"
    assert message["content"][0]["text"] == "Hi!" and len(message["content"][0]["logprobs"]) == 1
    assert (call["call_id"], call["arguments"], call["status"]) == ("call_a", "{}", "completed")
    types = [e["type"] for e in events]
    assert types.count("response.output_item.added") == 3
    assert types.count("response.output_item.done") == 3
    # NOTE: an item is done before the next one is added
    for a, b in zip(out.items, out.items[1:]):
        done = next(i for i, e in enumerate(events) if e.get("item", {}).get("id") == a["id"]
                    and e["type"] == "response.output_item.done")  # fmt: skip
        added = next(i for i, e in enumerate(events) if e.get("item", {}).get("id") == b["id"])
        assert done < added
    # NOTE: the added event is a snapshot, not the item that kept growing
    first = next(e for e in events if e["type"] == "response.output_item.added")
    assert first["item"]["content"][0]["text"] == ""


def test_a_cut_off_item_is_incomplete():
    out = OutputItems()
    out.feed({"content": "Once upon"})
    events = out.finish(complete=False)
    assert out.items[0]["status"] == "incomplete"
    assert events[-1]["item"]["status"] == "incomplete"


@pytest.mark.parametrize("field", ["previous_response_id", "conversation"])
def test_stored_state_is_refused(field):
    with pytest.raises(ValueError, match=field):
        chat_request(ResponsesRequest(input="hi", **{field: "x"}))
