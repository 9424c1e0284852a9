"""The ingress side of the Ray Serve deployment: ``TokenizerManager``'s interface over a handle.

``RayBackend`` stands in for ``launcher.Backend`` and ``RayManager`` for ``TokenizerManager``, so
the server's routes, ``Runtime`` and ``create_app`` serve through Ray unchanged (as
``distributed/data_parallel.py`` does for ``--dp-size``). Prompts are tokenised here once; the
request router routes them on their token ids; the replica's own manager validates and runs them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle

from radixlm.deploy.ray_router import Target
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.distributed.data_parallel import merge_stats
from radixlm.runtime.io_struct import SingleRequest
from radixlm.runtime.messages import ControlOut
from radixlm.runtime.tokenizer_manager import (
    EngineDeadError,
    QueueFullError,
    RidInFlightError,
    SchedulerTimeoutError,
    last_response,
    tokenize,
)

REPLICA_GONE = (RayActorError, ActorUnavailableError, ReplicaUnavailableError)
MAX_ATTEMPTS = 3  # a request whose replica died before any output is sent again, this often


@dataclass
class RayBackend:
    """The replicas as the server sees them: Ray Serve starts, watches and restarts them."""

    args: ServerArgs
    handle: DeploymentHandle
    info: dict
    watched = False  # NOTE: each replica runs its own watchdog; Ray restarts unhealthy ones

    def manager(self, tokenizer) -> RayManager:
        return RayManager(self.args, self.handle, tokenizer, self.info)

    def dead_reason(self) -> str | None:
        return None

    def shutdown(self, timeout: float = 5.0) -> None:
        """Nothing to stop: the replicas belong to Ray Serve."""


@dataclass
class _Call:
    req: SingleRequest
    stream: Any = None  # the DeploymentResponseGenerator of the current attempt
    replica: str | None = None
    created: float = field(default_factory=time.monotonic)


class RayManager:
    def __init__(self, args: ServerArgs, handle: DeploymentHandle, tokenizer, info: dict) -> None:
        self.args = args
        self.handle = handle
        self.tokenizer = tokenizer
        self.info = info
        self.context_len: int = info["context_len"]
        self.states: dict[str, _Call] = {}
        self.dead: str | None = None
        self.is_full = False  # NOTE: Ray's max_queued_requests answers BackPressureError (429)
        self.on_timing: Callable[[str, float], None] | None = None

    def start(self) -> None:
        """Nothing to receive: outputs stream back through the handle."""

    # -- requests ----------------------------------------------------------------------------

    async def generate(self, req: SingleRequest) -> AsyncIterator[dict[str, Any]]:
        """The replica's responses; a replica that dies before sending any output is replaced
        by another (Ray restarts it meanwhile)."""
        if self.dead:
            raise EngineDeadError(self.dead)
        req = await tokenize(self.tokenizer, req)
        if req.rid in self.states:
            raise RidInFlightError(f"rid {req.rid!r} is already in flight")
        call = self.states[req.rid] = _Call(req)
        try:
            for attempt in range(1, MAX_ATTEMPTS + 1):
                sent = False
                try:
                    async for out in self._attempt(call):
                        sent = True
                        yield out
                    return
                except REPLICA_GONE:
                    if sent or attempt == MAX_ATTEMPTS:
                        raise EngineDeadError("the replica serving this request died") from None
        finally:
            self.states.pop(req.rid, None)
            if call.stream is not None:
                call.stream.cancel()  # NOTE: the replica's generator closes and aborts it

    async def _attempt(self, call: _Call) -> AsyncIterator[dict[str, Any]]:
        call.stream = self.handle.options(stream=True).generate.remote(call.req)
        try:
            async for out in call.stream:
                if "meta_info" not in out:  # NOTE: the replica names itself first
                    call.replica = out["replica"]
                    continue
                self._observe(call, out)
                yield out
            call.stream = None
        except RayTaskError as e:
            raise _unwrap(e) from None
        except BackPressureError as e:
            raise QueueFullError(f"every replica's queue is full: {e}") from None

    def _observe(self, call: _Call, out: dict[str, Any]) -> None:
        if self.on_timing is None or out["meta_info"].get("finish_reason") is None:
            return
        meta = out["meta_info"]
        if meta.get("first_token_latency") is not None:
            self.on_timing("ttft", meta["first_token_latency"])
        self.on_timing("e2e", time.monotonic() - call.created)

    async def generate_one(self, req: SingleRequest) -> dict[str, Any]:
        return await last_response(self.generate(req))

    def abort(self, rid: str) -> list[str]:
        hits = [c for c in self.states.values() if rid in (c.req.rid, c.req.group)]
        for call in hits:
            if call.replica is not None:
                self.handle.abort.remote(Target(replica=call.replica), call.req.rid)
            elif call.stream is not None:
                call.stream.cancel()
        return [c.req.rid for c in hits]

    async def control(
        self, kind: str, timeout: float = 30.0, data: dict[str, Any] | None = None
    ) -> ControlOut:
        """Ask every replica (one call each, then one more that finds no new replica); stats
        are summed, with each replica's own under ``replicas``."""
        answers: dict[str, ControlOut] = {}
        deadline = time.monotonic() + timeout
        while True:
            target = Target(exclude=frozenset(answers))
            left = max(0.1, deadline - time.monotonic())
            try:
                replica, out = await asyncio.wait_for(
                    self.handle.control.remote(target, kind, left, data), left
                )
            except asyncio.TimeoutError:
                raise SchedulerTimeoutError(
                    f"the replicas did not answer {kind!r} within {timeout:.0f} s"
                ) from None
            except RayTaskError as e:
                raise _unwrap(e) from None
            if replica in answers:
                break
            answers[replica] = out
        return _merged(kind, answers)

    # -- lifecycle ---------------------------------------------------------------------------

    def fail_all(self, reason: str) -> None:
        self.dead = reason
        for call in self.states.values():
            if call.stream is not None:
                call.stream.cancel()

    def close(self) -> None:
        self.fail_all("the server is shutting down")


def _merged(kind: str, answers: dict[str, ControlOut]) -> ControlOut:
    outs = list(answers.values())
    ok = all(out.ok for out in outs)
    if kind != "stats":
        return ControlOut(outs[0].cid, ok, next((o.data for o in outs if not o.ok), outs[0].data))
    parts = [out.data for out in outs]
    replicas = [{"replica": key, **out.data} for key, out in answers.items()]
    return ControlOut(outs[0].cid, ok, {**merge_stats(parts), "replicas": replicas})


def _unwrap(error: RayTaskError) -> BaseException:
    """The replica's own exception (a ValueError stays a 400), without Ray's traceback text."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, Exception) else error
