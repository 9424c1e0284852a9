"""Typed messages between the processes, serialised with msgspec MessagePack (never pickle)."""

from __future__ import annotations

import enum
from typing import Any, Union

import msgspec


class FinishKind(str, enum.Enum):
    STOP = "stop"  # an EOS or stop token, a stop string, or the end of the grammar
    LENGTH = "length"  # max_new_tokens or the context length
    ABORT = "abort"  # aborted, or refused after it reached the scheduler (see ``ErrorCode``)


class ErrorCode(str, enum.Enum):
    """Why an ``ABORT`` finish happened."""

    ABORTED = "aborted"  # the client went away or asked for it (``/abort_request``)
    INVALID_REQUEST = "invalid_request"  # found bad in the scheduler (its grammar did not compile)


class Finish(msgspec.Struct, frozen=True):
    """Why a request ended. ``to_json`` gives the public (SGLang) ``finish_reason`` object."""

    kind: FinishKind
    matched: int | str | None = None  # STOP: the token id, stop string or stop_regex pattern
    trim: str | None = None  # STOP by stop_regex: the text it matched, where the output is cut
    length: int = 0  # LENGTH: tokens generated
    message: str = ""  # ABORT: what happened, for people
    code: ErrorCode | None = None  # ABORT: what happened, for programs

    @classmethod
    def stop(cls, matched: int | str | None, trim: str | None = None) -> Finish:
        return cls(FinishKind.STOP, matched=matched, trim=trim)

    @classmethod
    def length_limit(cls, n: int) -> Finish:
        return cls(FinishKind.LENGTH, length=n)

    @classmethod
    def abort(cls, code: ErrorCode, message: str) -> Finish:
        return cls(FinishKind.ABORT, message=message, code=code)

    @property
    def is_error(self) -> bool:
        """Ended by a fault of the request (reported to the client as an error, not a result)."""
        return self.kind is FinishKind.ABORT and self.code is not ErrorCode.ABORTED

    def to_json(self) -> dict[str, Any]:
        if self.kind is FinishKind.STOP:
            return {"type": "stop", "matched": self.matched}
        if self.kind is FinishKind.LENGTH:
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message}


class OutMeta(msgspec.Struct):
    """What a TokenOut reports besides its ids. The ``output_*`` logprob lists hold the entries
    for this message's new ids only (the tokenizer manager appends them); the ``input_*`` ones
    come once, in the first message."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    output_token_logprobs: list | None = None  # [[logprob, id], ...]
    output_top_logprobs: list | None = None  # per token: [[logprob, id], ...]
    output_token_ids_logprobs: list | None = None  # per token: [[logprob, id], ...] of the asked
    input_token_logprobs: list | None = None
    input_top_logprobs: list | None = None
    e2e_latency: float | None = None  # scheduler-side, in the last message
    first_token_latency: float | None = None
    embedding: list[float] | None = None  # an embedding request's pooled vector, when finished


class Sampling(msgspec.Struct, frozen=True):
    """Sampling parameters as the scheduler uses them: validated once, in the tokenizer manager
    (``sampling.params.parse_sampling``), and trusted from then on. The constraint is normalised
    to one ``(kind, spec)``: ``("regex", pattern)``, ``("json_schema", schema text)`` or
    ``("choices", JSON list)`` or ``("ebnf", grammar)``."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = []
    stop_token_ids: list[int] = []
    stop_regex: list[str] = []  # SGLang's: stop when one matches the output's recent text
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    logit_bias: dict[int, float] = {}  # token id -> added to its logit (OpenAI's logit_bias)
    constraint: tuple[str, str] | None = None
    speculative: bool = True  # False: never draft for this request (--speculative-algorithm)
    # SGLang's: a client's CustomLogitProcessor.to_str() and its per-request arguments
    custom_logit_processor: str | None = None
    custom_params: dict[str, Any] | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


class GenerateReq(msgspec.Struct, tag=True):
    rid: str
    input_ids: list[int]
    sampling: Sampling
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    cache_salt: str | None = None
    priority: int = 0
    lora_name: str | None = None  # a registered LoRA adapter; None: the base model
    pooling: str | None = None  # an embedding request ("last" | "mean"; prefill only)
    normalize: bool = True  # an embedding request's vector divided by its L2 norm
    token_ids_logprob: list[int] | None = None  # ids whose logprobs each output token reports


class AbortReq(msgspec.Struct, tag=True):
    rid: str


class ControlReq(msgspec.Struct, tag=True):
    """flush_cache | flush_disk_cache | pin_prefix | load_lora_adapter | unload_lora_adapter |
    stats | ping: answered by a ControlOut with the same ``cid``. ``data``: the arguments of
    ``pin_prefix`` (``input_ids``, ``cache_salt``) and of the LoRA ones (``lora_name``,
    ``lora_path``)."""

    cid: str
    kind: str
    data: dict[str, Any] | None = None


class TokenOut(msgspec.Struct, tag=True):
    """New output token ids of one request (scheduler -> detokenizer)."""

    rid: str
    new_ids: list[int]
    finish: Finish | None
    meta: OutMeta
    skip_special_tokens: bool = True
    stop: list[str] = []
    no_stop_trim: bool = False
    stream: bool = False


class TextOut(msgspec.Struct, tag=True):
    """New text and ids of one request (detokenizer -> tokenizer manager)."""

    rid: str
    text: str
    new_ids: list[int]
    finish: Finish | None
    meta: OutMeta


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
