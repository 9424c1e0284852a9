"""Owns the model, the KV memory and the attention backend; runs one forward per step."""

from __future__ import annotations

import logging
import time

import torch

from radixlm.runtime import threads
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.distributed.batch_sync import broadcast_batch, broadcast_stop
from radixlm.runtime.distributed.parallel import init_tp_group, resolve_device
from radixlm.runtime.distributed.placement import RankInfo
from radixlm.runtime.distributed.shard import local_heads, shard_model
from radixlm.runtime.executor import aot_graphs
from radixlm.runtime.executor.aot_graphs import AotGraphs
from radixlm.runtime.executor.attention.base import create_attention_backend
from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.loader.loader import load_model, resolve_dtype
from radixlm.runtime.lora.manager import LoraManager
from radixlm.runtime.mem_cache.memory_pool import KVPool, ReqToTokenPool
from radixlm.runtime.models.gguf_quant import Segment
from radixlm.runtime.models.layers import RotaryEmbedding
from radixlm.runtime.models.onednn import OneDnnWeight
from radixlm.runtime.models.quant import (
    MAX_INT4_ROWS,
    Int4DecodeLinear,
    apply_int4_decode,
    int4_available,
    weights_once_as_loaded,
)
from radixlm.runtime.models.quant_head import Int8DecodeHead, Int8Embedding

logger = logging.getLogger(__name__)

CPU_DEFAULT_MAX_TOKENS = 32768
CPU_KV_RAM_FRACTION = 0.2


