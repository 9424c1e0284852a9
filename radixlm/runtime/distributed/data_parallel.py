"""Data parallelism: ``dp_size`` independent replicas behind a router in the front process.

Each replica is a whole runtime backend (its scheduler ranks and detokenizer, its own sockets).
``ReplicaSet`` stands in for one ``launcher.Backend`` and ``DataParallelManager`` for one
``TokenizerManager``, so the Runtime, the Engine and the server use them unchanged.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixlm.runtime import threads
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.distributed.router import Router
from radixlm.runtime.io_struct import SingleRequest
from radixlm.runtime.launcher import Backend, launch
from radixlm.runtime.messages import ControlOut, GenerateReq
from radixlm.runtime.tokenizer_manager import (
    RidInFlightError,
    TokenizerManager,
    last_response,
)


class ReplicaSet:
    """The running processes of every replica, with ``launcher.Backend``'s interface."""

    def __init__(self, args: ServerArgs, replicas: list[Backend]) -> None:
        self.args = args
        self.replicas = replicas
        self.info = {**replicas[0].info, "dp_size": len(replicas)}

    watched = True

    def manager(self, tokenizer) -> DataParallelManager:
        return DataParallelManager(self.args, self, tokenizer)

    def dead_reason(self) -> str | None:
        for i, backend in enumerate(self.replicas):
            reason = backend.dead_reason()
            if reason:
                return f"replica {i}: {reason}"
        return None

    def shutdown(self, timeout: float = 5.0) -> None:
        with ThreadPoolExecutor(len(self.replicas)) as pool:
            list(pool.map(lambda b: b.shutdown(timeout), self.replicas))


def launch_replicas(args: ServerArgs) -> ReplicaSet:
    """Start ``args.dp_size`` replicas side by side (replica i on GPUs from ``i * tp_size``);
    by default they share the CPU cores."""
    per_rank = threads.compute_threads(args.num_threads, args.dp_size * args.tp_size)
    one = args.replace(dp_size=1, num_threads=per_rank)
    with ThreadPoolExecutor(args.dp_size) as pool:
        futures = [pool.submit(launch, one, i * args.tp_size) for i in range(args.dp_size)]
    started = [f.result() for f in futures if f.exception() is None]
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for backend in started:
            backend.shutdown()
        raise failed[0]
    return ReplicaSet(args, started)


class DataParallelManager:
    """The ``TokenizerManager`` interface over one manager per replica, with a router in front.

    Prompts are tokenised once, routed on their token ids, and handed to the chosen replica's
    manager (responses name it in ``meta_info["replica"]``); ``control`` asks every replica
    and merges the answers (``stats`` keeps each replica's own numbers, with the router's,
    under ``replicas``).
    """

    def __init__(self, args: ServerArgs, replicas: ReplicaSet, tokenizer) -> None:
        self.args = args
        self.tokenizer = tokenizer
        self.info = replicas.info
        self.managers = [
            TokenizerManager(args, b.ports, tokenizer, b.info) for b in replicas.replicas
        ]
        self.context_len = self.managers[0].context_len
        self.router = Router(len(self.managers), args.load_balance_method)
        self.owner: dict[str, int] = {}

    def start(self) -> None:
        for manager in self.managers:
            manager.start()

    @property
    def dead(self) -> str | None:
        return next((m.dead for m in self.managers if m.dead), None)

    @property
    def is_full(self) -> bool:
        """No replica has room for another request."""
        return all(m.is_full for m in self.managers)

    @property
    def states(self) -> dict[str, Any]:
        return {rid: s for m in self.managers for rid, s in m.states.items()}

    @property
    def on_timing(self) -> Callable[[str, float], None] | None:
        return self.managers[0].on_timing

    @on_timing.setter
    def on_timing(self, callback: Callable[[str, float], None] | None) -> None:
        for manager in self.managers:
            manager.on_timing = callback

    # -- requests ----------------------------------------------------------------------------

    def prepare(self, req: SingleRequest) -> GenerateReq:
        return self.managers[0].prepare(req)

    async def generate(self, req: SingleRequest) -> AsyncIterator[dict[str, Any]]:
        """``TokenizerManager.generate`` on the replica the router picks."""
        msg = self.prepare(await self.managers[0].tokenize(req))
        if req.rid in self.owner:
            raise RidInFlightError(f"rid {req.rid!r} is already in flight")
        replica = self.router.route(msg.input_ids)
        self.owner[req.rid] = replica
        try:
            routed = dataclasses.replace(req, input_ids=msg.input_ids)
            async for out in self.managers[replica].generate(routed):
                out["meta_info"]["replica"] = replica
                yield out
        finally:
            self.owner.pop(req.rid, None)
            self.router.done(replica)

    async def generate_one(self, req: SingleRequest) -> dict[str, Any]:
        return await last_response(self.generate(req))

    def abort(self, rid: str) -> list[str]:
        return [r for manager in self.managers for r in manager.abort(rid)]

    async def control(
        self, kind: str, timeout: float = 30.0, data: dict[str, Any] | None = None
    ) -> ControlOut:
        outs = await asyncio.gather(*(m.control(kind, timeout, data) for m in self.managers))
        ok = all(out.ok for out in outs)
        if kind == "stats":
            data = self._merged_stats([out.data for out in outs])
        else:
            data = next((out.data for out in outs if not out.ok), outs[0].data)
        return ControlOut(outs[0].cid, ok, data)

    def _merged_stats(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        replicas = [
            {"replica": i, **part, "router": self.router.stats(i)} for i, part in enumerate(parts)
        ]
        router = {"policy": self.router.policy, "decisions": dict(self.router.decisions)}
        return {**merge_stats(parts), "replicas": replicas, "router": router}

    # -- lifecycle ---------------------------------------------------------------------------

    def fail_all(self, reason: str) -> None:
        for manager in self.managers:
            manager.fail_all(reason)

    def close(self) -> None:
        for manager in self.managers:
            manager.close()


def merge_stats(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum the replicas' counters; recompute the ratios; a flag holds only if it holds on all."""
    out: dict[str, Any] = {}
    for key in parts[0]:
        values = [part.get(key) for part in parts]
        if all(v is None or isinstance(v, bool) for v in values):
            out[key] = False if False in values else (None if None in values else True)
        elif all(isinstance(v, (int, float)) for v in values):
            out[key] = sum(values)
        elif all(isinstance(v, dict) for v in values):
            out[key] = dict(sum((Counter(v) for v in values), Counter()))
        else:
            out[key] = values[0]
    if out.get("queried_tokens"):
        out["cache_hit_rate"] = out["hit_tokens"] / out["queried_tokens"]
    if out.get("max_total_tokens"):
        used = out["max_total_tokens"] - out["free_tokens"] - out["evictable_tokens"]
        out["kv_usage"] = used / out["max_total_tokens"]
    return out
