"""Typed messages between the processes, serialised with msgspec MessagePack (never pickle)."""

from __future__ import annotations

from typing import Any, Union

import msgspec


class GenerateReq(msgspec.Struct, tag=True):
    rid: str
    input_ids: list[int]
    sampling: dict[str, Any]
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0


class AbortReq(msgspec.Struct, tag=True):
    rid: str


class ControlReq(msgspec.Struct, tag=True):
    """flush_cache | stats | ping: answered by a ControlOut with the same ``cid``."""

    cid: str
    kind: str


class TokenOut(msgspec.Struct, tag=True):
    """New output token ids of one request (scheduler -> detokenizer)."""

    rid: str
    new_ids: list[int]
    finish: dict[str, Any] | None
    meta: dict[str, Any]
    skip_special_tokens: bool = True
    stop: list[str] = []
    no_stop_trim: bool = False
    stream: bool = False


class TextOut(msgspec.Struct, tag=True):
    """New text and ids of one request (detokenizer -> tokenizer manager)."""

    rid: str
    text: str
    new_ids: list[int]
    finish: dict[str, Any] | None
    meta: dict[str, Any]


class ControlOut(msgspec.Struct, tag=True):
    cid: str
    ok: bool
    data: dict[str, Any]


class Batch(msgspec.Struct, tag=True):
    """Several outputs in one frame."""

    items: list[TokenOut | TextOut | ControlOut]


Message = Union[GenerateReq, AbortReq, ControlReq, TokenOut, TextOut, ControlOut, Batch]  # noqa: UP007

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    return _decoder.decode(data)
