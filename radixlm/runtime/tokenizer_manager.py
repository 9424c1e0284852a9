"""The front of the runtime: tokenises, sends requests to the scheduler, gathers their outputs.

Runs on an asyncio loop (the server's, or the Engine's background thread). Holds no model
state; everything it knows about a request arrives as TextOut messages.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from radixlm.runtime import ipc
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.io_struct import SingleRequest, check_pooling
from radixlm.runtime.messages import (
    AbortReq,
    Batch,
    ControlOut,
    ControlReq,
    Finish,
    FinishKind,
    GenerateReq,
    OutMeta,
    TextOut,
)
from radixlm.runtime.sampling.params import INT32_MAX, parse_sampling

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """More requests in flight than ``max_running_requests + max_queued_requests``."""


class EngineDeadError(RuntimeError):
    """The scheduler or detokenizer process is gone."""


class SchedulerTimeoutError(RuntimeError):
    """A control request got no answer in time (the scheduler is busy or hung)."""


class RidInFlightError(RuntimeError):
    """A request with this rid is still running (a finished rid may be reused)."""


@dataclass
class _ReqState:
    req: SingleRequest
    prompt_ids: list[int]
    key: str  # NOTE: the rid on the wire: unique per request, so a reused rid never gets the
    # outputs (or the abort) of the request that had it before
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finish: Finish | None = None
    meta: OutMeta | None = None  # the last message's, with the logprob lists of all of them
    created: float = field(default_factory=time.monotonic)
    last_token_at: float | None = None


THREAD_TOKENIZE_CHARS = 20_000  # longer texts are tokenised off the event loop


def check_text(field: str, text: str) -> None:
    """ValueError naming ``field`` when ``text`` cannot be encoded (a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{field} is not valid Unicode: a lone surrogate {text[e.start]!r} at character "
            f"{e.start}"
        ) from None




