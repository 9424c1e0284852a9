"""Owns the model, the KV memory and the attention backend; runs one forward per step."""

from __future__ import annotations

import logging

import torch

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.executor.attention.base import create_attention_backend
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.loader.loader import load_model, resolve_dtype
from radixlm.runtime.mem_cache.memory_pool import KVPool, ReqToTokenPool

logger = logging.getLogger(__name__)

CPU_DEFAULT_MAX_TOKENS = 32768
CPU_KV_RAM_FRACTION = 0.2


class ModelRunner:
    def __init__(self, args: ServerArgs) -> None:
        self.device = _resolve_device(args.device)
        self.dtype = resolve_dtype(args.dtype, self.device)
        loaded = load_model(args, self.device, self.dtype)
        self.model, self.config, self.tokenizer = loaded.model, loaded.config, loaded.tokenizer
        self.model_path = loaded.model_path
        c = self.config
        self.max_total_tokens = self._kv_size(args)
        self.context_len = min(c.context_length, self.max_total_tokens)
        self.kv_pool = KVPool(
            self.max_total_tokens, c.num_layers, c.num_kv_heads, c.head_dim, self.dtype, self.device
        )
        self.req_pool = ReqToTokenPool(args.max_running_requests, self.context_len + 1, self.device)
        backend = args.attention_backend or ("triton" if self.device.type == "cuda" else "torch")
        self.attention_backend_name = backend
        self.backend = create_attention_backend(
            backend,
            kv_pool=self.kv_pool,
            num_heads=c.num_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
        )

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits ``[len(batch.logits_indices), vocab]`` in float32."""
        self.backend.prepare(batch)
        return self.model(batch, self.backend)

    def _kv_size(self, args: ServerArgs) -> int:
        if args.max_total_tokens:
            return args.max_total_tokens
        c = self.config
        per_token = KVPool.bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim, self.dtype)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            total = torch.cuda.get_device_properties(self.device).total_memory
            budget = free - total * (1 - args.mem_fraction_static)
            return max(int(budget // per_token), 1024)
        return min(int(_available_ram() * CPU_KV_RAM_FRACTION // per_token), CPU_DEFAULT_MAX_TOKENS)


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _available_ram() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30
