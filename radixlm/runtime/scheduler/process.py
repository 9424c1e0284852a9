"""The scheduler process: receive requests, step the model, send token ids on."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback

import zmq

from radixlm.runtime import ipc, threads
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.distributed.placement import RankInfo
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.loader.gguf_loader import release_gguf
from radixlm.runtime.messages import Batch
from radixlm.runtime.models.gguf_quant import bytes_by_type
from radixlm.runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


def run_scheduler_process(
    args: ServerArgs,
    ports: ipc.PortArgs,
    ready_pipe,
    rank: RankInfo | None = None,
    step_threads: threads.StepThreads | None = None,
) -> None:
    """Entry point of the scheduler process (tensor-parallel rank 0). Reports
    ``{"ok", ...info}`` on ``ready_pipe``; ``step_threads`` sizes torch's pool per step."""
    logging.basicConfig(
        level=args.log_level.upper(), format="[scheduler] %(levelname)s %(message)s"
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    try:
        runner = ModelRunner(args, rank, step_threads)
        logger.info(threads.describe(runner.step_threads))  # NOTE: None on GPUs and TP ranks
        scheduler = Scheduler(args, runner)
        release_gguf()
        ctx = zmq.Context()
        inbox = ipc.pull(ctx, ports.scheduler)
        outbox = ipc.push(ctx, ports.detokenizer)
    except Exception as e:  # noqa: BLE001  (reported to the parent, which raises it)
        ready_pipe.send(
            {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        )
        return
    graphs = scheduler.runner.cpu_graphs
    # NOTE: graphs on disk load before ready (well under a second): a restart serves its first
    # request compiled; a build (minutes) happens after ready unless asked to wait for it
    if graphs is not None and (args.wait_cpu_graphs or graphs.on_disk()):
        graphs.wait()
    ready_pipe.send({"ok": True, **model_info(scheduler)})
    if graphs is not None:
        graphs.start()  # NOTE: after ready: start-up does not share the CPU
    # NOTE: SIGTERM (the launcher's shutdown) ends the loop cleanly: the disk tier's queued
    # writes finish before the process exits
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        _loop(scheduler, inbox, outbox, args, parent)
    finally:
        scheduler.close()
        scheduler.runner.close()
    ports.cleanup()  # NOTE: the parent is gone (maybe killed): nobody else removes the ipc dir


def model_info(scheduler: Scheduler) -> dict:
    r = scheduler.runner
    return {
        "max_total_tokens": r.max_total_tokens,
        "context_len": r.context_len,
        "vocab_size": r.config.vocab_size,
        "hidden_size": r.config.hidden_size,  # NOTE: the size of an embedding
        "eos_token_ids": list(r.config.eos_token_ids),
        "model_path": r.model_path,
        "dtype": str(r.dtype).removeprefix("torch."),
        "device": str(r.device),
        "attention_backend": r.attention_backend_name,
        "architecture": r.config.architecture,
        "startup_s": r.startup_s,
        "memory_bytes": r.memory_bytes(),
        "weight_bytes_by_type": bytes_by_type(r.model),
        "big_step_threads": r.step_threads.big if r.step_threads else None,
        "cpu_compile": r.cpu_compile_status,
        "lora_adapters": r.lora.paths if r.lora is not None else None,
    }


def _loop(scheduler: Scheduler, inbox, outbox, args: ServerArgs, parent: int) -> None:
    last_log, was_busy = time.monotonic(), False
    while os.getppid() == parent:
        msgs = ipc.recv_all(inbox, 0 if scheduler.has_work else 200)
        replies = [r for r in (scheduler.handle(m) for m in msgs) if r is not None]
        outs = scheduler.step() if scheduler.has_work or scheduler.outbox else []
        if scheduler.kv_events is not None:
            scheduler.kv_events.flush()
        if outs or replies:
            ipc.send(outbox, Batch(items=[*outs, *replies]))
        if was_busy and not scheduler.has_work:
            scheduler.idle_check_ok()
        was_busy = scheduler.has_work
        if time.monotonic() - last_log > args.stats_interval and scheduler.has_work:
            last_log = time.monotonic()
            s = scheduler.stats_dict()
            logger.info(
                "running %d, waiting %d, kv usage %.1f%%, hit rate %.1f%%, gen %.1f tok/s",
                s["num_running"],
                s["num_waiting"],
                100 * s["kv_usage"],
                100 * s["cache_hit_rate"],
                s["gen_throughput"],
            )