async def last_response(responses: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    """The last of a request's responses: the finished one."""
    last = None
    async for last in responses:  # noqa: B007
        pass
    return last


async def tokenize(tokenizer, req: SingleRequest) -> SingleRequest:
    """``req`` with its text tokenised; long texts on a worker thread, so that one huge
    prompt does not stall every other client on the event loop."""
    if req.text is None or tokenizer is None:
        return req
    check_text("text", req.text)
    if len(req.text) < THREAD_TOKENIZE_CHARS:
        return dataclasses.replace(req, input_ids=tokenizer.encode(req.text))
    ids = await asyncio.get_running_loop().run_in_executor(None, tokenizer.encode, req.text)
    return dataclasses.replace(req, input_ids=ids)


def _merge_meta(before: OutMeta | None, new: OutMeta) -> OutMeta:
    """``new`` with the output logprob lists of ``before`` in front, and the prompt's kept."""
    if before is None:
        return new
    for key in ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs"):
        old = getattr(before, key)
        if old is not None:
            old.extend(getattr(new, key) or [])  # NOTE: in place: a long stream stays linear
            setattr(new, key, old)
    for key in ("input_token_logprobs", "input_top_logprobs"):
        if getattr(new, key) is None:
            setattr(new, key, getattr(before, key))
    return new


class TokenizerManager:
    def __init__(self, args: ServerArgs, ports: ipc.PortArgs, tokenizer, info: dict) -> None:
        self.args = args
        self.tokenizer = tokenizer
        self.info = info
        self.context_len: int = info["context_len"]
        # NOTE: the LoRA adapters served, name -> directory; None: LoRA is off
        self.loras: dict[str, str] | None = info.get("lora_adapters")
        self.ctx = zmq.asyncio.Context()
        self.to_scheduler = self.ctx.socket(zmq.PUSH)
        self.to_scheduler.setsockopt(zmq.LINGER, 0)
        self.to_scheduler.connect(ports.scheduler)
        self.from_detok = self.ctx.socket(zmq.PULL)
        self.from_detok.bind(ports.tokenizer)
        self.states: dict[str, _ReqState] = {}  # by the client's rid
        self._by_key: dict[str, _ReqState] = {}
        self._keys = itertools.count()
        self.controls: dict[str, asyncio.Future] = {}
        self.dead: str | None = None
        self.on_timing: Callable[[str, float], None] | None = None  # (ttft|itl|e2e, seconds)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Start receiving outputs (call from the loop that will serve requests)."""
        self._task = asyncio.get_running_loop().create_task(self._recv_loop())

    # -- requests ----------------------------------------------------------------------------

    async def tokenize(self, req: SingleRequest) -> SingleRequest:
        return await tokenize(self.tokenizer, req)

    def prepare(self, req: SingleRequest) -> GenerateReq:
        """Tokenise and validate; raises ValueError naming the problem."""
        if self.tokenizer is None and req.text is not None:
            raise ValueError(
                "text is unavailable with skip_tokenizer_init (no tokenizer is loaded): pass "
                "input_ids"
            )
        params = parse_sampling(req.sampling, has_tokenizer=self.tokenizer is not None)
        custom = params.custom_logit_processor is not None
        if custom and not self.args.enable_custom_logit_processor:
            raise ValueError("custom_logit_processor is off: the server runs a client's processor "
                             "only when started with --enable-custom-logit-processor")
        for i, stop in enumerate(params.stop):
            check_text(f"stop[{i}]", stop)
        if req.input_ids is None:
            check_text("text", req.text)
        ids = req.input_ids if req.input_ids is not None else self.tokenizer.encode(req.text)
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.info["vocab_size"]
        bad = next((t for t in ids if t < 0 or t >= vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token ids (input_ids) must be in [0, {vocab}), got {bad}")
        bad = next((t for t in params.logit_bias if t >= vocab), None)
        if bad is not None:
            raise ValueError(f"logit_bias keys must be token ids in [0, {vocab}), got {bad}")
        if req.pooling is None and self.args.is_embedding:
            raise ValueError("this engine was started with is_embedding (--is-embedding): it "
                             "serves embeddings (/v1/embeddings, /encode), not generation")
        if req.pooling is not None:
            check_pooling(req.pooling)
            if not isinstance(req.normalize, bool):
                raise ValueError(f"normalize must be true or false, got {req.normalize!r}")
            if len(ids) >= self.context_len:
                raise ValueError(
                    "Requested token count exceeds the model's maximum context length: the "
                    f"input has {len(ids)} tokens; at most {self.context_len - 1} fit"
                )
            params = msgspec.structs.replace(params, max_new_tokens=0)  # NOTE: prefill only
        # NOTE: an implicit max_new_tokens is clamped to the room left; an explicit one must fit
        wanted = params.max_new_tokens if "max_new_tokens" in req.sampling else 1
        if wanted > self.context_len:
            # NOTE: SGLang's words, both its releases' (clients tell it from a prompt overflow)
            raise ValueError(
                f"max_new_tokens is too large: {wanted}. This model supports at most "
                f"{self.context_len} completion tokens. Requested token count exceeds the "
                f"model's maximum context length ({self.context_len} tokens)"
            )
        if len(ids) + wanted > self.context_len:
            # NOTE: with the phrases clients match on (SGLang's "Requested token count exceeds
            # the model's maximum context", vLLM's "maximum context length is", SGLang's
            # "longer than the model's context length"), and our numbers
            raise ValueError(
                "Requested token count exceeds the model's maximum context length: this "
                f"model's maximum context length is {self.context_len} tokens, but "
                f"{len(ids) + wanted} were requested ({len(ids)} in the prompt, {wanted} in "
                f"max_new_tokens): the input is longer than the model's context length"
            )
        sampling = msgspec.structs.replace(
            params, max_new_tokens=min(params.max_new_tokens, self.context_len - len(ids))
        )
        start = req.logprob_start_len
        if not isinstance(start, int) or not -1 <= start <= INT32_MAX:
            raise ValueError(f"logprob_start_len must be -1 or a prompt position, got {start!r}")
        if req.return_logprob and start >= len(ids):
            raise ValueError(
                f"logprob_start_len ({start}) must be < the prompt length ({len(ids)})"
            )
        if req.top_logprobs_num < 0 or req.top_logprobs_num > 20:
            raise ValueError(f"top_logprobs_num must be in [0, 20], got {req.top_logprobs_num}")
        salt = req.cache_salt
        if salt is not None and (not isinstance(salt, str) or not 0 < len(salt) <= 256):
            raise ValueError("cache_salt must be a string of 1 to 256 characters")
        priority = req.priority
        if not isinstance(priority, int) or not -INT32_MAX - 1 <= priority <= INT32_MAX:
            raise ValueError(f"priority must be a 32-bit integer, got {priority!r}")
        if priority and self.args.schedule_policy != "priority":
            # NOTE: as vLLM: a priority that would be silently ignored is refused
            raise ValueError(
                f"priority is set but the schedule policy is {self.args.schedule_policy!r}: "
                "start the server with --schedule-policy priority"
            )
        self.check_lora(req.lora_name)
        asked = req.token_ids_logprob
        bad = next((t for t in asked or () if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"token_ids_logprob: token id {bad} is out-of-vocabulary (the "
                             f"vocabulary has {vocab} ids)")  # fmt: skip
        return GenerateReq(
            req.rid,
            list(ids),
            sampling,
            req.stream,
            req.return_logprob,
            start,
            req.top_logprobs_num,
            salt,
            priority,
            req.lora_name,
            req.pooling,
            req.normalize,
            list(asked) if asked and req.return_logprob else None,
        )

    def check_lora(self, name: str | None) -> None:
        """ValueError unless ``name`` (when given) is a loaded LoRA adapter."""
        if name is None:
            return
        if self.loras is None:
            raise ValueError(f"lora_path {name!r}: this server serves no LoRA adapters (start "
                             "it with --lora-paths or --enable-lora)")  # fmt: skip
        if not isinstance(name, str) or name not in self.loras:
            raise ValueError(f"lora_path {name!r} is not a loaded LoRA adapter (loaded: "
                             f"{sorted(self.loras)})")  # fmt: skip

    async def load_lora(self, name: str, path: str) -> None:
        """Register an adapter with the scheduler; ValueError naming what is wrong."""
        await self._lora_control("load_lora_adapter", {"lora_name": name, "lora_path": path})

    async def unload_lora(self, name: str) -> None:
        await self._lora_control("unload_lora_adapter", {"lora_name": name})

    async def _lora_control(self, kind: str, data: dict) -> None:
        # NOTE: reading an adapter takes the scheduler's time between two steps only
        out = await self.control(kind, data=data)
        if not out.ok:
            raise ValueError(out.data.get("message", f"{kind} failed"))
        self.loras = dict(out.data["lora_adapters"])

    async def generate(self, req: SingleRequest) -> AsyncIterator[dict[str, Any]]:
        """Yield the response so far after each update (``text`` cumulative); the last one has a
        ``finish_reason``. Closing the iterator early aborts the request."""
        msg = self.prepare(await self.tokenize(req))
        self._check_capacity()
        if req.rid in self.states:
            raise RidInFlightError(f"rid {req.rid!r} is already in flight")
        msg.rid = f"{req.rid}#{next(self._keys)}"
        state = _ReqState(req, msg.input_ids, msg.rid)
        sent = finished = False
        # NOTE: one finally releases the state on every path (finish, abort, encoder error,
        # scheduler error, client gone); nothing before it can leave a state behind.
        self.states[req.rid] = self._by_key[msg.rid] = state
        try:
            ipc.send(self.to_scheduler, msg)
            sent = True
            while not finished:
                out = await state.queue.get()
                if isinstance(out, Exception):
                    raise out
                finished = self._apply(state, out)
                if finished and state.finish.is_error:
                    raise ValueError(state.finish.message)
                if req.stream or finished:
                    yield self._response(state)
        finally:
            self.states.pop(req.rid, None)
            self._by_key.pop(msg.rid, None)
            if sent and not finished and not self.dead:
                ipc.send(self.to_scheduler, AbortReq(msg.rid))

    async def generate_one(self, req: SingleRequest) -> dict[str, Any]:
        return await last_response(self.generate(req))

    def abort(self, rid: str) -> list[str]:
        """Abort the request ``rid`` in flight, or the samples of the ``n`` request ``rid``
        (exact ids, never prefixes); returns the rids aborted."""
        hits = [s for s in self.states.values() if rid in (s.req.rid, s.req.group)]
        for state in hits:
            ipc.send(self.to_scheduler, AbortReq(state.key))
        return [s.req.rid for s in hits]

    async def control(
        self, kind: str, timeout: float = 30.0, data: dict[str, Any] | None = None
    ) -> ControlOut:
        if self.dead:
            raise EngineDeadError(self.dead)
        cid = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self.controls[cid] = fut
        ipc.send(self.to_scheduler, ControlReq(cid, kind, data))
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise SchedulerTimeoutError(
                f"the scheduler did not answer {kind!r} within {timeout:.0f} s"
            ) from None
        finally:
            self.controls.pop(cid, None)

    @property
    def is_full(self) -> bool:
        """No room for another request (``max_running_requests + max_queued_requests``)."""
        limit = self.args.max_queued_requests
        return limit is not None and len(self.states) >= self.args.max_running_requests + limit

    def _check_capacity(self) -> None:
        if self.dead:
            raise EngineDeadError(self.dead)
        if self.is_full:
            raise QueueFullError(
                f"too many requests in flight ({len(self.states)}); try again later"
            )

    # -- outputs -----------------------------------------------------------------------------

    async def _recv_loop(self) -> None:
        while True:
            msg = ipc.messages.decode(await self.from_detok.recv())
            for item in msg.items if isinstance(msg, Batch) else [msg]:
                if isinstance(item, TextOut):
                    state = self._by_key.get(item.rid)
                    if state is not None:
                        state.queue.put_nowait(item)
                elif isinstance(item, ControlOut) and item.cid in self.controls:
                    self.controls[item.cid].set_result(item)

    def fail_all(self, reason: str) -> None:
        """The backend died: every waiting caller gets an error instead of hanging."""
        self.dead = reason
        for state in self.states.values():
            state.queue.put_nowait(EngineDeadError(reason))
        for fut in self.controls.values():
            if not fut.done():
                fut.set_exception(EngineDeadError(reason))

    def _apply(self, state: _ReqState, out: TextOut) -> bool:
        state.text += out.text
        state.output_ids.extend(out.new_ids)
        if self.on_timing is not None:
            self._observe_timing(state, out)
        state.meta = _merge_meta(state.meta, out.meta)
        state.finish = out.finish
        return out.finish is not None

    def _observe_timing(self, state: _ReqState, out: TextOut) -> None:
        now = time.monotonic()
        if out.new_ids and state.last_token_at is None and out.meta.first_token_latency is not None:
            self._observe_whole(state, out, now)
        elif out.new_ids:
            first = state.last_token_at is None
            since = state.created if first else state.last_token_at
            self.on_timing("ttft" if first else "itl", now - since)
            state.last_token_at = now
        if out.finish is not None and out.finish.kind is not FinishKind.ABORT:
            self.on_timing("e2e", now - state.created)

    def _observe_whole(self, state: _ReqState, out: TextOut, now: float) -> None:
        """A non-streaming request's tokens arrive at once: its first-token time comes from the
        scheduler, and each later token counts the mean inter-token gap."""
        ttft = min(out.meta.first_token_latency, now - state.created)
        self.on_timing("ttft", ttft)
        gaps = len(out.new_ids) - 1
        for _ in range(gaps):
            self.on_timing("itl", (now - state.created - ttft) / gaps)
        state.last_token_at = now

    def _response(self, state: _ReqState) -> dict[str, Any]:
        got = state.meta
        meta: dict[str, Any] = {
            "id": state.req.rid,
            "finish_reason": state.finish.to_json() if state.finish else None,
            "prompt_tokens": got.prompt_tokens if got else len(state.prompt_ids),
            "completion_tokens": len(state.output_ids),
            "cached_tokens": got.cached_tokens if got else 0,
        }
        for key in ("e2e_latency", "first_token_latency"):
            if getattr(got, key, None) is not None:
                meta[key] = getattr(got, key)
        if state.req.return_logprob:
            with_text = state.req.return_text_in_logprobs
            for key in ("input_token_logprobs", "output_token_logprobs"):
                meta[key] = self._with_text(getattr(got, key, None) or [], with_text)
            for key in ("input_top_logprobs", "output_top_logprobs", "output_token_ids_logprobs"):
                rows = getattr(got, key, None)
                if rows is not None:
                    meta[key] = [self._with_text(row, with_text) if row else row for row in rows]
        out = {"text": state.text, "output_ids": list(state.output_ids), "meta_info": meta}
        if got is not None and got.embedding is not None:
            out["embedding"] = got.embedding
        return out

    def _with_text(self, entries: list, with_text: bool) -> list:
        return [
            [lp, tid, self.tokenizer.decode([tid]) if with_text and self.tokenizer else None]
            for lp, tid, *_ in entries
        ]

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.to_scheduler.close(0)
        self.from_detok.close(0)
        self.ctx.term()
