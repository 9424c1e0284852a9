"""A tensor-parallel rank > 0: runs every batch rank 0 broadcasts and drops the logits.

It holds a shard of the model and of the KV pool (and with ``--kv-disk-cache`` a disk tier of
its shard), but no scheduler, radix tree or sockets: rank 0 decides everything and the slot
layout of every rank's pool follows its decisions.
"""

from __future__ import annotations

import logging
import signal
import traceback

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.distributed import disk_sync
from radixlm.runtime.distributed.batch_sync import DiskOp, receive_batch
from radixlm.runtime.distributed.placement import RankInfo
from radixlm.runtime.executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def run_tp_worker_process(args: ServerArgs, rank: RankInfo, ready_pipe) -> None:
    """Entry point of a rank > 0 process. Reports ``{"ok", ...}`` on ``ready_pipe``."""
    logging.basicConfig(
        level=args.log_level.upper(), format=f"[tp {rank.tp_rank}] %(levelname)s %(message)s"
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        runner = ModelRunner(args, rank)
        disk = None
        if args.kv_disk_cache is not None:
            from radixlm.runtime.mem_cache.disk_tier import DiskTier

            disk = DiskTier.open(args, runner.model_path, runner.kv_pool, rank.tp_rank)
    except Exception as e:  # noqa: BLE001  (reported to the parent, which raises it)
        ready_pipe.send(
            {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        )
        return
    ready_pipe.send({"ok": True})
    serve(runner, disk)


def serve(runner: ModelRunner, disk=None) -> None:
    """Run rank 0's batches and disk operations until it says stop or goes away."""
    try:
        while (msg := receive_batch(runner.tp, runner.req_pool.table)) is not None:
            if isinstance(msg, DiskOp):
                disk_sync.apply(disk, msg, runner.tp)
            else:
                runner.forward(msg)
    except RuntimeError as e:
        logger.warning("rank 0 went away (%s); leaving", e)
        return
    finally:
        if disk is not None:
            disk.store.close()  # NOTE: the queued writes land
    runner.close()
