"""A request as the scheduler sees it: a few stored fields, the rest derived."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.messages import Finish, Sampling


@dataclass
class LogprobState:
    """Logprob options and what has been collected so far."""

    start_len: int = -1  # first prompt position to report; -1 = output tokens only
    top_n: int = 0
    # logits position q -> (logprob of prompt token q + 1, its top alternatives or None); the
    # alternatives may be more than top_n (what the cache keeps), reported cut to top_n
    prompt: dict[int, tuple[float, list[tuple[float, int]] | None]] = field(default_factory=dict)
    fresh: list[int] = field(default_factory=list)  # positions of ``prompt`` the model computed
    prompt_sent: bool = False
    output: list[float] = field(default_factory=list)
    output_top: list[list[tuple[float, int]]] = field(default_factory=list)
    token_ids: list[int] | None = None  # ids whose logprobs each output token reports
    output_ids: list[list[tuple[float, int]]] = field(default_factory=list)


def salt_offset(cache_salt: str | None, lora_key: str | None = None) -> int:
    """What a ``cache_salt`` adds to every token id of a tree key: a multiple of 2**32 (token
    ids are below it) from a 30-bit hash of the salt, so that salted keys still fit the int64
    the wire, the KV events and the disk tier carry them in. A LoRA adapter's key is part of
    the salt: KV computed under one adapter is never reused under another or the base."""
    if cache_salt is None and lora_key is None:
        return 0
    text = cache_salt or ""
    if lora_key is not None:
        text = f"{text}\x1elora\x1e{lora_key}"
    h = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    return ((int.from_bytes(h, "little") & (2**30 - 1)) + 1) << 32


def salted(ids: list[int], salt: int) -> list[int]:
    """The tree key of ``ids`` under a ``salt_offset``."""
    return [t + salt for t in ids] if salt else ids


@dataclass(eq=False)
class Req:
    """One generation request.

    ``kv_len`` counts the tokens of ``fill_ids`` whose KV is in the pool (matched from the cache
    or computed). A running request always has its newest token left to compute (its logits
    give the next token), so ``remaining >= 1``.
    """

    rid: str
    input_ids: list[int]
    params: Sampling
    logprob: LogprobState | None = None
    stream: bool = False
    output_ids: list[int] = field(default_factory=list)
    kv_len: int = 0
    cached_len: int = 0  # prompt tokens served from the radix cache (reported)
    slot: int | None = None  # row in req_to_token
    node: Any = None  # radix node locked for this request
    tree_len: int = 0  # leading tokens whose slots belong to the radix tree
    sent_len: int = 0  # output tokens already sent to the detokenizer
    finish: Finish | None = None
    grammar: Any = None  # Matcher, or a Future while compiling
    created: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    retractions: int = 0
    salt: int = 0  # see salt_offset: 0 for requests without a cache_salt
    priority: int = 0  # the "priority" policy schedules lower values first
    lora: Any = None  # lora.manager.AdapterRef; None: the base model
    spec: Any = None  # speculative.DraftState once the request has drafted
    pooling: str | None = None  # an embedding request: "last" | "mean" (see pooling.py)
    normalize: bool = True
    pooled: Any = None  # its hidden-state sum ("mean") or last hidden state, as computed

    @property
    def origin_input_ids(self) -> list[int]:
        """SGLang's name of the prompt ids (custom logit processors read it)."""
        return self.input_ids

    @property
    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    def cache_key(self, n: int) -> list[int]:
        """The radix-tree key of ``fill_ids[:n]``: the ids themselves, or shifted past every
        token id by the salt, so that requests of different salts never share a prefix."""
        return salted(self.tokens(0, n), self.salt)

    def tokens(self, start: int, end: int) -> list[int]:
        """``fill_ids[start:end]`` without building ``fill_ids`` (a decode step reads one token)."""
        n = len(self.input_ids)
        if start >= n:
            return self.output_ids[start - n : end - n]
        if end <= n:
            return self.input_ids[start:end]
        return self.input_ids[start:] + self.output_ids[: end - n]

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def remaining(self) -> int:
        """Tokens still to run through the model before the next token can be sampled."""
        return self.seq_len - self.kv_len

    @property
    def is_prefilling(self) -> bool:
        return self.remaining > 1

    @property
    def finished(self) -> bool:
        return self.finish is not None

    @property
    def max_match_len(self) -> int:
        """How much of the prompt may come from the cache: at least one token must be computed
        (prompt logprobs may limit it further: ``CacheManager.logprob_cap``). Mean pooling
        needs every token's hidden state, which the cache does not keep: none."""
        return 0 if self.pooling == "mean" else self.seq_len - 1

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.logprob is not None and self.logprob.start_len >= 0