class ModelRunner:
    """Owns one rank's model, KV pool and attention backend.

    ``rank`` places a tensor-parallel rank: its model is sharded and its KV pool holds only
    its KV heads; rank 0's ``forward`` first hands the batch to the other ranks. ``step_threads``
    (CPU, one rank) widens torch's thread pool for big steps."""

    def __init__(
        self,
        args: ServerArgs,
        rank: RankInfo | None = None,
        step_threads: threads.StepThreads | None = None,
    ) -> None:
        rank = rank or RankInfo()
        self.startup_s: dict[str, float] = {}  # seconds per start-up phase
        self._phase_start = time.perf_counter()
        self.device = resolve_device(args.device, rank.gpu_id)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # NOTE: Triton and new streams use the current one
        self.dtype = resolve_dtype(args.dtype, self.device)
        self.tp = init_tp_group(rank, self.device) if rank.tp_size > 1 else None
        cpu_alone = self.device.type == "cpu" and self.tp is None
        self.step_threads = step_threads if cpu_alone else None
        self._load(args)
        self.lora = self._install_lora(args)
        c = self.config
        num_heads, num_kv_heads = local_heads(c, rank.tp_size)
        self.max_total_tokens = self._kv_size(args, num_kv_heads)
        if self.tp is not None:
            self.max_total_tokens = self.tp.min_int(self.max_total_tokens)
        self.context_len = min(c.context_length, self.max_total_tokens)
        self.kv_pool = KVPool(
            self.max_total_tokens, c.num_layers, num_kv_heads, c.head_dim, self.dtype, self.device
        )
        self.req_pool = ReqToTokenPool(args.max_running_requests, self.context_len + 1, self.device)
        self._phase("kv_allocate")
        backend = args.attention_backend or ("triton" if self.device.type == "cuda" else "torch")
        self.attention_backend_name = backend
        self.backend = create_attention_backend(
            backend,
            kv_pool=self.kv_pool,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=c.head_dim,
            scale=c.attention_scale,
            windows=c.window_of,
            softcap=c.attn_softcap,
        )
        for module in self.model.modules():
            if isinstance(module, RotaryEmbedding):
                module.build(self.context_len + 1, self.dtype, self.device)
        self.graph_runner = self._capture_graphs(args)
        if self.graph_runner is not None:
            self._phase("cuda_graphs")
        self.cpu_graphs = self._compile_cpu_decode(args)
        logger.info("start-up: %s", ", ".join(f"{k} {v:.2f} s" for k, v in self.startup_s.items()))

    def _phase(self, name: str) -> None:
        now = time.perf_counter()
        self.startup_s[name] = round(now - self._phase_start, 3)
        self._phase_start = now

    def memory_bytes(self) -> dict[str, int]:
        """Bytes per part: weights (GGUF blocks included), their quantized decode copies, the
        KV pool, the request table, and other buffers (rotary tables)."""
        seen: set[int] = set()

        def size(tensors) -> int:
            total = 0
            for t in tensors:
                if t.untyped_storage().data_ptr() not in seen:  # NOTE: tied weights count once
                    seen.add(t.untyped_storage().data_ptr())
                    total += t.untyped_storage().nbytes()
            return total

        copies = (Int4DecodeLinear, Int8DecodeHead, Int8Embedding)
        quant = [b for m in self.model.modules() if isinstance(m, copies)
                 for b in m.buffers(recurse=False)]  # fmt: skip
        # NOTE: the bf16 weights in oneDNN's layout (projections, head) are not parameters
        dense = sum(m.dense_bytes for m in self.model.modules() if isinstance(m, OneDnnWeight))
        blocks = [m.data for m in self.model.modules() if isinstance(m, Segment)]
        return {
            "weights": size(self.model.parameters()) + size(blocks) + dense,
            "quantized_copies": size(quant),
            "kv_pool": size(self.kv_pool.k + self.kv_pool.v),
            "request_table": size([self.req_pool.table]),
            "other_buffers": size(self.model.buffers()),
        }

    def _load(self, args: ServerArgs) -> None:
        fits = (self.device.type == "cpu" and self.dtype == torch.bfloat16 and self.tp is None
                and int4_available())  # fmt: skip
        for asked, name in ((args.quantization == "int4", "quantization='int4'"),
                            (args.low_memory, "low_memory=True")):  # fmt: skip
            if asked and not fits:
                raise ValueError(
                    f"{name} runs on CPU in bfloat16 without tensor parallelism "
                    f"(device {self.device.type}, dtype {self.dtype}, tp_size {args.tp_size})"
                )
        # NOTE: weights held once are converted as each one loads (weights_once_as_loaded)
        loaded = load_model(
            args, torch.device("cpu") if self.tp else self.device, self.dtype,
            on_loaded=weights_once_as_loaded if args.low_memory else None,
        )  # fmt: skip
        self.model, self.config, self.tokenizer = loaded.model, loaded.config, loaded.tokenizer
        self.model_path = loaded.model_path
        if self.tp is not None:
            self.model = shard_model(self.model, self.tp).to(self.device)
        self._phase("load")
        self.int4_decode = fits and args.quantization != "none" and (
            args.quantization == "int4" or args.low_memory or loaded.four_bit_checkpoint
        )
        if self.int4_decode:
            count = apply_int4_decode(self.model, weights_once=args.low_memory)
            if args.low_memory:
                logger.info("low_memory: weights held once, int4 in %d layers, int8 head and "
                            "embedding", count)  # fmt: skip
            else:
                logger.info("int4 weight copies for decode steps of <= %d tokens: %d layers",
                            MAX_INT4_ROWS, count)  # fmt: skip
            self._phase("quantize")

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits ``[len(batch.logits_indices), vocab]`` in float32."""
        if self.tp is not None and self.tp.is_driver:
            broadcast_batch(self.tp, batch)
        # NOTE: a step runs a graph compiled for its thread count, or eagerly (32 requests:
        # 45-48 ms compiled for 2 threads on 2, 62-70 eager on 2, 80-84 compiled for 1 on 1)
        steps = self.step_threads
        threads_now = None
        if steps is not None:
            threads_now = steps.for_step(len(batch.input_ids), len(batch.extend_lens_list))
        if batch.lora_slots is not None:  # NOTE: the compiled steps know the base model only
            self.backend.prepare(batch)
            with self.lora.activate(batch):
                return self.model(batch, self.backend)
        if batch.keep_hidden:  # NOTE: the graphs return logits only
            self.backend.prepare(batch)
            return self.model(batch, self.backend)
        if self.graph_runner is not None and self.graph_runner.can_run(batch):
            return self.graph_runner.forward(batch)
        if self.cpu_graphs is not None and self.cpu_graphs.can_run(batch, threads_now):
            return self.cpu_graphs.forward(batch, threads_now)
        self.backend.prepare(batch)
        return self.model(batch, self.backend)

    def _install_lora(self, args: ServerArgs) -> LoraManager | None:
        """The LoRA hooks and stacks, with ``lora_paths``' adapters registered (a bad one
        stops the start with its ValueError)."""
        if not args.lora_enabled:
            return None
        lora = LoraManager(self.model, args.max_loras, args.max_lora_rank, self.dtype, self.device)
        for name, path in args.lora_adapters.items():
            lora.register(name, path)
        self._phase("lora")
        return lora

    def _capture_graphs(self, args: ServerArgs) -> CudaGraphRunner | None:
        """CUDA graphs for decode batches, on CUDA with a backend that supports them."""
        if args.disable_cuda_graph or self.device.type != "cuda":
            return None
        if self.tp is not None:
            # NOTE: collectives inside captured graphs have never run here (no multi-GPU machine).
            logger.info("tensor parallel: decode runs without CUDA graphs")
            return None
        if not self.backend.supports_cuda_graph:
            logger.info("attention backend %s: no CUDA graphs", self.attention_backend_name)
            return None
        start = time.perf_counter()
        runner = CudaGraphRunner(
            self.model, self.backend, self.req_pool.table,
            max_bs=min(args.cuda_graph_max_bs, args.max_running_requests),
            max_seq_len=self.context_len,
        )  # fmt: skip
        logger.info(
            "captured %d decode CUDA graphs (batch 1..%d) in %.1f s",
            len(runner.graphs), runner.max_bs, time.perf_counter() - start,
        )  # fmt: skip
        return runner

    def _compile_cpu_decode(self, args: ServerArgs) -> AotGraphs | None:
        """Compiled decode steps on CPU (aot_graphs: built by a child process, loaded in the
        background once ``start`` is called; torch's compiler never loads here)."""
        if args.disable_cpu_compile or self.device.type != "cpu" or self.tp is not None:
            return None
        if self.attention_backend_name != "torch" or not aot_graphs.available():
            return None
        if not getattr(self.model, "aot_ready", False):
            logger.info("%s runs its CPU steps eagerly (the compiled steps know the plain "
                        "Llama/Qwen decoder with float weights only)",
                        self.config.architecture)  # fmt: skip
            return None
        # NOTE: the compile loads what this process loaded, with the same rotary table
        args = args.replace(model_path=self.model_path)
        steps = self.step_threads
        small, big = (steps.small, steps.big) if steps else (torch.get_num_threads(), None)
        return AotGraphs(args, self.model, self.kv_pool, self.backend.scale, small, big,
                         self.context_len)  # fmt: skip

    @property
    def cpu_compile_status(self) -> str:
        return "off" if self.cpu_graphs is None else self.cpu_graphs.status

    def close(self) -> None:
        """Release the other ranks (from rank 0) and leave the process group."""
        if self.tp is not None:
            if self.tp.is_driver:
                broadcast_stop(self.tp)
            self.tp.destroy()

    def _kv_size(self, args: ServerArgs, num_kv_heads: int) -> int:
        if args.max_total_tokens:
            return args.max_total_tokens
        c = self.config
        per_token = KVPool.bytes_per_token(c.num_layers, num_kv_heads, c.head_dim, self.dtype)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            total = torch.cuda.get_device_properties(self.device).total_memory
            budget = free - total * (1 - args.mem_fraction_static)
            return max(int(budget // per_token), 1024)
        return min(int(_available_ram() * CPU_KV_RAM_FRACTION // per_token), CPU_DEFAULT_MAX_TOKENS)


def _available_ram() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30
