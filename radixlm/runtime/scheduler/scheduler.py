"""The scheduler: one step is schedule -> run -> post-process."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.distributed.disk_sync import DiskPeers
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.mem_cache.cache_manager import CacheManager
from radixlm.runtime.mem_cache.disk_tier import DiskTier
from radixlm.runtime.mem_cache.kv_events import KVEventPublisher
from radixlm.runtime.mem_cache.logprob_store import PromptLogprobStore
from radixlm.runtime.mem_cache.memory_pool import SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import RadixCache
from radixlm.runtime.messages import (
    AbortReq,
    ControlOut,
    ControlReq,
    ErrorCode,
    Finish,
    GenerateReq,
    TokenOut,
)
from radixlm.runtime.sampling.sampler import SampleRow, sample
from radixlm.runtime.scheduler import admission
from radixlm.runtime.scheduler.admission import Budget, StepPlan
from radixlm.runtime.scheduler.batch_builder import LogitRows, build_batch
from radixlm.runtime.scheduler.grammar_queue import GrammarQueue
from radixlm.runtime.scheduler.output import StopChecker, record_prompt_logprobs, token_out
from radixlm.runtime.scheduler.policy import get_policy
from radixlm.runtime.scheduler.pooling import pool_chunks
from radixlm.runtime.scheduler.req import LogprobState, Req, salt_offset, salted
from radixlm.runtime.scheduler.speculative import Speculator
from radixlm.runtime.scheduler.stats import SchedulerStats

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, args: ServerArgs, runner: ModelRunner | None = None) -> None:
        self.args = args
        self.runner = runner or ModelRunner(args)
        self.kv_events = None
        if args.kv_events_endpoint and not args.disable_radix_cache:
            self.kv_events = KVEventPublisher(args.kv_events_endpoint, args.kv_events_block_size)
        tree = None if args.disable_radix_cache else RadixCache(args.page_size, self.kv_events)
        allocator = SlotAllocator(self.runner.max_total_tokens)
        disk = None
        if tree is not None and args.kv_disk_cache is not None:
            disk = DiskTier.open(args, self.runner.model_path, self.runner.kv_pool)
            if self.runner.tp is not None:
                disk.peers = DiskPeers(self.runner.tp)
        logprobs = None
        if tree is not None:
            logprobs = PromptLogprobStore(allocator.size, args.cached_top_logprobs)
        self.cache = CacheManager(self.runner.req_pool, allocator, tree, disk, logprobs)
        self.policy = get_policy(args.schedule_policy)
        self.stop = StopChecker(
            self.runner.tokenizer, self.runner.config.eos_token_ids, self.runner.context_len
        )
        self.grammars = GrammarQueue(args, self.runner)
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.stats = SchedulerStats()
        self.spec = None
        if args.speculative_algorithm == "ngram":
            self.spec = Speculator(
                args.speculative_num_draft_tokens, args.spec_ngram_max, args.spec_ngram_min
            )
        self.outbox: list[TokenOut] = []

    # -- requests in -------------------------------------------------------------------------

    def handle(self, msg: Any) -> ControlOut | None:
        if isinstance(msg, GenerateReq):
            self.add_request(msg)
        elif isinstance(msg, AbortReq):
            self.abort(msg.rid)
        elif isinstance(msg, ControlReq):
            return self.control(msg)
        return None

    def add_request(self, msg: GenerateReq) -> None:
        # NOTE: the tokenizer manager validated the parameters; nothing is parsed again here
        lora = self._adapter(msg.lora_name)
        req = Req(msg.rid, list(msg.input_ids), msg.sampling, stream=msg.stream,
                  salt=salt_offset(msg.cache_salt, lora.key if lora else None),
                  priority=msg.priority, lora=lora, pooling=msg.pooling,
                  normalize=msg.normalize)  # fmt: skip
        if msg.return_logprob:
            req.logprob = LogprobState(msg.logprob_start_len, msg.top_logprobs_num,
                                       token_ids=msg.token_ids_logprob)  # fmt: skip
        if msg.lora_name is not None and lora is None:
            self._finish_now(req, ErrorCode.INVALID_REQUEST,
                             f"LoRA adapter {msg.lora_name!r} is not loaded")  # fmt: skip
        elif not req.input_ids or len(req.input_ids) >= self.runner.context_len:
            self._finish_now(
                req,
                ErrorCode.INVALID_REQUEST,
                f"prompt has {len(req.input_ids)} tokens; the context length "
                f"is {self.runner.context_len}",
            )
        elif self.grammars.needs(req):
            self.grammars.add(req)
        else:
            self.waiting.append(req)

    def _adapter(self, name: str | None):
        lora = self.runner.lora
        return None if name is None or lora is None else lora.registry.get(name)

    def abort(self, rid: str) -> None:
        for queue in (self.waiting, self.grammars.pending):
            for req in [r for r in queue if r.rid == rid]:
                queue.remove(req)
                self._finish_now(req, ErrorCode.ABORTED, "aborted")
        for req in [r for r in self.running if r.rid == rid]:
            self.running.remove(req)
            self.cache.release(req)
            self._finish_now(req, ErrorCode.ABORTED, "aborted")

    def _finish_now(self, req: Req, code: ErrorCode, message: str) -> None:
        req.finish = Finish.abort(code, message)
        self.stats.finished(req)
        self.outbox.append(token_out(req))

    def control(self, msg: ControlReq) -> ControlOut:
        handler = _CONTROLS.get(msg.kind)
        if handler is None:
            return ControlOut(msg.cid, False, {"message": f"unknown control request {msg.kind!r}"})
        ok, data = handler(self, msg.data or {})
        return ControlOut(msg.cid, ok, data)

    def _flush_memory(self, _: dict) -> tuple[bool, dict]:
        if self.running or self.waiting:
            return False, {"message": "cannot flush while requests run"}
        self.cache.flush()
        return True, {}

    def _flush_disk(self, _: dict) -> tuple[bool, dict]:
        if self.cache.disk is not None:
            self.cache.disk.clear()
        return True, {}

    def _load_lora(self, data: dict) -> tuple[bool, dict]:
        lora = self.runner.lora
        if lora is None:
            return False, {"message": "LoRA is off: start with --enable-lora or --lora-paths"}
        try:
            lora.register(data.get("lora_name"), data.get("lora_path"), self._adapters_in_use())
        except ValueError as e:
            return False, {"message": str(e)}
        return True, {"lora_adapters": lora.paths}

    def _unload_lora(self, data: dict) -> tuple[bool, dict]:
        lora = self.runner.lora
        if lora is None:
            return False, {"message": "LoRA is off: start with --enable-lora or --lora-paths"}
        try:
            lora.unregister(data.get("lora_name"))
        except ValueError as e:
            return False, {"message": str(e)}
        return True, {"lora_adapters": lora.paths}

    def _adapters_in_use(self) -> set[str]:
        return {r.lora.key for r in self.running if r.lora is not None}

    def _pin_prefix(self, data: dict) -> tuple[bool, dict]:
        if self.cache.disk is None:
            return False, {"message": "pinning needs --kv-disk-cache"}
        key = salted(data.get("input_ids", []), salt_offset(data.get("cache_salt")))
        return True, {"pinned_tokens": self.cache.disk.pin(key)}

    # -- one step ------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.grammars.pending)

    def step(self) -> list[TokenOut]:
        """Run one forward pass (if there is work) and return the messages it produced."""
        self.waiting.extend(self.grammars.ready(self.outbox))
        plan = self._schedule()
        if plan.chunks:
            batch, rows = build_batch(plan, self.cache)
            if self.runner.lora is not None:
                batch.lora_slots = self._lora_slots(plan)
            batch.keep_hidden = any(c.req.pooling is not None for c in plan.chunks)
            sampled = [info for info in rows if info.sample_row is not None]
            # NOTE: grammar masks are filled on a thread while the forward runs, one row per
            # generating request in _sample's order.
            generating = [info.req for info in _generating(sampled)]
            masks = self.grammars.start_bitmask(generating, self.runner.config.vocab_size)
            start = time.perf_counter()
            logits = self.runner.forward(batch)
            if self.cache.disk is not None:  # NOTE: whether a disk load beats recomputing
                self._time_prefill(plan.num_tokens, logits, start)
            if batch.hidden is not None:
                pool_chunks(plan.chunks, batch.hidden)
            self._postprocess(plan, rows, sampled, logits, masks)
        out, self.outbox = self.outbox, []
        return out

    def _lora_slots(self, plan: StepPlan) -> list[int] | None:
        """Each chunk's adapter slot (-1: the base model); None when no chunk has one."""
        lora = self.runner.lora
        slots = [-1 if c.req.lora is None else lora.slot_of(c.req.lora) for c in plan.chunks]
        return slots if any(s >= 0 for s in slots) else None

    def _time_prefill(self, tokens: int, logits: torch.Tensor, start: float) -> None:
        costs = self.cache.disk.costs
        if tokens >= costs.MIN_PREFILL_TOKENS:
            if logits.is_cuda:
                torch.cuda.synchronize(logits.device)  # NOTE: sampling waits for it anyway
            costs.prefilled(tokens, time.perf_counter() - start)

    def _schedule(self) -> StepPlan:
        plan = StepPlan()
        if self.args.schedule_policy == "priority":
            self._preempt_for_priority()
        while admission.plan_decodes(self.running, self.cache, plan):
            self._retract(self._victim(self.running))
        # NOTE: on CPU drafting waits for the compiled steps and stops if they failed: an eager
        # verify step rounds differently from a compiled decode step (and costs more)
        if self.spec is not None and plan.chunks and self.runner.cpu_compile_status in (
            "ready", "off",
        ):  # fmt: skip
            self.spec.draft(plan.chunks, self.cache, self.stop, self.runner.context_len)
        budget = Budget(
            self.args.max_prefill_tokens,
            self.args.chunked_prefill_size,
            self.args.max_running_requests,
        )
        # NOTE: ordering matches every waiting prompt against the tree; skip it when full.
        room = len(self.running) < self.args.max_running_requests
        candidates = self._resident(self.waiting) if self.runner.lora and room else self.waiting
        ordered = self.policy(candidates, self.cache) if candidates and room else []
        admission.plan_prefills(self.running, ordered, self.cache, budget, plan)
        for req in plan.admitted:
            self.waiting.remove(req)
            self.running.append(req)
            if req.retractions == 0:
                self.stats.prompt_tokens += len(req.input_ids)
        if not plan.chunks and len(self.running) > 1:
            self._retract(self._victim([r for r in self.running if r.is_prefilling]))
        return plan

    def _resident(self, waiting: list[Req]) -> list[Req]:
        """The waiting requests whose adapter is (made) resident: those of an adapter no slot
        can take while the running requests hold every slot wait; an adapter whose directory
        can no longer be read fails its requests."""
        in_use, ready = self._adapters_in_use(), []
        for req in list(waiting):
            try:
                if req.lora is None or self.runner.lora.ensure(req.lora, in_use):
                    ready.append(req)
                    in_use |= {req.lora.key} if req.lora else set()
            except ValueError as e:
                waiting.remove(req)
                self._finish_now(req, ErrorCode.INVALID_REQUEST, str(e))
        return ready

    def _preempt_for_priority(self) -> None:
        """vLLM's priority preemption: while every running place is taken and a request waits
        with a lower priority value than a running one, the running one with the highest value
        (the newest of those) goes back to the queue; what it computed stays cached."""
        while self.waiting and len(self.running) >= self.args.max_running_requests:
            best = min(self.waiting, key=lambda r: (r.priority, r.created))
            worst = max(self.running, key=lambda r: (r.priority, r.created))
            if best.priority >= worst.priority:
                return
            self._retract(worst)

    def _victim(self, candidates: list[Req]) -> Req:
        """The request with the least progress: fewest outputs, then the longest prompt."""
        return min(candidates, key=lambda r: (len(r.output_ids), -len(r.input_ids)))

    def _retract(self, req: Req) -> None:
        """Send a running request back to the queue; what it computed stays cached."""
        self.running.remove(req)
        self.cache.release(req)
        req.kv_len, req.retractions, req.pooled = 0, req.retractions + 1, None
        self.stats.retractions += 1
        self.waiting.append(req)

    # -- post-processing ----------------------------------------------------------------------

    def _postprocess(
        self,
        plan: StepPlan,
        rows: list[LogitRows],
        sampled: list[LogitRows],
        logits: torch.Tensor,
        masks: Future | None,
    ) -> None:
        record_prompt_logprobs(rows, logits, self.args.cached_top_logprobs)
        for chunk in plan.chunks:
            chunk.req.kv_len += chunk.num_tokens
        if sampled:
            self._sample(sampled, logits, masks)
        for chunk, info in zip(plan.chunks, rows):
            if chunk.draft:
                self._verify(chunk, logits[info.draft_rows])
        for chunk in plan.chunks:
            req = chunk.req
            if req.finished:
                self.running.remove(req)
                self.cache.release(req)
                self.stats.finished(req)
            elif chunk.num_tokens > 1:
                self.cache.cache_prefix(req)
        self.stats.step(plan.num_tokens, len(sampled))

    def _sample(self, sampled: list[LogitRows], logits: torch.Tensor, masks: Future | None) -> None:
        for info in sampled:
            if info.req.params.max_new_tokens == 0:  # prefill only: cache the prompt, finish
                info.req.finish = Finish.length_limit(0)
                self.outbox.append(token_out(info.req))
        generating = _generating(sampled)
        if not generating:
            return
        reqs = [info.req for info in generating]
        index = [info.sample_row for info in generating]
        rows = [
            SampleRow(r.params, r.input_ids, r.output_ids, self.stop.banned_ids(r),
                      r.logprob.token_ids if r.logprob else None, r)
            for r in reqs
        ]  # fmt: skip
        top_n = max((r.logprob.top_n for r in reqs if r.logprob), default=0)
        bitmask = None
        if masks is not None:
            start = time.perf_counter()
            bitmask = masks.result()
            self.stats.mask_wait_s += time.perf_counter() - start
        with_logprobs = any(r.logprob is not None for r in reqs)
        # NOTE: a decode step samples every row in order: no copy of its [B, V] logits (32 rows
        # of SmolLM2: ~1.3 ms a step). Sampling may change them in place, and the forward made
        # them in inference mode: it runs there too.
        with torch.inference_mode():
            if index != list(range(logits.shape[0])):
                logits = logits[torch.tensor(index)]
            result = sample(logits, rows, bitmask, top_n, with_logprobs)
        now = time.monotonic()
        for i, req in enumerate(reqs):
            if result.errors and i in result.errors:
                req.finish = Finish.abort(ErrorCode.INVALID_REQUEST, result.errors[i])
                self.outbox.append(token_out(req))
                continue
            token = result.token_ids[i]
            req.first_token_time = req.first_token_time or now
            new_ids = self.grammars.advance(req, token)
            req.output_ids.extend(new_ids)
            req.finish = self.stop.check(req, new_ids[-1])
            if req.logprob is not None:
                self._record_logprobs(req, result, i, len(new_ids))
            if req.stream or req.finish is not None:
                self.outbox.append(token_out(req))

    def _verify(self, chunk, logits: torch.Tensor) -> None:
        req = chunk.req
        req.first_token_time = req.first_token_time or time.monotonic()
        self.spec.verify(chunk, logits, self.stop, self.grammars.advance, self.cache)
        if req.stream or req.finish is not None:
            self.outbox.append(token_out(req))

    @staticmethod
    def _record_logprobs(req: Req, result, row: int, num_new: int) -> None:
        """Jump-forward tokens are forced: logprob 0 and no alternatives."""
        lp = req.logprob
        lp.output += [result.logprobs[row]] + [0.0] * (num_new - 1)
        if lp.top_n:
            lp.output_top += [result.top_logprobs[row][: lp.top_n]] + [[]] * (num_new - 1)
        if lp.token_ids:
            lp.output_ids += [result.id_logprobs[row]] + [[]] * (num_new - 1)

    # -- reporting ------------------------------------------------------------------------------

    def stats_dict(self) -> dict[str, Any]:
        c = self.cache
        total = c.allocator.size
        used = total - c.allocator.available - c.evictable
        return {
            "num_running": len(self.running),
            "num_waiting": len(self.waiting) + len(self.grammars.pending),
            "max_total_tokens": total,
            "free_tokens": c.allocator.available,
            "evictable_tokens": c.evictable,
            "protected_tokens": c.protected,
            "kv_usage": used / total,
            "cache_hit_rate": c.hit_rate,
            "hit_tokens": c.hit_tokens,
            "queried_tokens": c.queried_tokens,
            "prompt_logprob_hit_tokens": c.logprobs.reused_tokens if c.logprobs else 0,
            "prompt_logprob_top_n_misses": c.logprobs.top_n_misses if c.logprobs else 0,
            "kv_invariant_ok": self.idle_check_ok(),
            "cpu_compile": self.runner.cpu_compile_status,
            "cpu_graphs": graphs.describe() if (graphs := self.runner.cpu_graphs) else None,
            "lora": lora.describe() if (lora := self.runner.lora) else None,
            **self.stats.as_dict(),
            **(c.disk.stats() if c.disk is not None else {}),
            **(self.spec.stats.as_dict() if self.spec is not None else {}),
        }

    def tree_view(self, max_nodes: int) -> dict[str, Any]:
        """The radix tree's first ``max_nodes`` nodes (breadth first) and the pool's totals."""
        c = self.cache
        nodes, clock = c.tree.snapshot(max_nodes) if c.tree is not None else ([], 0)
        return {
            "nodes": [n._asdict() for n in nodes],
            "clock": clock,
            "total_tokens": c.allocator.size,
            "free_tokens": c.allocator.available,
            "evictable_tokens": c.evictable,
            "protected_tokens": c.protected,
            "cache_hit_rate": c.hit_rate,
        }

    def close(self) -> None:
        """Finish the disk tier's writes and close the event socket (on a graceful exit)."""
        if self.cache.disk is not None:
            self.cache.disk.store.close()
        if self.kv_events is not None:
            self.kv_events.close()

    def idle_check_ok(self) -> bool | None:
        if self.running:
            return None
        try:
            self.cache.check_idle()
        except RuntimeError:
            logger.exception("KV invariant broken")
            return False
        return True


# NOTE: the watchdog's ping is answered between steps, so it costs nothing
_CONTROLS: dict[str, Callable[[Scheduler, dict], tuple[bool, dict]]] = {
    "flush_cache": Scheduler._flush_memory,
    "flush_disk_cache": Scheduler._flush_disk,
    "pin_prefix": Scheduler._pin_prefix,
    "load_lora_adapter": Scheduler._load_lora,
    "unload_lora_adapter": Scheduler._unload_lora,
    "tree": lambda s, data: (True, s.tree_view(data.get("max_nodes", 200))),
    "stats": lambda s, _: (True, s.stats_dict()),
    "ping": lambda s, _: (True, {}),
}


def _generating(sampled: list[LogitRows]) -> list[LogitRows]:
    """The sampled rows whose requests generate (``max_new_tokens`` 0 only prefills)."""
    return [info for info in sampled if info.req.params.max_new_tokens > 0]
